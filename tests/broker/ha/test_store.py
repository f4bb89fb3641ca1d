"""Behaviour of the coordination store, the same for every backend (parametrized by ``backend``).

The etcd backend runs against a real etcd on loopback; the Kubernetes backend against the kmock
emulator adapted in tests/broker/ha/kube.py (resourceVersion and 409 Conflict added there). Every
behaviour runs on both but endpoint failover, which is etcd's alone (the Kubernetes backend talks to
one API server address, whose Service balances).
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import aiohttp
import pytest

from tidemq.broker.ha.coordination import CoordinationError, CoordinationStore, GroupRecord, group_key
from tidemq.broker.ha.etcd import EtcdConfig, EtcdStore
from tidemq.broker.ha.kubernetes import KubernetesConfig, KubernetesLeaseStore
from tidemq.errors import ConfigError

from tests.procs import free_port
from tests.support.kube import ThreadedEmulator

from .conftest import Etcd
from .kube import build_emulator

Factory = Callable[[], CoordinationStore]


def record(epoch: int, master: int | None = 0) -> GroupRecord:
    return GroupRecord(epoch=epoch, master=master, in_sync=(0, 1, 2), min_in_sync=2,
                       master_log_end=epoch * 1000)


@pytest.fixture(scope="module")
def emulator() -> Iterator[ThreadedEmulator]:
    emu = ThreadedEmulator(build_emulator, name="kmock-leases").start()
    yield emu
    emu.stop()


def client(kind: str, where: str, timeout: float = 5.0) -> CoordinationStore:
    """A client of the ``kind`` backend at ``where`` (HOST:PORT list for etcd, URL for Kubernetes)."""
    if kind == "etcd":
        return EtcdStore(EtcdConfig.parse(f"etcd://{where}", timeout=timeout))
    return KubernetesLeaseStore(KubernetesConfig(where, "default", timeout=timeout))


@pytest.fixture(params=["etcd", "kubernetes"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Factory]:
    """Makes clients of one store (each call a new client, as another replica would have)."""
    made: list[CoordinationStore] = []
    where = request.getfixturevalue("etcd").endpoint if request.param == "etcd" else \
        request.getfixturevalue("emulator").url

    def make() -> CoordinationStore:
        made.append(client(request.param, where))
        return made[-1]
    yield make
    for store in made:
        await store.close()


@pytest.fixture
def key() -> str:
    return group_key("test", f"broker-{uuid.uuid4().hex[:8]}")


async def test_compare_and_swap_succeeds_only_at_the_revision_read(backend: Factory, key: str) -> None:
    store = backend()
    assert await store.get(key) is None
    first = await store.compare_and_swap(key, record(1), 0)
    assert first is not None and first.record == record(1)
    assert await store.compare_and_swap(key, record(9), 0) is None  # exists: no second create
    assert await store.get(key) == first
    assert await store.compare_and_swap(key, record(2), first.revision + 1) is None
    second = await store.compare_and_swap(key, record(2), first.revision)
    assert second is not None and second.revision > first.revision
    assert await store.compare_and_swap(key, record(3), first.revision) is None  # stale
    assert await store.get(key) == second


async def test_of_two_contenders_exactly_one_wins_each_revision(backend: Factory, key: str) -> None:
    a, b = backend(), backend()
    revision = 0
    for epoch in range(1, 6):
        current = await a.get(key)
        assert (current.revision if current else 0) == revision
        results = await asyncio.gather(a.compare_and_swap(key, record(epoch, master=0), revision),
                                       b.compare_and_swap(key, record(epoch, master=1), revision))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1, results
        assert await b.get(key) == winners[0]
        revision = winners[0].revision


async def wait_gone(store: CoordinationStore, key: str, within: float) -> float:
    started = time.monotonic()
    while await store.get(key) is not None:
        assert time.monotonic() - started < within, f"{key} still there after {within} s"
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def test_a_record_under_a_lease_disappears_after_the_ttl_without_keep_alive(
        backend: Factory, key: str) -> None:
    store, other = backend(), backend()
    lease = await store.grant(2)
    assert await store.compare_and_swap(key, record(1), 0, lease=lease) is not None
    assert await other.get(key) is not None
    await wait_gone(other, key, within=lease.ttl + 3)
    assert not await store.keep_alive(lease)
    with pytest.raises(CoordinationError, match="grant a new lease"):
        await store.compare_and_swap(key, record(2), 0, lease=lease)
    # Absent again: a new contender creates it at revision 0.
    assert await other.compare_and_swap(key, record(2), 0) is not None


async def test_a_record_under_a_kept_alive_lease_stays_until_revoked(backend: Factory, key: str) -> None:
    store, other = backend(), backend()
    lease = await store.grant(2)
    assert await store.compare_and_swap(key, record(1), 0, lease=lease) is not None
    deadline = time.monotonic() + 2 * lease.ttl + 1
    while time.monotonic() < deadline:
        assert await store.keep_alive(lease)
        assert await other.get(key) is not None
        await asyncio.sleep(lease.ttl / 4)
    await store.revoke(lease)
    await wait_gone(other, key, within=3)
    await store.revoke(lease)  # a gone lease is no error


async def test_watch_sees_a_change_made_by_another_client(backend: Factory, key: str) -> None:
    watcher, writer = backend(), backend()
    changes = watcher.watch(key)
    first = asyncio.ensure_future(anext(changes))
    await asyncio.sleep(0.5)  # the watch is open before the write
    written = await writer.compare_and_swap(key, record(1), 0)
    assert written is not None
    change = await asyncio.wait_for(first, 10)
    assert (change.record, change.revision) == (written.record, written.revision)
    second = await writer.compare_and_swap(key, record(2), written.revision)
    assert second is not None
    change = await asyncio.wait_for(anext(changes), 10)
    assert (change.record, change.revision) == (second.record, second.revision)
    await changes.aclose()


async def test_watch_from_a_revision_replays_what_came_after(backend: Factory, key: str) -> None:
    store = backend()
    one = await store.compare_and_swap(key, record(1), 0)
    assert one is not None
    two = await store.compare_and_swap(key, record(2), one.revision)
    assert two is not None
    changes = store.watch(key, after=one.revision)
    change = await asyncio.wait_for(anext(changes), 10)
    assert (change.record, change.revision) == (two.record, two.revision)
    await changes.aclose()


@pytest.mark.parametrize("kind", ["etcd", "kubernetes"])
async def test_an_unreachable_store_raises_within_its_timeout_instead_of_hanging(kind: str) -> None:
    silent = _silent_listener()
    try:
        where = f"127.0.0.1:{silent.getsockname()[1]},127.0.0.1:{_closed_port()}" if kind == "etcd" \
            else f"http://127.0.0.1:{silent.getsockname()[1]}"
        store = client(kind, where, timeout=1.5)
        started = time.monotonic()
        with pytest.raises(CoordinationError, match="did not answer .* within 1.5 s"):
            await store.get(group_key("test", "unreachable"))
        assert time.monotonic() - started < 3
        await store.close()
    finally:
        silent.close()


async def test_an_unreachable_endpoint_fails_over_to_the_next(etcd: Etcd, key: str) -> None:
    silent = _silent_listener()
    try:
        for dead in (f"127.0.0.1:{_closed_port()}", f"127.0.0.1:{silent.getsockname()[1]}"):
            store = EtcdStore(EtcdConfig.parse(f"etcd://{dead},{etcd.endpoint}", timeout=4))
            written = await store.compare_and_swap(key, record(1), 0) or await store.get(key)
            assert written is not None and written.record == record(1)
            started = time.monotonic()
            assert await store.get(key) == written  # the endpoint that answered is kept
            assert time.monotonic() - started < 1
            await store.close()
    finally:
        silent.close()


def _closed_port() -> int:
    """A port nothing listens on (connections to it are refused)."""
    return free_port()


def _silent_listener() -> socket.socket:
    """A socket that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


async def test_a_kubernetes_lease_runs_out_by_the_injected_clock(emulator: ThreadedEmulator,
                                                                  key: str) -> None:
    """Expiry of a Lease is read against the store's clock: here a fake one, moved by hand."""
    now = [time.time()]
    store = KubernetesLeaseStore(KubernetesConfig(emulator.url, "default"), clock=lambda: now[0])
    try:
        lease = await store.grant(10)
        written = await store.compare_and_swap(key, record(1), 0, lease=lease)
        assert written is not None
        now[0] += 9
        assert await store.keep_alive(lease)  # renewTime moves to now: ten more seconds
        now[0] += 9
        assert await store.get(key) is not None
        now[0] += 2
        assert await store.get(key) is None
        assert not await store.keep_alive(lease)
        # An expired record is absent: creating at revision 0 takes the Lease over.
        assert await store.compare_and_swap(key, record(2), 0) is not None
    finally:
        await store.close()


@pytest.mark.parametrize("url, why", [
    ("http://127.0.0.1:2379", "etcd://HOST:PORT"),
    ("etcd://127.0.0.1", "HOST:PORT"),
    ("etcd://127.0.0.1:2379,:2380", "HOST:PORT"),
    ("etcd://127.0.0.1:99999", "HOST:PORT"),
])
def test_an_etcd_url_that_is_not_host_port_pairs_is_refused(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        EtcdConfig.parse(url)


def test_etcd_urls_name_every_endpoint_in_order() -> None:
    assert EtcdConfig.parse("etcd://a:2379,[::1]:2380").endpoints == (("a", 2379), ("::1", 2380))


@pytest.mark.parametrize("kind", ["etcd", "kubernetes"])
async def test_a_watch_reopened_after_idling_misses_no_change(kind: str, request: pytest.FixtureRequest,
                                                             key: str) -> None:
    where = request.getfixturevalue("etcd").endpoint if kind == "etcd" else \
        request.getfixturevalue("emulator").url
    config = EtcdConfig.parse(f"etcd://{where}") if kind == "etcd" else \
        KubernetesConfig(where, "default")
    idle = dataclasses.replace(config, watch_idle=0.2)
    watcher = EtcdStore(idle) if isinstance(idle, EtcdConfig) else KubernetesLeaseStore(idle)
    writer = client(kind, where)
    try:
        changes = watcher.watch(key)
        first = asyncio.ensure_future(anext(changes))
        await asyncio.sleep(1)  # several idle reopens before the write
        written = await writer.compare_and_swap(key, record(1), 0)
        assert written is not None
        change = await asyncio.wait_for(first, 10)
        assert (change.record, change.revision) == (written.record, written.revision)
        await changes.aclose()
    finally:
        await watcher.close()
        await writer.close()


async def test_an_etcd_watch_from_a_compacted_revision_yields_the_current_record(
        etcd: Etcd, key: str) -> None:
    store = EtcdStore(EtcdConfig.parse(f"etcd://{etcd.endpoint}"))
    try:
        one = await store.compare_and_swap(key, record(1), 0)
        assert one is not None
        two = await store.compare_and_swap(key, record(2), one.revision)
        assert two is not None
        async with aiohttp.ClientSession() as http, http.post(
                f"http://{etcd.endpoint}/v3/kv/compaction",
                json={"revision": str(two.revision), "physical": True}) as resp:
            assert resp.status == 200, await resp.text()
        changes = store.watch(key, after=one.revision - 1)
        change = await asyncio.wait_for(anext(changes), 10)
        assert change.record == two.record and change.revision >= two.revision
        await changes.aclose()
    finally:
        await store.close()
