"""The kopf handlers' own rules, without kopf running: what a failed StatefulSet read means to a
Cluster pass (the per-object locks are tested in test_operator_races.py)."""

from __future__ import annotations

import pytest

kopf = pytest.importorskip("kopf")
kubernetes = pytest.importorskip("kubernetes")
pytest.importorskip("kmock")

from tests.support.kube import ThreadedEmulator, status_emulator  # noqa: E402
from tidemq.operator import crds, handlers  # noqa: E402
from tidemq.operator.metrics import OperatorMetrics  # noqa: E402

NS = "default"
pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


@pytest.fixture
def api(monkeypatch):
    """The kubernetes client's default configuration pointed at an emulator (the handlers build
    their clients from it, as they do in a pod)."""
    def build():
        emu = status_emulator()()
        emu.resources.load_bundled()
        return emu

    emu = ThreadedEmulator(build).start()
    cfg = kubernetes.client.Configuration()
    cfg.host = emu.url
    monkeypatch.setattr(kubernetes.client.Configuration, "_default", cfg)
    yield kubernetes.client.ApiClient(cfg)
    emu.stop()


def _statefulset(name: str) -> dict:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": NS},
            "spec": {"serviceName": name, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "image": "tidemq"}]}}}}


def _fail_reads(monkeypatch, status: int) -> None:
    def read(self, name, namespace, **_):
        raise kubernetes.client.ApiException(status=status, reason="Internal Server Error")

    monkeypatch.setattr(kubernetes.client.AppsV1Api, "read_namespaced_stateful_set", read)


def test_a_missing_statefulset_is_a_404_and_reads_as_none(api):
    kubernetes.client.AppsV1Api(api).create_namespaced_stateful_set(NS, _statefulset("demo-namesrv"))
    with pytest.raises(kubernetes.client.ApiException) as info:
        kubernetes.client.AppsV1Api(api).read_namespaced_stateful_set("demo-broker-0", NS)
    assert info.value.status == 404  # the emulator answers as the API server does
    live = handlers._read_statefulsets(["demo-namesrv", "demo-broker-0"], NS)
    assert live["demo-namesrv"]["metadata"]["name"] == "demo-namesrv"
    assert live["demo-broker-0"] is None


@pytest.mark.parametrize("status", [500, 403, 429])
def test_any_other_read_error_is_an_error_not_a_missing_statefulset(api, monkeypatch, status):
    _fail_reads(monkeypatch, status)
    with pytest.raises(kubernetes.client.ApiException) as info:
        handlers._read_statefulsets(["demo-namesrv", "demo-broker-0"], NS)
    assert info.value.status == status


async def test_a_cluster_pass_whose_reads_fail_applies_nothing_and_retries(api, monkeypatch):
    """Taken for missing, every StatefulSet would be applied at once: all broker groups rolling
    together instead of one after the other."""
    _fail_reads(monkeypatch, 500)
    applied: list[list[dict]] = []
    monkeypatch.setattr(handlers, "_apply_objects", lambda objs, ns: applied.append(objs) or [])
    cluster, errors = crds.admit({"apiVersion": crds.API_VERSION, "kind": "Cluster",
                                  "metadata": {"name": "demo", "namespace": NS, "uid": "uid-demo",
                                               "generation": 1},
                                  "spec": {"brokers": {"groups": 3}}})
    assert not errors
    config = handlers.OperatorConfig(retry_delay=7.0)
    with pytest.raises(kopf.TemporaryError) as info:
        await handlers.cluster_pass(config, OperatorMetrics(), kopf.Body(cluster), kopf.Patch())
    assert info.value.delay == 7.0 and "500" in str(info.value)
    assert applied == []

