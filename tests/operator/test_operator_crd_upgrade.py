"""CRD upgrades at operator start (tidemq.operator.crdupgrade; issue 18, item 15).

Before: Helm installs a chart's crds/ once and never upgrades them, so a new operator ran
against old schemas (new fields pruned by the API server). Now the leader applies its CRDs at
start (``--manage-crds``, the chart's ``operator.manageCRDs``) when the installed ones are older,
and never downgrades. Tested: the decision and the version order (pure), the merge patch, and
against kmock (its bundled apiextensions.k8s.io/v1 customresourcedefinitions): none installed ->
created; an older one (a field since removed, an old version) -> exactly ours; a newer one -> left
alone with a log line and no write; then a real ``tidemq operator --manage-crds`` process does it
as the elected leader.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
from pathlib import Path

import pytest

kmock = pytest.importorskip("kmock")
kubernetes = pytest.importorskip("kubernetes")

from tests.charts import test_chart  # noqa: E402
from tests.procs import tidemq_cmd  # noqa: E402
from tests.support.kube import ThreadedEmulator  # noqa: E402
from tests.support.kube_cas import build_cas_emulator, kubeconfig_text  # noqa: E402
from tests.support.waiting import wait_until_sync  # noqa: E402
from tidemq import __version__  # noqa: E402
from tidemq.operator import crds  # noqa: E402
from tidemq.operator.crdupgrade import (  # noqa: E402
    HASH_ANNOTATION,
    VERSION_ANNOTATION,
    decide,
    desired,
    ensure_crds,
    merge_patch,
    spec_hash,
    version_key,
)

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")
helm_python, kubeconfig = test_chart.helm_python, test_chart.kubeconfig  # the Helm fixtures, shared

NAMES = {kind: crds.load_crd(kind)["metadata"]["name"] for kind in crds.KINDS}


# pure ------------------------------------------------------------------------------------------
def test_versions_order_as_releases_do():
    ordered = ["0.9.9", "0.10.0.dev1", "0.10.0a1", "0.10.0b2", "0.10.0rc1", "0.10.0", "0.10.1", "1.0"]
    keys = [version_key(v) for v in ordered]
    assert all(k is not None for k in keys)
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert version_key("1.0") == version_key("1.0.0")
    assert version_key("not a version") is None


def _installed(wanted: dict, version: str | None, spec_change: bool) -> dict:
    crd = copy.deepcopy(wanted)
    annotations = crd["metadata"].pop("annotations")
    if version is not None:
        crd["metadata"]["annotations"] = {VERSION_ANNOTATION: version,
                                          HASH_ANNOTATION: "other" if spec_change else annotations[HASH_ANNOTATION]}
    if spec_change:
        crd["spec"]["names"]["shortNames"] = ["old"]
    return crd


@pytest.mark.parametrize("version, spec_change, action", [
    (None, False, "upgrade"),      # from a chart's crds/ (Helm, kubectl): no annotations
    ("0.0.1", True, "upgrade"),    # an older operator's
    (__version__, False, "current"),
    (__version__, True, "upgrade"),  # a development build of the same version
    ("99.0.0", True, "newer"),     # never downgrade
    ("garbled", True, "upgrade"),
])
def test_what_happens_to_an_installed_crd(version, spec_change, action):
    wanted = desired("Topic", __version__)
    assert decide(_installed(wanted, version, spec_change), wanted).action == action
    assert decide(None, wanted).action == "create"


def _apply_merge(base, patch):
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return patch
    out = dict(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _apply_merge(base.get(k), v)
    return out


def test_the_merge_patch_turns_the_old_spec_into_ours():
    new = crds.load_crd("Cluster")["spec"]
    old = copy.deepcopy(new)
    old["legacy"] = {"gone": True}
    old["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"].pop("brokers")
    old["names"]["shortNames"] = ["x", "y", "z"]
    patch = merge_patch(old, new)
    assert patch["legacy"] is None and _apply_merge(old, patch) == new
    assert merge_patch(new, new) == {}


# against the emulator --------------------------------------------------------------------------
@pytest.fixture
def emulator():
    holder: dict = {}

    def build():
        holder["emu"] = build_cas_emulator(custom=False)
        return holder["emu"]

    threaded = ThreadedEmulator(build, name="kmock-crds").start()
    cfg = kubernetes.client.Configuration()
    cfg.host = threaded.url
    yield threaded, kubernetes.client.ApiClient(cfg), holder["emu"]
    threaded.stop()


def _read(client, name: str) -> dict | None:
    api = kubernetes.client.ApiextensionsV1Api(client)
    try:
        return json.loads(api.read_custom_resource_definition(name, _preload_content=False).data)
    except kubernetes.client.ApiException as exc:
        assert exc.status == 404
        return None


def _crd_writes(emu) -> list:
    return [w for w in emu.writes if w.plural == "customresourcedefinitions"]


def test_missing_crds_are_created_and_then_left_as_they_are(emulator):
    _threaded, client, emu = emulator
    assert [d.action for d in ensure_crds(client, __version__)] == ["create"] * 3
    for kind, name in NAMES.items():
        got = _read(client, name)
        assert got["spec"] == crds.load_crd(kind)["spec"]
        assert got["metadata"]["annotations"][VERSION_ANNOTATION] == __version__
    writes = len(_crd_writes(emu))
    assert [d.action for d in ensure_crds(client, __version__)] == ["current"] * 3
    assert len(_crd_writes(emu)) == writes  # nothing written when they are ours


def test_an_older_crd_is_upgraded_and_a_newer_one_left_alone(emulator, caplog):
    _threaded, client, emu = emulator
    api = kubernetes.client.ApiextensionsV1Api(client)
    old = crds.load_crd("Topic")  # as Helm installed it from an older chart: no annotations
    props = old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    props.pop("messageType")
    props["legacyField"] = {"type": "string"}
    api.create_custom_resource_definition(old)
    newer = desired("ConsumerGroup", "99.0.0")
    newer["spec"]["names"]["shortNames"] = ["from-the-future"]
    newer["metadata"]["annotations"][HASH_ANNOTATION] = spec_hash(newer)
    api.create_custom_resource_definition(newer)
    before = len(_crd_writes(emu))
    with caplog.at_level(logging.INFO, logger="tidemq.operator.crdupgrade"):
        done = {d.name: d.action for d in ensure_crds(client, __version__)}
    assert done == {NAMES["Cluster"]: "create", NAMES["Topic"]: "upgrade", NAMES["ConsumerGroup"]: "newer"}
    topic = _read(client, NAMES["Topic"])
    assert topic["spec"] == crds.load_crd("Topic")["spec"]  # messageType back, legacyField gone
    assert topic["metadata"]["annotations"][VERSION_ANNOTATION] == __version__
    assert _read(client, NAMES["ConsumerGroup"])["spec"]["names"]["shortNames"] == ["from-the-future"]
    written = {(w.action, w.name) for w in _crd_writes(emu)[before:]}
    assert written == {("CREATE", None), ("UPDATE", NAMES["Topic"])}  # the newer one: not a write
    [line] = [r for r in caplog.records if NAMES["ConsumerGroup"] in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert f"left alone (installed by operator 99.0.0, newer than {__version__})" in line.getMessage()


def test_the_elected_operator_applies_its_crds_at_start(emulator, tmp_path: Path):
    threaded, client, _emu = emulator
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kubeconfig_text(threaded.url, "operator"))
    log = tmp_path / "operator.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(tidemq_cmd(
            "operator", "--all-namespaces", "--manage-crds", "--leader-identity", "op", "--leader-lease-namespace",
            "default", "--liveness", "", "--metrics-listen", ""),
            stdout=out, stderr=subprocess.STDOUT,
            env=dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1"))
    try:
        wait_until_sync(lambda: all(_read(client, n) for n in NAMES.values()), "the CRDs", timeout=60, interval=0.2)
        text = wait_until_sync(lambda: "CRD consumergroups.tidemq.io: created" in log.read_text() and log.read_text(),
                               "the log line", timeout=10)
        assert text.index("op now leads") < text.index("CRD clusters.tidemq.io: created"), text
    finally:
        proc.kill()
        proc.wait(10)


def test_the_chart_grants_exactly_what_the_upgrade_uses(emulator, request):
    """ensure_crds' calls (create one, read and patch the others by name) against the chart's
    ClusterRole for operator.manageCRDs."""
    from tests.charts.test_chart_hooks import render_with_hooks  # noqa: PLC0415 (needs the Helm fixtures)
    from tests.support import rbac  # noqa: PLC0415

    _threaded, client, emu = emulator
    kubernetes.client.ApiextensionsV1Api(client).create_custom_resource_definition(crds.load_crd("Topic"))
    emu.seen.clear()
    ensure_crds(client, __version__)  # creates two, upgrades one
    used = {rbac.permission(method, path, query) for _token, method, path, query in emu.seen} - {None}
    objs, _hooks = render_with_hooks(request.getfixturevalue("helm_python"), request.getfixturevalue("kubeconfig"),
                                     "crdrbac", {"cluster": {"enabled": False}})
    [role] = [o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-crds")]
    assert rbac.granted(role["rules"]) == used
    named = {n for rule in role["rules"] for n in rule.get("resourceNames", [])}
    assert named == set(NAMES.values())
