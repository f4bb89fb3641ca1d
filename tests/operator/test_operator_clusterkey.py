"""The cluster key (tidemq.operator.clusterkey): every managed Cluster's name servers take route
changes only from its brokers and the operator. Pure planning: the Secret, the name servers'
--acl-file mount, the brokers' credentials from the Secret, when protection is switched on; and
the generated files checked by the real `tidemq namesrv` / `tidemq broker` processes."""

from __future__ import annotations

import base64
import json
import os

import kubernetes_validate
import pytest

from tests.operator.test_operator_workloads import UID, _arg, _by, _cluster, _container
from tests.procs import ServerProcess, free_port, tidemq_cmd
from tests.support.waiting import wait_until_sync
from tidemq.broker.acl import parse_acl_config
from tidemq.cli.servers import broker_cmd, namesrv_cmd
from tidemq.operator import clusterkey as ck
from tidemq.operator import workloads as w

MASTER = b"m" * 43


def _data(secret: dict) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_credentials_are_derived_per_cluster_and_stable() -> None:
    ak, sk = ck.derive_credentials(MASTER, "mq", "demo")
    assert (ak, sk) == ck.derive_credentials(MASTER, "mq", "demo")
    assert ak == "tidemq-cluster-demo" and len(sk) >= 40
    others = {ck.derive_credentials(MASTER, "other", "demo")[1], ck.derive_credentials(MASTER, "mq", "demo2")[1],
              ck.derive_credentials(b"n" * 43, "mq", "demo")[1]}
    assert sk not in others and len(others) == 3


def test_the_secret_holds_one_admin_account_and_is_owned_by_the_cluster() -> None:
    creds = ck.derive_credentials(MASTER, "mq", "demo")
    secret = ck.cluster_key_secret(_cluster(), creds)
    kubernetes_validate.validate(secret, "1.30", strict=True)
    assert secret["metadata"]["name"] == "demo-namesrv-acl" and secret["metadata"]["namespace"] == "mq"
    [owner] = secret["metadata"]["ownerReferences"]
    assert owner["kind"] == "Cluster" and owner["uid"] == UID and owner["controller"] is True
    data = _data(secret)
    assert (data["accessKey"], data["secretKey"]) == creds
    acl = parse_acl_config(data["plain_acl.yml"])  # the parser the name server uses
    [account] = acl.accounts.values()
    assert (account.access_key, account.secret_key, account.admin) == (*creds, True)


def test_the_master_key_secret_is_random_and_long_enough() -> None:
    a = ck.master_key_secret("tidemq-cluster-key", "tidemq")
    b = ck.master_key_secret("tidemq-cluster-key", "tidemq")
    kubernetes_validate.validate(a, "1.30", strict=True)
    key_a = base64.b64decode(a["data"][ck.MASTER_KEY])
    assert key_a != base64.b64decode(b["data"][ck.MASTER_KEY]) and len(key_a) >= ck.MIN_MASTER_BYTES
    fixed = ck.master_key_secret("k", "ns", token=lambda n: b"\0" * n)
    assert base64.b64decode(fixed["data"][ck.MASTER_KEY]) == base64.urlsafe_b64encode(b"\0" * 32)


def test_read_master_key_waits_for_a_real_key(tmp_path) -> None:
    path = tmp_path / "masterKey"
    assert ck.read_master_key(path) is None
    path.write_text("short\n")
    assert ck.read_master_key(path) is None
    path.write_text("x" * 43 + "\n")
    assert ck.read_master_key(path) == b"x" * 43


def test_name_servers_mount_the_key_and_brokers_sign_with_it(monkeypatch, tmp_path) -> None:
    objs = w.desired_objects(_cluster())
    for o in objs:
        kubernetes_validate.validate(o, "1.30", strict=True)
    ns = _by(objs, "StatefulSet", "demo-namesrv")
    c = _container(ns)
    assert _arg(c, "--acl-file") == f"{w.NAMESRV_ACL_DIR}/plain_acl.yml"
    assert {"name": "namesrv-acl", "mountPath": w.NAMESRV_ACL_DIR, "readOnly": True} in c["volumeMounts"]
    [vol] = [v for v in ns["spec"]["template"]["spec"]["volumes"] if v["name"] == "namesrv-acl"]
    assert vol["secret"] == {"secretName": "demo-namesrv-acl", "defaultMode": 0o440,
                             "items": [{"key": "plain_acl.yml", "path": "plain_acl.yml"}]}  # not the bare keys
    assert namesrv_cmd.make_context("namesrv", list(c["args"])).params["acl_file"] == f"{w.NAMESRV_ACL_DIR}/plain_acl.yml"
    for group in (0, 1):
        b = _container(_by(objs, "StatefulSet", f"demo-broker-{group}"))
        env = {e["name"]: e for e in b["env"]}
        for var, key in (("TIDEMQ_BROKER_NAMESRV_ACCESS_KEY", "accessKey"),
                         ("TIDEMQ_BROKER_NAMESRV_SECRET_KEY", "secretKey")):
            assert env[var] == {"name": var, "valueFrom": {"secretKeyRef": {"name": "demo-namesrv-acl", "key": key}}}
    # the variables are the broker CLI's own options
    (tmp_path / "broker.conf").write_text(_by(objs, "ConfigMap", "demo-broker-0-config")["data"]["broker.conf"])
    args = [str(tmp_path / "broker.conf") if a.endswith("broker.conf") else a for a in b["args"]]
    monkeypatch.setenv("TIDEMQ_BROKER_NAMESRV_ACCESS_KEY", "tidemq-cluster-demo")
    monkeypatch.setenv("TIDEMQ_BROKER_NAMESRV_SECRET_KEY", "s" * 43)
    params = broker_cmd.make_context("broker", args).params
    assert (params["namesrv_access_key"], params["namesrv_secret_key"]) == ("tidemq-cluster-demo", "s" * 43)


def test_protection_can_wait_for_the_brokers_or_be_off() -> None:
    pending = w.desired_objects(_cluster(), namesrv_acl=False)
    assert "--acl-file" not in _container(_by(pending, "StatefulSet", "demo-namesrv"))["args"]
    assert "TIDEMQ_BROKER_NAMESRV_SECRET_KEY" in {e["name"] for e in _container(_by(pending, "StatefulSet", "demo-broker-0"))["env"]}
    off = w.desired_objects(_cluster(), broker_signing=False)
    assert "--acl-file" not in _container(_by(off, "StatefulSet", "demo-namesrv"))["args"]
    assert not any("NAMESRV_" in e["name"] for o in _by(off, "StatefulSet") for e in _container(o)["env"])
    assert w.desired_objects(_cluster(external={"nameServers": ["a:9876"]}, brokers=None, nameServers=None)) == []


def _live(objs, settled=True, drop_env=False) -> dict:
    out = {}
    for o in _by(objs, "StatefulSet"):
        o = json.loads(json.dumps(o))
        if drop_env:
            for c in o["spec"]["template"]["spec"]["containers"]:
                c["env"] = [e for e in c["env"] if "NAMESRV_" not in e["name"]]
        n = o["spec"]["replicas"]
        o["metadata"]["generation"] = 2
        o["status"] = {"observedGeneration": 2, "replicas": n, "readyReplicas": n if settled else 0,
                       "availableReplicas": n if settled else 0, "updatedReplicas": n}
        out[o["metadata"]["name"]] = o
    return out


def test_name_servers_require_signatures_only_once_every_broker_signs() -> None:
    pending = w.desired_objects(_cluster(), namesrv_acl=False)
    names = [o["metadata"]["name"] for o in _by(pending, "StatefulSet")]
    assert ck.namesrv_acl_ready("demo", {n: None for n in names})  # first install: at once
    old = _live(pending, drop_env=True)  # an upgrade: brokers that do not sign yet
    assert not ck.namesrv_acl_ready("demo", old)
    assert not ck.namesrv_acl_ready("demo", _live(pending, settled=False))  # rolling
    assert ck.namesrv_acl_ready("demo", _live(pending))  # every broker pod signs now
    on = _live(w.desired_objects(_cluster()), drop_env=True)
    assert ck.namesrv_acl_ready("demo", on)  # once on, it stays on
    partial = dict(_live(pending), **{"demo-broker-1": None})  # a group not created yet
    assert ck.namesrv_acl_ready("demo", partial)


def test_generated_files_work_with_real_processes(tmp_path) -> None:
    """The Secret's plain_acl.yml is what `tidemq namesrv --acl-file` loads, and a broker given the
    Secret's keys in the operator's variables registers; one without them is refused."""
    creds = ck.derive_credentials(MASTER, "mq", "demo")
    data = _data(ck.cluster_key_secret(_cluster(), creds))
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(data["plain_acl.yml"])
    ns_port, ns_m = free_port(), free_port()
    namesrv = ServerProcess(tidemq_cmd("namesrv", "--listen", f"127.0.0.1:{ns_port}", "--metrics-listen",
                                       f"127.0.0.1:{ns_m}", "--acl-file", str(acl)),
                            tmp_path / "namesrv.log", f"http://127.0.0.1:{ns_m}/readyz").start()
    brokers = []
    try:
        for name, env in (("signed", {"TIDEMQ_BROKER_NAMESRV_ACCESS_KEY": data["accessKey"],
                                      "TIDEMQ_BROKER_NAMESRV_SECRET_KEY": data["secretKey"]}), ("unsigned", {})):
            port, mport = free_port(), free_port()
            saved = dict(os.environ)
            os.environ.update(env)
            try:
                brokers.append(ServerProcess(
                    tidemq_cmd("broker", "--namesrv", f"127.0.0.1:{ns_port}", "--listen", f"127.0.0.1:{port}",
                               "--store", str(tmp_path / name), "--broker-name", name, "--segment-size", str(4 << 20),
                               "--metrics-listen", f"127.0.0.1:{mport}"),
                    # a refused broker is not ready (issue 18, item 10): wait for it to be alive
                    tmp_path / f"{name}.log", f"http://127.0.0.1:{mport}/{'readyz' if env else 'healthz'}").start())
            finally:
                os.environ.clear()
                os.environ.update(saved)
        signed, unsigned = brokers
        try:
            wait_until_sync(lambda: "registered signed" in signed.log() and "AclException" in unsigned.log(),
                            "the signed broker registered and the unsigned one refused", timeout=20, interval=0.1)
        except AssertionError as exc:
            exc.add_note(f"--- signed broker ---\n{signed.log()[-1500:]}\n--- unsigned broker ---\n{unsigned.log()[-1500:]}")
            raise
        assert "registered unsigned" not in unsigned.log()
    finally:
        for b in brokers:
            b.stop()
        namesrv.stop()


@pytest.mark.parametrize("spec", [{}, {"brokers": {"groups": 3}}])
def test_the_secret_is_not_among_the_applied_workloads(spec) -> None:
    """Workloads are patched on every pass; the Secret is created once, apart (never rotated)."""
    assert all(o["kind"] != "Secret" for o in w.desired_objects(_cluster(**spec)))
