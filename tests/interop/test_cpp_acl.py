"""ACL with the RocketMQ C++ client's set_session_credentials against a real TideMQ broker (S1).

The C++ client signs with the same algorithm (verified by the broker); a refused sync send surfaces
in the wheel only as "No route info of this topic" once its retries are spent, so the reason is
checked in the broker's log. The response code itself (SYSTEM_ERROR, as RocketMQ 4.9.8) is checked
with TideMQ's client in tests/broker/test_acl_broker.py.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.broker.test_acl_broker import ACL, ADMIN, APP, PUB_ONLY, SECRETS
from tests.broker.test_acl_broker import cfg as client_cfg
from tests.procs import Cluster
from tests.support.routes import wait_for_route_sync
from tidemq.client.sync import SyncAdmin, SyncPullConsumer

from tests.interop.cppwheel import run_scenario, skip_module_without_wheel

pytestmark = pytest.mark.interop

SCENARIOS = Path(__file__).with_name("cpp_scenarios_acl.py")


skip_module_without_wheel()


def cpp(scenario: str, creds: tuple[str, str] | None, timeout: float = 90, **args) -> dict:
    if creds is not None:
        args.update(access_key=creds[0], secret_key=creds[1])
    return run_scenario(SCENARIOS, scenario, args, timeout)


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpp_acl")
    path = root / "plain_acl.yml"
    path.write_text(ACL)
    os.chmod(path, 0o600)
    c = Cluster(root, extra_broker_args=["--acl-file", str(path)])
    try:
        c.start()
    except Exception:  # noqa: BLE001 (whatever failed, stop what started, then say why with the log)
        c.stop()
        raise RuntimeError(f"ACL cluster did not start:\n{c.broker.log()[-3000:]}")
    with SyncAdmin(c.namesrv_addr, client_cfg(c, ADMIN)) as admin:
        for topic in ("aclT", "denyT"):
            admin.create_topic(topic, 2, 2, cluster=c.cluster_name)
        for topic in ("aclT", "denyT"):
            wait_for_route_sync(admin, topic, 2, timeout=15)
    yield c
    c.stop()


def stored_bodies(c: Cluster) -> list[str]:
    out = []
    with SyncPullConsumer("reader", config=client_cfg(c, ADMIN)) as pc:
        for mq in pc.fetch_queues("aclT"):
            out += [m.body.decode() for m in pc.pull(mq, 0, 64).messages]
    return out


def test_cpp_right_key_sends_and_consumes(acl_cluster):
    c = acl_cluster
    bodies = [f"cpp-acl-{uuid.uuid4().hex[:8]}-{i}" for i in range(5)]
    res = cpp("produce", APP, namesrv=c.namesrv_addr, topic="aclT", bodies=bodies)
    assert [r.get("status") for r in res["results"]] == [0] * 5, res
    assert set(bodies) <= set(stored_bodies(c))
    got = cpp("push_consume", APP, namesrv=c.namesrv_addr, topic="aclT", group=f"cg_{uuid.uuid4().hex[:6]}",
              expect=len(stored_bodies(c)), wait=40)
    assert set(bodies) <= set(got["messages"])


@pytest.mark.parametrize("creds, remark", [
    ((APP[0], "wrong-secret-9"), f"Check signature failed for accessKey={APP[0]}"),
    (None, "No accessKey is configured"),
    (APP, "No default permission for topic:denyT"),
])
def test_cpp_refusals_answer_rocketmq_code_and_remark(acl_cluster, creds, remark):
    c = acl_cluster
    topic = "denyT" if "denyT" in remark else "aclT"
    before = stored_bodies(c)
    body = f"refused-{uuid.uuid4().hex[:8]}"
    res = cpp("produce", creds, namesrv=c.namesrv_addr, topic=topic, bodies=[body])
    [r] = res["results"]
    assert "error" in r, r  # the wheel hides the broker's remark behind "No route info" after retries
    ak = creds[0] if creds else None
    assert f"(accessKey={ak}): {remark}" in c.broker.log()
    assert body not in before and body not in stored_bodies(c)


def test_cpp_pub_only_account_cannot_consume(acl_cluster):
    c = acl_cluster
    body = f"pubonly-{uuid.uuid4().hex[:8]}"
    res = cpp("produce", PUB_ONLY, namesrv=c.namesrv_addr, topic="aclT", bodies=[body])
    assert res["results"][0].get("status") == 0, res  # PUB is enough to send
    got = cpp("push_consume", PUB_ONLY, namesrv=c.namesrv_addr, topic="aclT", group=f"cg_{uuid.uuid4().hex[:6]}",
              expect=1, wait=5)
    assert got["messages"] == []
    log = c.broker.log()
    assert f"accessKey={PUB_ONLY[0]}): No default permission for topic:aclT" in log
    for secret in SECRETS + ["wrong-secret-9"]:
        assert secret not in log
