"""The cost of reconciling many Topics grows linearly (issue 18, item 12).

N Topics stored in kmock's emulator are reconciled against a real name server and broker by the
parts the operator wires together in ``register``: a :class:`~tidemq.operator.serial.Serializer`
reading each Topic back from the emulator, :func:`~tidemq.operator.handlers.topic_pass` and one
:class:`~tidemq.operator.adminpool.AdminPool`, with kopf's part played here (run every object's
pass concurrently, write the status patch it returns). Counting proxies in front of the name
server and the broker (the broker advertises the proxy's address, so everything the operator
sends it goes through) count the requests by code, the connections and the bytes answered.

A first pass creates every topic; a second, one timer interval later, finds them all in place:
it must cost one table fetch per broker and one cluster-info request, whatever N, open no
connection and write no status. (Before: every Topic pass opened its own connections, asked for
the cluster info and fetched the broker's whole topic table, O(N^2) bytes per round, and wrote
its status.) The 1,000-Topic run prints its time and requests per pass and is in the slow set;
the default suite runs 100. (The emulator's own cost per request stays flat: tests/support/kube.py
keeps kmock's request log short.)
"""

from __future__ import annotations

import asyncio
import collections
import time
import uuid

import pytest

kopf = pytest.importorskip("kopf")
kubernetes = pytest.importorskip("kubernetes")

pytest.importorskip("kmock")

from tests.operator.test_operator_integration import build_emulator  # noqa: E402
from tests.procs import free_port  # noqa: E402
from tests.support.kube import ThreadedEmulator  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402
from tidemq.client.admin import Admin  # noqa: E402
from tidemq.operator import adminpool, handlers, serial  # noqa: E402
from tidemq.operator.metrics import OperatorMetrics  # noqa: E402
from tidemq.remoting import RequestCode  # noqa: E402
from tidemq.remoting.frame import iter_frames  # noqa: E402

NS = "default"
GROUP, VERSION = handlers.GROUP, handlers.VERSION
INTERVAL = 30.0
CONCURRENCY = 64  # passes in flight at once (kopf runs every object's handlers in its own task)
pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


class CountingProxy:
    """A TCP proxy that counts what clients send (requests by code) and what they get (bytes)."""

    def __init__(self, upstream: str) -> None:
        self.host, port = upstream.rsplit(":", 1)
        self.upstream_port = int(port)
        self.requests: collections.Counter[int] = collections.Counter()
        self.connections = 0
        self.bytes_down = 0
        self._server: asyncio.Server | None = None

    async def start(self, port: int) -> "CountingProxy":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def snapshot(self) -> tuple[collections.Counter[int], int, int]:
        return collections.Counter(self.requests), self.connections, self.bytes_down

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)

        async def requests() -> None:
            buffer = bytearray()
            while data := await reader.read(65536):
                buffer += data
                for cmd in iter_frames(buffer):
                    self.requests[cmd.code] += 1
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def answers() -> None:
            while data := await up_reader.read(65536):
                self.bytes_down += len(data)
                writer.write(data)
                await writer.drain()
            writer.close()

        try:
            await asyncio.gather(requests(), answers())
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # one side went away: the other is closed with it
        finally:
            writer.close()
            up_writer.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def emulator():
    emu = ThreadedEmulator(build_emulator, name="kmock-scale").start()
    yield emu
    emu.stop()


@pytest.fixture
def api(emulator, monkeypatch):
    cfg = kubernetes.client.Configuration()
    cfg.host = emulator.url
    cfg.connection_pool_maxsize = 16
    monkeypatch.setattr(kubernetes.client.Configuration, "_default", cfg)
    return kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(cfg))


def _delta(before: tuple, after: tuple) -> tuple[dict[str, int], int, int]:
    requests = {RequestCode(c).name if c in RequestCode._value2member_map_ else str(c): n
                for c, n in (after[0] - before[0]).items()}
    return requests, after[1] - before[1], after[2] - before[2]


async def reconcile_many(n: int, cluster_factory, api) -> None:
    broker_port = free_port()
    c = cluster_factory(extra_broker_args=["--advertise", f"127.0.0.1:{broker_port}"])
    broker = await CountingProxy(c.broker_addr).start(broker_port)
    namesrv_port = free_port()
    namesrv = await CountingProxy(c.namesrv_addr).start(namesrv_port)
    servers = [f"127.0.0.1:{namesrv_port}"]
    clock, metrics = Clock(), OperatorMetrics()
    pool = adminpool.AdminPool(clock=clock)
    try:
        async def registered() -> bool:
            async with Admin(servers) as admin:
                return bool((await admin.cluster_info()).all_master_addrs())
        await wait_until(registered, "the broker registered")

        prefix = "Scale_" + uuid.uuid4().hex[:6]
        started = time.monotonic()
        names = []
        for i in range(n):
            name = f"{prefix.lower().replace('_', '-')}-{i}"
            api.create_namespaced_custom_object(GROUP, VERSION, NS, "topics", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "Topic",
                "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1},
                "spec": {"clusterRef": {"name": "ext"}, "topicName": f"{prefix}_{i}",
                         "readQueueNums": 2, "writeQueueNums": 2}})
            names.append(name)
        print(f"\n{n} Topics stored in the emulator in {time.monotonic() - started:.1f} s")

        config = handlers.OperatorConfig(timer_interval=INTERVAL)
        serializer = serial.Serializer(serial.kube_reader(GROUP, VERSION))
        index = {(NS, "ext"): [{"spec": {"external": {"nameServers": servers}}, "status": {},
                                "metadata": {"name": "ext", "namespace": NS}}]}
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(name: str, timer: bool) -> bool:
            """One pass as kopf runs it: the body it has (here only the name and uid), the
            re-read under the lock, the pass, its status patch written. True: it wrote one."""
            body = {"metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1}}
            async with gate, serializer.current("topics", body, timer) as now:
                assert now is not None
                patch = kopf.Patch()
                await handlers.topic_pass(config, metrics, now, patch, index, timer, pool)
                if "status" in patch:
                    await asyncio.to_thread(api.patch_namespaced_custom_object_status, GROUP, VERSION, NS,
                                            "topics", name, {"status": dict(patch["status"])})
                    return True
                return False

        results = []
        for number, timer in ((1, False), (2, True)):
            before = broker.snapshot(), namesrv.snapshot()
            started = time.monotonic()
            writes = sum(await asyncio.gather(*(one(name, timer) for name in names)))
            took = time.monotonic() - started
            (b_req, b_conn, b_bytes), (n_req, n_conn, _) = (_delta(before[0], broker.snapshot()),
                                                            _delta(before[1], namesrv.snapshot()))
            print(f"pass {number}: {n} Topics in {took:.1f} s; broker: {sum(b_req.values())} requests "
                  f"{b_req}, {b_conn} connection(s), {b_bytes} bytes answered; name server: "
                  f"{sum(n_req.values())} requests {n_req}, {n_conn} connection(s); {writes} status writes")
            results.append((b_req, b_conn, b_bytes, n_req, n_conn, writes))
            clock.now += INTERVAL  # the next pass is the next timer round: the copies are stale

        (b1, bc1, bytes1, n1, nc1, w1), (b2, bc2, bytes2, n2, nc2, w2) = results
        # the first pass creates each topic once and reads the broker's table a few times at most
        assert b1.get("UPDATE_AND_CREATE_TOPIC") == n and sum(b1.values()) <= n + 10, b1
        assert sum(n1.values()) <= 10 and bc1 <= 2 and nc1 <= 2, (n1, bc1, nc1)
        assert bytes1 < 2_000 * n and w1 == n
        # the second round finds everything in place: a constant cost, whatever n
        assert b2 == {"GET_ALL_TOPIC_CONFIG": 1} and n2 == {"GET_BROKER_CLUSTER_INFO": 1}, (b2, n2)
        assert bc2 == nc2 == 0  # the pooled connections
        assert w2 == 0  # nothing changed, nothing written
        for name in names[:3] + names[-3:]:
            stored = api.get_namespaced_custom_object(GROUP, VERSION, NS, "topics", name)
            assert stored["status"]["writeQueueNums"] == 2, stored["status"]
            assert [x["status"] for x in stored["status"]["conditions"] if x["type"] == "Ready"] == ["True"]
    finally:
        await pool.close()
        await broker.close()
        await namesrv.close()


@pytest.mark.timeout(120)
async def test_a_hundred_topics_cost_a_constant_per_round_once_in_place(cluster_factory, api):
    await reconcile_many(100, cluster_factory, api)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_thousand_topics_cost_a_constant_per_round_once_in_place(cluster_factory, api):
    await reconcile_many(1000, cluster_factory, api)
