"""`tidemq operator cleanup`, the chart's pre-delete hook (issue 18, item 13).

Before: `helm uninstall` deleted the operator and its RBAC together with the Topics, which kept
the operator's finalizer and stayed Terminating for ever. Now a pre-delete hook Job runs the
cleanup while the operator still runs. Against kmock (tests/support/kube_cas.py: Events get their
generated names, and every request is logged with its client's token):

- no operator: the release's Topics are deleted, their finalizers released after the timeout
  with a Warning Event each; its ConsumerGroups go; another release's and a hand-made Topic stay;
- a real operator (`tidemq operator`, its delete handler releasing the finalizer itself): the
  Topics go before the timeout and the cleanup releases nothing;
- the hook's Role, as Helm renders it, grants exactly what the cleanup asked for.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

kmock = pytest.importorskip("kmock")
kubernetes = pytest.importorskip("kubernetes")
pytest.importorskip("kopf")

from tests.charts import test_chart  # noqa: E402
from tests.charts.test_chart_hooks import render_with_hooks  # noqa: E402
from tests.procs import tidemq_cmd  # noqa: E402
from tests.support import rbac  # noqa: E402
from tests.support.kube import ThreadedEmulator  # noqa: E402
from tests.support.kube_cas import build_cas_emulator, kubeconfig_text  # noqa: E402
from tests.support.waiting import wait_until_sync  # noqa: E402
from tidemq.operator import crds  # noqa: E402
from tidemq.operator.cleanup import FINALIZER  # noqa: E402

helm_python, kubeconfig = test_chart.helm_python, test_chart.kubeconfig  # the fixtures, shared

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")

NS = "default"


class Emulator:
    def __init__(self) -> None:
        self.emu = None
        self.threaded = ThreadedEmulator(self._build, name="kmock-cleanup").start()
        cfg = kubernetes.client.Configuration()
        cfg.host = self.threaded.url
        self.api = kubernetes.client.ApiClient(cfg)
        self.custom = kubernetes.client.CustomObjectsApi(self.api)

    def _build(self):
        self.emu = build_cas_emulator()
        return self.emu

    def kubeconfig(self, root: Path, token: str) -> Path:
        path = root / f"kubeconfig-{token}"
        path.write_text(kubeconfig_text(self.threaded.url, token))
        return path

    def create(self, kind: str, name: str, release: str | None, finalizers: bool = True) -> None:
        md: dict = {"name": name, "namespace": NS, "uid": f"uid-{name}"}
        if release:
            md["labels"] = {"app.kubernetes.io/instance": release, "app.kubernetes.io/managed-by": "Helm"}
        if finalizers and kind == "Topic":
            md["finalizers"] = [FINALIZER]
        spec = {"clusterRef": {"name": "nowhere"}}
        obj, problems = crds.admit({"apiVersion": crds.API_VERSION, "kind": kind, "metadata": md, "spec": spec})
        assert problems == []
        self.custom.create_namespaced_custom_object(crds.GROUP, crds.VERSION, NS, crds.PLURALS[kind], obj)

    def names(self, kind: str) -> dict[str, dict]:
        items = self.custom.list_namespaced_custom_object(crds.GROUP, crds.VERSION, NS, crds.PLURALS[kind])["items"]
        return {o["metadata"]["name"]: o for o in items}

    def events(self) -> list[dict]:
        return kubernetes.client.CoreV1Api(self.api).list_namespaced_event(NS).to_dict()["items"]


@pytest.fixture
def emulator():
    emu = Emulator()
    yield emu
    emu.threaded.stop()


def cleanup(emulator: Emulator, root: Path, release: str, timeout: float) -> tuple[int, str, float]:
    env = dict(os.environ, KUBECONFIG=str(emulator.kubeconfig(root, "cleanup")), PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    r = subprocess.run(tidemq_cmd("operator", "cleanup", f"--release={release}", f"--namespace={NS}",
                                  f"--timeout={timeout}"), capture_output=True, text=True, env=env, timeout=120)
    return r.returncode, r.stdout + r.stderr, time.monotonic() - t0


def test_without_an_operator_the_finalizers_are_released_after_the_timeout(emulator, tmp_path):
    emulator.create("Topic", "orders", "shop")
    emulator.create("Topic", "payments", "shop")
    emulator.create("ConsumerGroup", "billing", "shop")
    emulator.create("Topic", "theirs", "other-release")
    emulator.create("Topic", "by-hand", None)
    rc, out, took = cleanup(emulator, tmp_path, "shop", timeout=1.5)
    assert rc == 0, out
    assert took >= 1.5 and "Traceback" not in out, out
    assert "release shop in default: 1 deleted, 2 finalizers released, 0 left" in out, out
    assert "released Topic/orders: the topic may remain on the brokers" in out
    assert set(emulator.names("Topic")) == {"theirs", "by-hand"}
    assert emulator.names("ConsumerGroup") == {}
    for name in ("theirs", "by-hand"):  # never deleted nor patched
        md = emulator.names("Topic")[name]["metadata"]
        assert not md.get("deletionTimestamp") and md["finalizers"] == [FINALIZER]
    warnings = {e["involved_object"]["name"]: e for e in emulator.events() if e["reason"] == "FinalizerReleased"}
    assert set(warnings) == {"orders", "payments"}
    assert warnings["orders"]["type"] == "Warning" and "may remain on the brokers" in warnings["orders"]["message"]
    assert warnings["orders"]["involved_object"]["uid"] == "uid-orders"


def test_with_the_operator_running_the_topics_go_before_the_timeout(emulator, tmp_path):
    emulator.create("Topic", "orders", "shop", finalizers=False)
    log = tmp_path / "operator.log"
    with open(log, "wb") as out:
        operator = subprocess.Popen(tidemq_cmd(
            "operator", "--all-namespaces", "--no-leader-election", "--liveness", "", "--metrics-listen", "",
            "--timer-interval", "1", "--retry-delay", "1", "--delete-retries", "0",
        ), stdout=out, stderr=subprocess.STDOUT,
            env=dict(os.environ, KUBECONFIG=str(emulator.kubeconfig(tmp_path, "operator")), PYTHONUNBUFFERED="1"))
    try:
        # the operator puts its finalizer on the Topic (kopf, settings.persistence.finalizer)
        wait_until_sync(lambda: FINALIZER in (emulator.names("Topic")["orders"]["metadata"].get("finalizers") or []),
                        "the operator's finalizer", timeout=60, interval=0.2)
        rc, out, took = cleanup(emulator, tmp_path, "shop", timeout=60)
        assert rc == 0, out + log.read_text()
        assert "release shop in default: 1 deleted, 0 finalizers released, 0 left" in out, out
        assert took < 30
        assert emulator.names("Topic") == {}
        # the finalizer went by the operator's hand: the cleanup wrote no Event and patched nothing
        by_cleanup = {(w.action, w.plural) for w in emulator.emu.writes if w.token == "cleanup"}
        assert by_cleanup == {("DELETE", "topics")}
    finally:
        operator.kill()
        operator.wait(10)


def test_the_hook_role_grants_exactly_what_the_cleanup_uses(emulator, tmp_path, helm_python, kubeconfig):
    emulator.create("Topic", "orders", "shop")
    emulator.create("ConsumerGroup", "billing", "shop")
    rc, out, _ = cleanup(emulator, tmp_path, "shop", timeout=0.5)
    assert rc == 0, out
    used = {rbac.permission(method, path, query) for token, method, path, query in emulator.emu.seen
            if token == "cleanup"} - {None}
    hooks = render_with_hooks(helm_python, kubeconfig, "hookrbac", {})[1]
    [role] = [h for h in hooks if h["kind"] == "Role"]
    assert rbac.granted(role["rules"]) == used
    assert rbac.risky(used) == []


def test_missing_crds_leave_nothing_to_clean_up(tmp_path):
    """Without the CRDs (deleted by hand before uninstalling) the hook succeeds: nothing is left."""
    threaded = ThreadedEmulator(lambda: build_cas_emulator(custom=False), name="kmock-nocrds").start()
    try:
        kubeconfig_path = tmp_path / "kubeconfig"
        kubeconfig_path.write_text(kubeconfig_text(threaded.url, "cleanup"))
        r = subprocess.run(tidemq_cmd("operator", "cleanup", "--release=shop", "--timeout=1"), capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, KUBECONFIG=str(kubeconfig_path)))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "release shop in default: 0 deleted, 0 finalizers released, 0 left" in r.stdout
    finally:
        threaded.stop()
