"""Name-server write protection (issue 14, item 9) on real processes: `tidemq namesrv --acl-file`
refuses anonymous, badly signed and non-admin REGISTER_BROKER / UNREGISTER_BROKER /
WIPE_WRITE_PERM_OF_BROKER / DELETE_TOPIC_IN_NAMESRV (the route stays as the real broker
registered it), a broker with --namesrv-access-key/--namesrv-secret-key registers, `tidemq admin`
signs its name-server writes, and reads stay open to clients without credentials.

Before the fix every anonymous write here was answered SUCCESS and changed the route."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
import zlib
from pathlib import Path

import pytest

from tests.procs import ServerProcess, free_port, tidemq_cmd
from tests.support.waiting import wait_until
from tidemq.namesrv.bodies import encode_register_body
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.acl import AclSigner

ADMIN = ("clusterKey01", "cluster-secret-0001")
READER = ("readerKey01", "reader-secret-0002")
ACL = f"""accounts:
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
  - accessKey: {READER[0]}
    secretKey: {READER[1]}
    defaultTopicPerm: PUB|SUB
"""
CLUSTER = "DefaultCluster"
BROKER = "broker-a"


class Procs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ns_port, self.ns_metrics = free_port(), free_port()
        self.broker_port, self.broker_metrics = free_port(), free_port()
        self.acl = root / "plain_acl.yml"
        self.acl.write_text(ACL)
        os.chmod(self.acl, 0o600)
        self.namesrv = ServerProcess(
            tidemq_cmd("namesrv", "--listen", f"127.0.0.1:{self.ns_port}",
                       "--metrics-listen", f"127.0.0.1:{self.ns_metrics}", "--acl-file", str(self.acl)),
            root / "namesrv.log", f"http://127.0.0.1:{self.ns_metrics}/readyz")
        self.broker: ServerProcess | None = None

    @property
    def ns(self) -> str:
        return f"127.0.0.1:{self.ns_port}"

    @property
    def broker_addr(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    def start_broker(self, monkeypatch: pytest.MonkeyPatch, creds: tuple[str, str] | None,
                     wait: str = "readyz") -> ServerProcess:
        with monkeypatch.context() as m:  # the secret reaches the broker through its environment
            for var, value in zip(("TIDEMQ_BROKER_NAMESRV_ACCESS_KEY", "TIDEMQ_BROKER_NAMESRV_SECRET_KEY"),
                                  creds or (None, None)):
                if value is None:
                    m.delenv(var, raising=False)
                else:
                    m.setenv(var, value)
            self.broker = ServerProcess(
                tidemq_cmd("broker", "--namesrv", self.ns, "--listen", self.broker_addr,
                           "--store", str(self.root / "store"), "--cluster", CLUSTER, "--broker-name", BROKER,
                           "--segment-size", str(4 << 20), "--register-interval", "0.5",
                           "--metrics-listen", f"127.0.0.1:{self.broker_metrics}"),
                self.root / "broker.log", f"http://127.0.0.1:{self.broker_metrics}/{wait}").start()
        return self.broker

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()
        self.namesrv.stop()


async def call(addr: str, code: int, fields: dict | None = None, body: bytes | None = None,
               signer: AclSigner | None = None) -> RemotingCommand:
    client = RemotingClient(rpc_hook=signer)
    try:
        return await client.invoke(addr, RemotingCommand.request(code, fields, body), 5.0)
    finally:
        await client.close()


async def route(p: Procs, topic: str) -> dict | None:
    resp = await call(p.ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})  # no credentials
    if resp.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return json.loads(resp.body_bytes())


def admin(p: Procs, *args: str, creds: tuple[str, str] | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TIDEMQ_ACCESS_KEY", "TIDEMQ_SECRET_KEY")}
    if creds:
        env["TIDEMQ_ACCESS_KEY"], env["TIDEMQ_SECRET_KEY"] = creds
    return subprocess.run(tidemq_cmd("admin", args[0], "-n", p.ns, *args[1:]), capture_output=True,
                          timeout=60, env=env, text=True)


@pytest.fixture(scope="module")
def procs(tmp_path_factory):
    p = Procs(tmp_path_factory.mktemp("nsacl"))
    p.namesrv.start()
    mp = pytest.MonkeyPatch()
    try:
        p.start_broker(mp, ADMIN)
    except Exception:  # noqa: BLE001 (whatever failed, stop what started, then say why with the log)
        p.stop()
        raise RuntimeError(f"cluster did not start:\n{p.namesrv.log()[-3000:]}")
    yield p
    p.stop()
    mp.undo()


async def make_topic(p: Procs) -> tuple[str, dict]:
    """A new topic, created through the CLI without credentials, and its route."""
    topic = f"acl_{uuid.uuid4().hex[:8]}"
    r = admin(p, "updateTopic", "-c", CLUSTER, "-t", topic, "-r", "4", "-w", "4", creds=None)
    assert r.returncode == 0, r.stderr  # the broker itself runs without ACL
    return topic, await wait_until(lambda: route(p, topic), f"the route of {topic}", timeout=20, interval=0.1)


def refused(resp: RemotingCommand, reason: str) -> None:
    assert resp.code == ResponseCode.SYSTEM_ERROR, (resp.code, resp.remark)
    assert resp.remark.startswith("AclException: ") and reason in resp.remark, resp.remark


async def test_signed_broker_registers_and_reads_stay_open(procs: Procs) -> None:
    topic, r = await make_topic(procs)
    assert r["brokerDatas"][0]["brokerAddrs"] == {"0": procs.broker_addr}
    info = await call(procs.ns, RequestCode.GET_BROKER_CLUSTER_INFO)
    assert info.code == ResponseCode.SUCCESS and BROKER in info.body_bytes().decode()
    topics = await call(procs.ns, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    assert topics.code == ResponseCode.SUCCESS and topic in topics.body_bytes().decode()
    assert (await call(procs.ns, RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": CLUSTER})).code == ResponseCode.SUCCESS


def hijack_fields(addr: str = "10.66.66.66:10911") -> dict:
    return {"brokerName": BROKER, "brokerAddr": addr, "clusterName": CLUSTER,
            "haServerAddr": "10.66.66.66:10912", "brokerId": 0, "compressed": "false"}


@pytest.mark.parametrize("signer, reason", [
    (None, "No accessKey is configured"),
    (AclSigner(ADMIN[0], "not-the-secret-key"), f"Check signature failed for accessKey={ADMIN[0]}"),
    (AclSigner("strangerKey1", "stranger-secret"), "No acl config for strangerKey1"),
    (AclSigner(*READER), f"but accessKey={READER[0]} is not"),
], ids=["anonymous", "bad-signature", "unknown-account", "not-admin"])
async def test_unauthorised_writes_are_refused_and_the_route_is_unchanged(procs: Procs, signer, reason) -> None:
    topic, before = await make_topic(procs)
    # Re-point the topic at another address with a forged, newer data version.
    body = encode_register_body({topic: {"readQueueNums": 1, "writeQueueNums": 1, "perm": 6}},
                                {"counter": 10**9, "timestamp": int(time.time() * 1000)})
    fields = dict(hijack_fields(), bodyCrc32=zlib.crc32(body) & 0x7FFFFFFF)
    refused(await call(procs.ns, RequestCode.REGISTER_BROKER, fields, body, signer), reason)
    unreg = {k: v for k, v in hijack_fields(procs.broker_addr).items()
             if k in ("brokerName", "brokerAddr", "clusterName", "brokerId")}
    refused(await call(procs.ns, RequestCode.UNREGISTER_BROKER, unreg, None, signer), reason)
    refused(await call(procs.ns, RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": BROKER}, None, signer), reason)
    refused(await call(procs.ns, RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": BROKER}, None, signer), reason)
    refused(await call(procs.ns, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic}, None, signer), reason)
    refused(await call(procs.ns, RequestCode.QUERY_DATA_VERSION, {"brokerAddr": procs.broker_addr,
                                                            "brokerName": BROKER, "clusterName": CLUSTER,
                                                            "brokerId": 0}, b"{}", signer), reason)
    refused(await call(procs.ns, 100, {"namespace": "ORDER_TOPIC_CONFIG", "key": topic, "value": "x:1"}, None, signer),
            reason)  # PUT_KV_CONFIG
    refused(await call(procs.ns, 102, {"namespace": "ORDER_TOPIC_CONFIG", "key": topic}, None, signer), reason)
    assert await route(procs, topic) == before
    cluster = json.loads((await call(procs.ns, RequestCode.GET_BROKER_CLUSTER_INFO)).body_bytes())
    assert cluster["brokerAddrTable"][BROKER]["brokerAddrs"] == {"0": procs.broker_addr}


async def test_admin_account_may_write(procs: Procs) -> None:
    topic, before = await make_topic(procs)
    signer = AclSigner(*ADMIN)
    resp = await call(procs.ns, RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": BROKER}, None, signer)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert (await route(procs, topic))["queueDatas"][0]["perm"] == 4
    resp = await call(procs.ns, RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": BROKER}, None, signer)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert await route(procs, topic) == before


async def test_admin_cli_signs_its_name_server_writes(procs: Procs) -> None:
    topic, _ = await make_topic(procs)
    r = admin(procs, "deleteTopic", "-c", CLUSTER, "-t", topic, creds=None)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "AclException" in r.stderr and "No accessKey is configured" in r.stderr, r.stderr
    r = admin(procs, "deleteTopic", "-c", CLUSTER, "-t", topic, creds=ADMIN)
    assert r.returncode == 0, r.stderr
    assert await route(procs, topic) is None


async def test_admin_signs_name_server_writes_with_its_own_account(procs: Procs) -> None:
    """The operator's case: broker calls with one account (none here), name-server writes with the
    cluster's key (Admin(namesrv_credentials=...))."""
    from tidemq.client.admin import Admin  # noqa: PLC0415

    topic, _ = await make_topic(procs)

    async def delete(creds) -> None:
        async with Admin(procs.ns, namesrv_credentials=creds) as a:
            await a.delete_topic(topic, CLUSTER)

    with pytest.raises(Exception, match="Check signature failed"):
        await delete((ADMIN[0], "wrong-secret-key"))
    await delete(ADMIN)
    assert await route(procs, topic) is None


async def test_unsigned_broker_is_refused_and_says_so(procs: Procs, tmp_path, monkeypatch) -> None:
    other = Procs.__new__(Procs)
    other.root, other.ns_port = tmp_path, procs.ns_port
    other.broker_port, other.broker_metrics = free_port(), free_port()
    broker = other.start_broker(monkeypatch, None, wait="healthz")  # refused: alive, never ready
    try:
        await wait_until(lambda: "refused registration" in broker.log() and "AclException" in broker.log(),
                         "the refusal in the broker log", timeout=20, interval=0.1)
        with pytest.raises(urllib.error.HTTPError) as not_ready:
            urllib.request.urlopen(f"http://127.0.0.1:{other.broker_metrics}/readyz", timeout=5)
        assert not_ready.value.code == 503
        cluster = json.loads((await call(procs.ns, RequestCode.GET_BROKER_CLUSTER_INFO)).body_bytes())
        assert other.broker_addr not in json.dumps(cluster)
    finally:
        broker.stop()
