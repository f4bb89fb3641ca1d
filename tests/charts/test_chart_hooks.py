"""The chart's hooks and the operator's HA objects, rendered by Helm's engine (issue 18, items 1, 13, 15).

Helm keeps hooks out of a release's manifest: Install (into kmock, see test_chart.py) returns them
apart, with their events, weights and delete policies as Helm parsed them. Checked here:
- the pre-delete cleanup (`tidemq operator cleanup`): a Job whose flags exist, after (by weight)
  its own ServiceAccount, Role and RoleBinding, all deleted once the hooks succeeded; off with
  operator.cleanup.enabled=false; with rbac.create=false it runs as the operator's account;
- the leader election's Role (its Lease only, by name) and the CRD upgrades' ClusterRole (the three
  TideMQ CRDs by name), each following its switch.
tests/operator/test_operator_cleanup.py checks that the hook's Role is exactly what the cleanup uses.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.charts import test_chart
from tests.charts.test_chart import CHART, INSTALL, validate_object
from tidemq.cli.operator import operator_cmd
from tidemq.operator import crds

yaml = pytest.importorskip("yaml")

helm_python, kubeconfig = test_chart.helm_python, test_chart.kubeconfig  # the fixtures, shared

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


def render_with_hooks(helm_python: Path, kubeconfig: Path, release: str, values: dict) -> tuple[list[dict], list[dict]]:
    """(objects, hooks) Helm renders for ``values``; each hook carries ``_hook`` (events, weight,
    delete policies as Helm parsed them)."""
    proc = subprocess.run(
        [str(helm_python), "-c", INSTALL, str(kubeconfig), release, str(CHART), json.dumps(values)],
        capture_output=True, text=True, timeout=120, cwd=CHART.parent, env=dict(os.environ, HELM_DRIVER="memory"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    objs = [doc for doc in yaml.safe_load_all(result["manifest"]) if doc]
    hooks = []
    for hook in result.get("hooks") or []:
        obj = yaml.safe_load(hook["manifest"])
        obj["_hook"] = {"events": hook["events"], "weight": hook.get("weight", 0),  # 0 is left out
                        "delete": hook["delete_policies"]}
        hooks.append(obj)
    return objs, hooks


@pytest.fixture(scope="module")
def default(helm_python, kubeconfig):
    return render_with_hooks(helm_python, kubeconfig, "hooks", {})


def test_the_cleanup_hook_runs_before_anything_is_deleted(default):
    objs, hooks = default
    by_kind = {h["kind"]: h for h in hooks}
    assert sorted(by_kind) == ["Job", "Role", "RoleBinding", "ServiceAccount"] and len(hooks) == 4
    for hook in hooks:
        assert hook["_hook"]["events"] == ["pre-delete"]
        assert hook["_hook"]["delete"] == ["before-hook-creation", "hook-succeeded"]
        assert hook["_hook"]["weight"] == (0 if hook["kind"] == "Job" else -10)  # RBAC first
        assert hook["metadata"]["namespace"] == "default"
        validate_object({k: v for k, v in hook.items() if k != "_hook"})
    assert not any(o["kind"] == "Job" for o in objs)  # only a hook
    job = by_kind["Job"]["spec"]
    pod = job["template"]["spec"]
    assert pod["serviceAccountName"] == by_kind["ServiceAccount"]["metadata"]["name"] == "hooks-tidemq-operator-cleanup"
    binding = by_kind["RoleBinding"]
    assert binding["roleRef"]["name"] == by_kind["Role"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hooks-tidemq-operator-cleanup", "namespace": "default"}]
    [container] = pod["containers"]
    assert container["args"][:2] == ["operator", "cleanup"]
    assert {"--release=hooks", "--namespace=default", "--timeout=120"} <= set(container["args"])
    parsed = CliRunner().invoke(operator_cmd, [*container["args"][1:], "--help"])  # every flag exists
    assert parsed.exit_code == 0, parsed.output
    assert job["activeDeadlineSeconds"] > 120 and pod["restartPolicy"] == "Never"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # the Role: only the release's custom objects and the Warning Events
    assert {r for rule in by_kind["Role"]["rules"] for r in rule["resources"]} == {"topics", "consumergroups", "events"}


def test_the_cleanup_hook_follows_its_switches(helm_python, kubeconfig):
    _objs, hooks = render_with_hooks(helm_python, kubeconfig, "nohook", {"operator": {"cleanup": {"enabled": False}},
                                                                         "cluster": {"enabled": False}})
    assert hooks == []
    _objs, hooks = render_with_hooks(helm_python, kubeconfig, "norbac", {
        "rbac": {"create": False}, "serviceAccount": {"create": False, "name": "existing"},
        "operator": {"cleanup": {"timeout": 30}}, "cluster": {"enabled": False}})
    [job] = hooks
    assert job["kind"] == "Job" and job["spec"]["template"]["spec"]["serviceAccountName"] == "existing"
    assert "--timeout=30" in job["spec"]["template"]["spec"]["containers"][0]["args"]


def test_leader_election_and_crd_rbac_name_their_objects(default, helm_python, kubeconfig):
    objs, _hooks = default
    roles = {o["metadata"]["name"]: o for o in objs if o["kind"] in ("Role", "ClusterRole")}
    lease = roles["hooks-tidemq-operator-leader-election"]
    assert lease["kind"] == "Role" and lease["metadata"]["namespace"] == "default"
    assert lease["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["hooks-tidemq-operator"],
         "verbs": ["get", "patch"]}]
    deployment = next(o for o in objs if o["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-lease=hooks-tidemq-operator" in args and "--leader-lease-namespace=default" in args
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    crd_role = roles["hooks-tidemq-operator-crds"]
    assert crd_role["kind"] == "ClusterRole"
    assert set(crd_role["rules"][1]["resourceNames"]) == {crds.load_crd(k)["metadata"]["name"] for k in crds.KINDS}
    bindings = {o["metadata"]["name"] for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    assert {"hooks-tidemq-operator-leader-election", "hooks-tidemq-operator-crds"} <= bindings
    off, _ = render_with_hooks(helm_python, kubeconfig, "noelect", {
        "operator": {"leaderElection": {"enabled": False}, "manageCRDs": False}, "cluster": {"enabled": False}})
    names = {o["metadata"]["name"] for o in off}
    assert not {"noelect-tidemq-operator-leader-election", "noelect-tidemq-operator-crds"} & names
    args = next(o for o in off if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-leader-election" in args and "--manage-crds" not in args
