"""ACL on a real broker process, driven by TideMQ's own client (ClientConfig access/secret keys),
and UPDATE_BROKER_CONFIG's allow-list (S1, S2 and S5 of the reliability matrix)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
import uuid

import pytest

from tests.procs import Cluster, tidemq_cmd
from tests.support.routes import wait_for_route_sync
from tests.support.topics import create_topic
from tests.support.waiting import wait_until_sync
from tidemq.client import Producer
from tidemq.client.config import ClientConfig
from tidemq.client.sync import SyncAdmin, SyncProducer, SyncPullConsumer
from tidemq.errors import BrokerError, ClientError, TideMQError
from tidemq.message import Message
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.acl import AclSigner

ADMIN = ("adminKey01", "admin-secret-0001")
APP = ("appKey0001", "app-secret-0002")
PUB_ONLY = ("pubOnly001", "pub-secret-0003")
NEW = ("newKey0001", "new-secret-0004")
SECRETS = [ADMIN[1], APP[1], PUB_ONLY[1], NEW[1]]

ACL = f"""accounts:
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
  - accessKey: {APP[0]}
    secretKey: {APP[1]}
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - aclT=PUB|SUB
      - denyT=DENY
  - accessKey: {PUB_ONLY[0]}
    secretKey: {PUB_ONLY[1]}
    defaultGroupPerm: SUB
    topicPerms:
      - aclT=PUB
"""


def cfg(c: Cluster, creds: tuple[str, str] | None, **kw) -> ClientConfig:
    ak, sk = creds if creds else (None, None)
    return ClientConfig(name_servers=c.namesrv_addr, access_key=ak, secret_key=sk,
                        retry_times_when_send_failed=0, **kw)


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("acl")
    path = root / "plain_acl.yml"
    path.write_text(ACL)
    os.chmod(path, 0o600)
    c = Cluster(root, extra_broker_args=["--acl-file", str(path), "--acl-reload-interval", "0.2"])
    try:
        c.start()
    except Exception:  # noqa: BLE001 (whatever failed, stop what started, then say why with the log)
        c.stop()
        raise RuntimeError(f"ACL cluster did not start:\n{c.broker.log()[-3000:]}")
    with SyncAdmin(c.namesrv_addr, cfg(c, ADMIN)) as admin:
        for topic in ("aclT", "denyT"):
            admin.create_topic(topic, 2, 2, cluster=c.cluster_name)
        for topic in ("aclT", "denyT"):
            wait_for_route_sync(admin, topic, 2, timeout=15)
    yield c, path
    c.stop()


def send(c: Cluster, creds, topic: str, body: bytes = b"hello") -> None:
    with SyncProducer(f"pg_{uuid.uuid4().hex[:6]}", config=cfg(c, creds)) as p:
        p.send(Message(topic, body))


async def send_async(c: Cluster, creds, topic: str, body: bytes = b"hello") -> None:
    async with Producer(f"pg_{uuid.uuid4().hex[:6]}", config=cfg(c, creds)) as p:
        await p.send(Message(topic, body))


def refusal(fn) -> BrokerError:
    with pytest.raises(BrokerError) as info:
        fn()
    return info.value


async def refusal_async(coro) -> BrokerError:
    with pytest.raises(BrokerError) as info:
        await coro
    return info.value


def test_right_key_sends_and_pulls(acl_cluster):
    c, _ = acl_cluster
    body = uuid.uuid4().hex.encode()
    send(c, APP, "aclT", body)
    with SyncPullConsumer("appGroup", config=cfg(c, APP)) as pc:
        got = []
        for mq in pc.fetch_queues("aclT"):
            got += [m.body for m in pc.pull(mq, 0, 32).messages]
    assert body in got


@pytest.mark.parametrize("creds, remark", [
    ((APP[0], "wrong-secret-9"), f"AclException: Check signature failed for accessKey={APP[0]}"),
    (("unknownKey1", "whatever-secret"), "AclException: No acl config for unknownKey1"),
    (None, "AclException: No accessKey is configured"),
])
def test_wrong_or_missing_credentials_are_refused_like_rocketmq(acl_cluster, creds, remark):
    c, _ = acl_cluster
    err = refusal(lambda: send(c, creds, "aclT"))
    assert err.code == ResponseCode.SYSTEM_ERROR  # what RocketMQ 4.9.8 answers (AclException)
    assert remark in err.remark


def test_deny_topic_pub_only_pull_and_non_admin_refused(acl_cluster):
    c, _ = acl_cluster
    err = refusal(lambda: send(c, APP, "denyT"))
    assert err.code == ResponseCode.SYSTEM_ERROR and "No default permission for topic:denyT" in err.remark
    send(c, PUB_ONLY, "aclT")  # PUB is enough to send
    with SyncPullConsumer("pubGroup", config=cfg(c, PUB_ONLY)) as pc:
        mq = pc.fetch_queues("aclT")[0]
        err = refusal(lambda: pc.pull(mq, 0, 32))
    assert "No default permission for topic:aclT" in err.remark
    with SyncAdmin(c.namesrv_addr, cfg(c, APP)) as admin:
        with pytest.raises(TideMQError, match="Need admin permission for request code=17"):
            admin.create_topic("sneaky", 1, 1, cluster=c.cluster_name)


async def _invoke(addr: str, cmd: RemotingCommand, creds) -> RemotingCommand:
    client = RemotingClient(rpc_hook=AclSigner(*creds) if creds else None)
    try:
        return await client.invoke(addr, cmd, 5.0)
    finally:
        await client.close()


async def update_config(addr: str, body: str, creds=None) -> RemotingCommand:
    return await _invoke(addr, RemotingCommand.request(RequestCode.UPDATE_BROKER_CONFIG, body=body.encode()), creds)


async def test_update_broker_config_needs_admin_and_an_allowed_key(acl_cluster):
    c, _ = acl_cluster
    r = await update_config(c.broker_addr, "autoCreateTopicEnable=true\n", APP)
    assert r.code == ResponseCode.SYSTEM_ERROR and "Need admin permission for request code=25" in r.remark
    r = await update_config(c.broker_addr, "rocketmqHome=/tmp/x\n", ADMIN)
    assert r.code == ResponseCode.NO_PERMISSION and "'rocketmqHome'" in r.remark


def test_config_change_is_picked_up_within_5_s(acl_cluster):
    c, path = acl_cluster
    err = refusal(lambda: send(c, NEW, "aclT"))
    assert "No acl config for newKey0001" in err.remark
    text = ACL + f"  - accessKey: {NEW[0]}\n    secretKey: {NEW[1]}\n    defaultTopicPerm: PUB\n"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)

    def new_account_sends() -> bool:
        try:
            send(c, NEW, "aclT")
        except BrokerError:
            return False
        return True

    started = time.monotonic()
    wait_until_sync(new_account_sends, "the broker to accept the account added to its ACL file",
                    timeout=5, interval=0.1)
    print(f"ACL reload picked up after {time.monotonic() - started:.2f} s")
    # a broken file keeps the accounts that work
    path.write_text("accounts: [\n")
    wait_until_sync(lambda: "keeping the previous accounts" in c.broker.log(),
                    "the broker to log that a broken ACL file keeps the previous accounts", timeout=15,
                    interval=0.1)
    send(c, NEW, "aclT")  # the accounts that worked still work
    path.write_text(text)


def test_logs_name_the_access_key_never_a_secret(acl_cluster):
    c, path = acl_cluster
    refusal(lambda: send(c, (APP[0], "wrong-secret-9"), "aclT"))
    log = c.broker.log()
    assert f"accessKey={APP[0]}" in log
    for secret in SECRETS + ["wrong-secret-9"]:
        assert secret not in log
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0  # the test's ACL file stays private


def test_bad_acl_file_is_a_startup_error(tmp_path):
    bad = tmp_path / "plain_acl.yml"
    bad.write_text("accounts:\n  - accessKey: abc\n    secretKey: SEKRIT-value\n")
    c = Cluster(tmp_path, extra_broker_args=["--acl-file", str(bad)])
    c.namesrv.start()
    try:
        proc = c.broker
        proc.ready_url = None
        proc.start()
        assert proc.proc.wait(30) == 1
        out = proc.log()
        assert "accessKey must be a string of at least 7 characters" in out and "SEKRIT" not in out
        assert "Traceback" not in out
    finally:
        c.stop()


# UPDATE_BROKER_CONFIG without ACL, under a process-spawn audit hook (S2) ------------------------
AUDIT_WRAPPER = """
import os, runpy, sys
SPAWN = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "pty.spawn")
def hook(event, args):
    if event.startswith(SPAWN):
        os.write(2, f"AUDIT-SPAWN {event}\\n".encode())
sys.addaudithook(hook)
sys.argv = ["tidemq", *sys.argv[1:]]
runpy.run_module("tidemq.cli.main", run_name="__main__")
"""


@pytest.fixture(scope="module")
def audited_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("audited")
    wrapper = root / "audited_tidemq.py"
    wrapper.write_text(AUDIT_WRAPPER)
    c = Cluster(root)
    assert c.broker.args[:3] == [sys.executable, "-m", "tidemq.cli.main"]
    c.broker.args[:3] = [sys.executable, str(wrapper)]
    c.start()
    yield c
    c.stop()


HOSTILE_KEYS = ["rocketmqHome", "storePathRootDir", "storePathCommitLog", "filterServerNums",
                "namesrvAddr", "brokerConfigPath", "configStorePath", "kvConfigPath", "listenPort",
                "aclEnable", "aclFile", "exec", "__class__", "brokerPermission\u200b", ""]


@pytest.mark.parametrize("key", HOSTILE_KEYS)
async def test_only_allow_listed_keys_change(audited_cluster, key):
    c = audited_cluster
    r = await update_config(c.broker_addr, f"autoCreateTopicEnable=true\n{key}=sh -c 'touch /tmp/pwned'\n")
    assert r.code == ResponseCode.NO_PERMISSION, r.remark
    assert repr(key)[1:-1][:20] in r.remark
    get = await _invoke(c.broker_addr, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG), None)
    assert "autoCreateTopicEnable=false" in get.body_bytes().decode()  # nothing applied (atomic)


async def test_allowed_key_applies_and_no_process_is_spawned(audited_cluster):
    c = audited_cluster
    topic = await create_topic(c, f"wp_{uuid.uuid4().hex[:8]}", 1)
    await send_async(c, None, topic)
    r = await update_config(c.broker_addr, "brokerPermission=4\n")
    assert r.code == ResponseCode.SUCCESS, r.remark
    try:
        # the name server routes no producer here any more (the broker re-registered before it
        # answered), and a send that comes anyway (a route cached before) is refused by the broker
        with pytest.raises(ClientError, match="no writable queue"):
            await send_async(c, None, topic)
        raw = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
            "a": "pg", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0",
            "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0", "k": "false"}, body=b"x")
        err = await _invoke(c.broker_addr, raw, None)
        assert err.code == ResponseCode.NO_PERMISSION and "sending message is forbidden" in (err.remark or "")
    finally:
        assert (await update_config(c.broker_addr, "brokerPermission=6\n")).code == ResponseCode.SUCCESS
    await send_async(c, None, topic)
    bad = await update_config(c.broker_addr, "brokerPermission=7\n")
    assert bad.code == ResponseCode.SYSTEM_ERROR and "brokerPermission" in bad.remark
    fuzz = [b"", b"\xff\xfe", b"=\n=\n", b"#only a comment\n", b"a" * 70000 + b"=1", b"brokerPermission"]
    for body in fuzz:
        resp = await _invoke(c.broker_addr, RemotingCommand.request(RequestCode.UPDATE_BROKER_CONFIG, body=body), None)
        assert resp.code in (ResponseCode.SYSTEM_ERROR, ResponseCode.NO_PERMISSION), (body[:20], resp.code)
    assert "AUDIT-SPAWN" not in c.broker.log()
    assert c.broker.proc.poll() is None


async def test_namesrv_has_no_remote_config_update(audited_cluster):
    c = audited_cluster
    cmd = RemotingCommand.request(318, body=b"kvConfigPath=/tmp/x\n")  # UPDATE_NAMESRV_CONFIG
    r = await _invoke(c.namesrv_addr, cmd, None)
    assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


def test_cli_signs_with_credentials_from_the_environment(acl_cluster):
    c, _ = acl_cluster
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_")}
    cmd = tidemq_cmd("send", "-n", c.namesrv_addr, "-t", "aclT", "-b", "from the CLI")
    signed = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                            env={**env, "TIDEMQ_ACCESS_KEY": APP[0], "TIDEMQ_SECRET_KEY": APP[1]})
    assert signed.returncode == 0, signed.stderr
    unsigned = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert unsigned.returncode != 0 and "Traceback" not in unsigned.stderr
    half = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                          env={**env, "TIDEMQ_ACCESS_KEY": APP[0]})
    assert half.returncode != 0 and "TIDEMQ_SECRET_KEY" in half.stderr
