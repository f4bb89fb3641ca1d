"""spec.brokers.acl: the operator mounts the ACL Secret and passes --acl-file (S1/S5 in the chart)."""

from __future__ import annotations

import inspect
import re

import kubernetes_validate
import pytest

from tests.operator.test_operator_workloads import _arg, _by, _cluster, _container
from tidemq.cli.operator import operator_cmd
from tidemq.cli.servers import broker_cmd
from tidemq.client.config import ClientConfig
from tidemq.operator import adminpool, crds
from tidemq.operator import workloads as w


def test_acl_secret_is_mounted_read_only_and_passed_to_the_broker(tmp_path):
    objs = w.desired_objects(_cluster(brokers={"acl": {"secretName": "mq-acl", "key": "acl.yml"}}))
    sts = _by(objs, "StatefulSet", "demo-broker-0")
    c = _container(sts)
    assert _arg(c, "--acl-file") == f"{w.ACL_DIR}/acl.yml"
    [mount] = [m for m in c["volumeMounts"] if m["name"] == "acl"]
    assert mount == {"name": "acl", "mountPath": w.ACL_DIR, "readOnly": True} and "subPath" not in mount
    [vol] = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "acl"]
    assert vol == {"name": "acl", "secret": {"secretName": "mq-acl", "defaultMode": 0o440}}
    for o in objs:
        kubernetes_validate.validate(o, "1.30", strict=True)
    args = [str(tmp_path / "broker.conf") if a.endswith("broker.conf") else a for a in c["args"]]
    (tmp_path / "broker.conf").write_text(_by(objs, "ConfigMap", "demo-broker-0-config")["data"]["broker.conf"])
    assert broker_cmd.make_context("broker", args).params["acl_file"] == f"{w.ACL_DIR}/acl.yml"
    # no Secret content ever passes through the workloads: Secrets are referenced by name only
    assert all(o["kind"] != "Secret" for o in objs)
    assert "secretKey:" not in repr(objs) and "accounts" not in repr(objs)
    assert all("value" not in e for e in c["env"] if e["name"].endswith("SECRET_KEY"))


def test_no_acl_by_default():
    sts = _by(w.desired_objects(_cluster()), "StatefulSet", "demo-broker-0")
    assert "--acl-file" not in _container(sts)["args"]
    assert all(v["name"] != "acl" for v in sts["spec"]["template"]["spec"]["volumes"])


def _admit(acl):
    obj = _cluster(brokers={"acl": acl})
    obj["metadata"].pop("uid", None)
    return crds.admit(obj)


def test_crd_defaults_the_key_and_checks_the_secret_name():
    obj, problems = _admit({"secretName": "mq-acl"})
    assert problems == [] and obj["spec"]["brokers"]["acl"]["key"] == "plain_acl.yml"


@pytest.mark.parametrize("acl", [{}, {"secretName": "Bad_Name"}, {"secretName": "ok", "key": "../x/y"}])
def test_crd_refuses_bad_acl_specs(acl):
    assert _admit(acl)[1] != []


def test_operator_signs_broker_calls_with_its_acl_credentials(monkeypatch):
    """TIDEMQ_OPERATOR_ACCESS_KEY/SECRET_KEY (the chart's acl.operatorSecret) reach every Admin."""
    handlers = pytest.importorskip("tidemq.operator.handlers")  # needs kopf, unlike the rest here

    monkeypatch.setenv("TIDEMQ_OPERATOR_ACCESS_KEY", "operatorKey1")
    monkeypatch.setenv("TIDEMQ_OPERATOR_SECRET_KEY", "operator-secret-1")
    params = operator_cmd.make_context("operator", ["--all-namespaces"]).params
    assert params["access_key"] == "operatorKey1" and params["secret_key"] == "operator-secret-1"
    # every pass borrows its connection from the admin pool with the operator's client config
    src = inspect.getsource(handlers)
    borrows = re.findall(r"adminpool\.borrow\(pool, [^,]+, ([^,)]+)", src)
    assert len(borrows) == 6 and set(borrows) == {"config.client_config"} and "Admin(" not in src
    pool_src = inspect.getsource(adminpool)
    assert pool_src.count("Admin(list(servers), config, namesrv_credentials=namesrv_credentials)") == 2
    cfg = handlers.OperatorConfig(client_config=ClientConfig(access_key="operatorKey1", secret_key="operator-secret-1"))
    assert "operator-secret-1" not in repr(cfg)
