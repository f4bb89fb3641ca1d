"""The Helm chart charts/tidemq.

- Lint with the real Helm engine: helm-sdkpy (Helm's Go library, Python >= 3.12) in the separate
  virtual environment .venv-helm, created by dev.py or by the session fixture here; lint runs in a
  subprocess of that interpreter and its messages are read by Severity (1 info, 2 warning,
  3 error; helm-sdkpy returns the error text empty). Lint renders every template with the chart's
  values and checks them against values.schema.json, so the chart is linted once with its defaults
  and once with tests/charts/values-all.yaml (every option on) merged in.
- Render: helm-sdkpy has no template / dry-run action, so the chart is installed with Helm's real
  Install action into kmock's KubernetesEmulator (adapted, see the rendering section) with the
  default values and with values-all.yaml; the release manifest is parsed and every object is
  validated: built-in kinds with kubernetes-validate (strict), the tidemq.io resources with
  tidemq.operator.crds.admit (schema + CEL), ServiceMonitor/PodMonitor against the Prometheus
  operator's CRDs in ../shared/thirdparty-crds/ (used from there, not copied).
- Offline cross-checks: the RBAC rules against the kinds the operator's code creates, the values
  against the CRD schemas, the chart's CRD copies against crds/ (byte for byte).
- values.schema.json accepts the defaults and values-all.yaml and rejects wrong types (jsonschema
  here, and Helm itself through lint).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.kube import ThreadedEmulator, status_emulator
from tidemq.cli.operator import operator_cmd
from tidemq.operator import crds, replication, workloads

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "tidemq"
VALUES_ALL = Path(__file__).resolve().parent / "values-all.yaml"

LINT = """
import asyncio, json, sys
import helm_sdkpy
print(json.dumps(asyncio.run(helm_sdkpy.Lint(helm_sdkpy.Configuration()).run(sys.argv[1]))))
"""


# -- helpers ----------------------------------------------------------------------------------

def load_values(path: Path = CHART / "values.yaml") -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def merged(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def values_all() -> dict:
    return merged(load_values(), load_values(VALUES_ALL))


def values_schema() -> dict:
    return json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def helm_python() -> Path:
    """The .venv-helm interpreter with helm-sdkpy (created once when missing, as dev.py does)."""
    sys.path.insert(0, str(ROOT))
    try:
        import dev  # noqa: PLC0415
    finally:
        sys.path.remove(str(ROOT))
    problem = dev.ensure_helm_venv()
    if problem:
        pytest.skip(f"no Helm engine: {problem}")
    return dev.HELM_PY


def lint(helm_python: Path, chart: Path) -> list[dict]:
    """Helm lint messages of ``chart`` (a folder)."""
    proc = subprocess.run([str(helm_python), "-c", LINT, str(chart)], capture_output=True,
                          text=True, timeout=120, cwd=chart.parent)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["TotalChartsLinted"] == 1
    return result["Messages"] or []


def errors(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m["Severity"] >= 3]


def chart_copy(tmp_path: Path, values: dict | None = None) -> Path:
    dest = tmp_path / "tidemq"
    shutil.copytree(CHART, dest)
    if values is not None:
        (dest / "values.yaml").write_text(yaml.safe_dump(values), encoding="utf-8")
    return dest


# -- Helm lint --------------------------------------------------------------------------------

def test_lint_default_values(helm_python) -> None:
    messages = lint(helm_python, CHART)
    assert errors(messages) == []
    assert [m for m in messages if m["Severity"] == 2] == []  # no warnings either


def test_lint_every_option_on(helm_python, tmp_path) -> None:
    messages = lint(helm_python, chart_copy(tmp_path, values_all()))
    assert errors(messages) == []


@pytest.mark.parametrize("change, where", [
    (lambda v: v["cluster"]["nameServers"].__setitem__("replicas", "three"), "values.yaml"),
    (lambda v: v["operator"].__setitem__("watchAllNamespaces", "yes"), "values.yaml"),
    # more than one operator replica without leader election (the schema's if/then)
    (lambda v: v["operator"].update(replicas=2, leaderElection={**v["operator"]["leaderElection"], "enabled": False}),
     "values.yaml"),
])
def test_lint_refuses_bad_values(helm_python, tmp_path, change, where) -> None:
    values = load_values()
    change(values)
    bad = errors(lint(helm_python, chart_copy(tmp_path, values)))
    assert bad and {m["Path"] for m in bad} >= {where}


def test_lint_sees_a_broken_template(helm_python, tmp_path) -> None:
    """The lint check itself can fail: a template with a syntax error is a Severity-3 message."""
    chart = chart_copy(tmp_path)
    (chart / "templates" / "broken.yaml").write_text("kind: {{ .Values.nope | nosuchfunc }}\n")
    assert any(m["Path"].startswith("templates") for m in errors(lint(helm_python, chart)))


# -- values.yaml and values.schema.json --------------------------------------------------------

def test_schema_accepts_defaults_and_values_all() -> None:
    schema = values_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(load_values(), schema)
    jsonschema.validate(values_all(), schema)


@pytest.mark.parametrize("path, value", [
    ("image.tag", 1),
    ("image.pullPolicy", "Sometimes"),
    ("imagePullSecrets", "regcred"),
    ("operator.replicas", "two"),
    ("operator.watchAllNamespaces", "true"),
    ("operator.timerInterval", "30s"),
    ("operator.metricsPort", 70000),
    ("operator.nodeSelector", ["linux"]),
    ("operator.tolerations", {"key": "x"}),
    ("operator.leaderElection.enabled", 1),
    ("operator.leaderElection.leaseDuration", 1),
    ("operator.leaderElection.leaseName", "Not_A_Name"),
    ("operator.manageCRDs", "yes"),
    ("operator.cleanup.timeout", -1),
    ("serviceAccount.create", "no"),
    ("rbac.create", None),
    ("cluster.enabled", "true"),
    ("cluster.name", "Not_A_DNS_Name"),
    ("cluster.brokers.groups", 1.5),
    ("cluster.brokers.flushMode", "fsync"),
    ("cluster.brokers.storage.size", 10),
    ("cluster.brokers.config", ["a=b"]),
    ("topics", {"name": "orders"}),
    ("topics", [{"readQueueNums": 8}]),
    ("topics", [{"name": "orders", "readQueueNums": "8"}]),
    ("consumerGroups", [{"name": "g", "consumeEnable": "yes"}]),
    ("metrics.serviceMonitor.enabled", "yes"),
    ("metrics.podMonitor.interval", 30),
    ("networkPolicy.enabled", 1),
    ("unknownTopLevel", True),
    ("operator.unknownKey", True),
    ("operator.leaderElection.enabled", False),  # with replicas 2, below
])
def test_schema_rejects_wrong_types(path, value) -> None:
    values = load_values()
    values["operator"]["replicas"] = 2  # valid with the default leader election
    *parents, last = path.split(".")
    node = values
    for key in parents:
        node = node[key]
    node[last] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, values_schema())


def test_values_documented_line_by_line() -> None:
    """Every key in values.yaml has a comment right above it (or on its line)."""
    lines = (CHART / "values.yaml").read_text(encoding="utf-8").splitlines()
    undocumented = []
    for n, line in enumerate(lines):
        if re.match(r"^\s*[A-Za-z][\w.-]*:", line) and "#" not in line:
            above = lines[n - 1].strip() if n else ""
            if not above.startswith("#"):
                undocumented.append(f"{n + 1}: {line.strip()}")
    assert undocumented == []


def test_schema_covers_every_value() -> None:
    """No value is outside the schema (objects whose keys are free, like nodeSelector, aside)."""
    def walk(values: dict, schema: dict, path: str) -> list[str]:
        missing = []
        for key, value in values.items():
            sub = (schema.get("properties") or {}).get(key)
            if sub is None:
                missing.append(f"{path}{key}")
            elif isinstance(value, dict) and "properties" in sub:
                missing += walk(value, sub, f"{path}{key}.")
        return missing
    assert walk(load_values(), values_schema(), "") == []


# -- the values against the CRDs (what the templates put into the custom resources) ------------

def _crd_spec_schema(kind: str) -> dict:
    return crds.openapi_schema(kind)["properties"]["spec"]


def _paths(values: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in values.items():
        if isinstance(value, dict) and value and key not in ("resources", "config"):
            out += _paths(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


def test_cluster_values_are_crd_fields() -> None:
    spec = _crd_spec_schema("Cluster")
    for path in _paths({k: v for k, v in values_all()["cluster"].items() if k not in ("enabled", "name")}):
        node = spec
        for key in path.split("."):
            assert key in (node.get("properties") or {}), f"cluster.{path} is not a Cluster spec field"
            node = node["properties"][key]


# Keywords that bound a value; the values schema must bound each cluster value as the CRD does, so
# `helm install` refuses what the API server would (with the chart's message, before anything exists).
_BOUNDS = ("enum", "minimum", "maximum", "exclusiveMinimum", "pattern", "minLength", "maxLength",
           "minItems", "maxItems", "maxProperties")
# Values where "" means "leave it out" (the template drops it or fills in a default): no minLength,
# and the CRD's pattern may also match the empty string.
_EMPTY_MEANS_UNSET = {"image", "brokers.storage.storageClassName", "tls.secretName"}


def schema_disagreements(values_cluster: dict, crd_spec: dict) -> list[str]:
    """Where the values schema of `cluster` bounds a field differently from the Cluster CRD."""
    out: list[str] = []

    def walk(v: dict, c: dict, path: str) -> None:
        for key in _BOUNDS:
            want = c.get(key)
            if path in _EMPTY_MEANS_UNSET and key == "minLength":
                want = None
            if path in _EMPTY_MEANS_UNSET and key == "pattern" and want:
                want = f"^({want[1:-1]})?$"
            if v.get(key) != want:
                out.append(f"cluster.{path}: {key} is {v.get(key)!r} in values.schema.json, {want!r} in the CRD")
        for name, sub in (v.get("properties") or {}).items():
            if name == "resources":  # quantities: the CRD's pattern, the values' string|number
                continue
            crd_sub = (c.get("properties") or {}).get(name)
            if crd_sub is None:
                out.append(f"cluster.{path}.{name}: not a field of the Cluster CRD")
                continue
            walk(sub, crd_sub, f"{path}.{name}".lstrip("."))
        for nested in ("items", "additionalProperties"):
            if isinstance(v.get(nested), dict):
                walk(v[nested], c.get(nested) or {}, f"{path}[]")

    for name, sub in values_cluster["properties"].items():
        if name in ("enabled", "name"):  # the chart's own switches, metadata.name
            continue
        walk(sub, crd_spec["properties"].get(name) or {}, name)
    return out


def test_values_schema_bounds_cluster_values_as_the_crd_does() -> None:
    """brokers.replicas 1-5 (and minInSync) in both; every other bound too (issue 18, item 14:
    before, nameServers.replicas, groups, retentionHours, storageClassName and tls.secretName
    had bounds only in the CRD, so the chart accepted values the API server then refused)."""
    spec = _crd_spec_schema("Cluster")
    vals = values_schema()["properties"]["cluster"]
    assert schema_disagreements(vals, spec) == []
    brokers = vals["properties"]["brokers"]["properties"]
    assert (brokers["replicas"]["minimum"], brokers["replicas"]["maximum"]) == (1, replication.MAX_REPLICAS)
    # the comparison itself can fail
    broken = copy.deepcopy(vals)
    broken["properties"]["brokers"]["properties"]["replicas"]["maximum"] = 9
    broken["properties"]["placement"]["properties"]["antiAffinity"]["enum"] = ["preferred"]
    assert len(schema_disagreements(broken, spec)) == 2


def test_default_cluster_is_reliable_and_admitted() -> None:
    """The default Cluster flushes synchronously; a Cluster made from the values is admitted."""
    values = load_values()
    assert values["cluster"]["enabled"] is True
    assert values["cluster"]["brokers"]["flushMode"] == "sync"
    for vals in (values, values_all()):
        c = copy.deepcopy(vals["cluster"])
        c.pop("enabled")
        name = c.pop("name")
        c["image"] = c["image"] or f"{vals['image']['repository']}:{vals['image']['tag'] or '0.1.0'}"
        if not c["brokers"]["storage"]["storageClassName"]:
            del c["brokers"]["storage"]["storageClassName"]  # the template leaves it out when empty
        if c["tls"]["mode"] == "disabled" and not c["tls"]["metrics"]:
            del c["tls"]  # the template leaves it out when TLS is off
        obj = {"apiVersion": crds.API_VERSION, "kind": "Cluster", "metadata": {"name": name, "namespace": "default"},
               "spec": c}
        _obj, problems = crds.admit(obj)
        assert problems == []


@pytest.mark.parametrize("kind, key", [("Topic", "topics"), ("ConsumerGroup", "consumerGroups")])
def test_topic_and_group_values_are_admitted(kind, key) -> None:
    items = values_all()[key]
    assert items
    item_keys = set(values_schema()["properties"][key]["items"]["properties"]) - {"name"}
    assert item_keys <= set(_crd_spec_schema(kind)["properties"])
    for item in items:
        spec = {k: v for k, v in item.items() if k != "name"}
        spec["clusterRef"] = {"name": values_all()["cluster"]["name"]}
        obj = {"apiVersion": crds.API_VERSION, "kind": kind,
               "metadata": {"name": item["name"], "namespace": "default"}, "spec": spec}
        assert crds.admit(obj)[1] == []


# -- RBAC: only what the operator uses ---------------------------------------------------------

def operator_rules() -> list[dict]:
    """The rules of the `tidemq.operatorRules` template (template lines dropped, peering kept)."""
    text = (CHART / "templates" / "_helpers.tpl").read_text(encoding="utf-8")
    body = text.split('{{- define "tidemq.operatorRules" -}}', 1)[1].split("{{- end }}\n{{- end }}", 1)[0]
    return yaml.safe_load("\n".join(line for line in body.splitlines() if "{{" not in line))


def test_rbac_is_least_privilege() -> None:
    rules = operator_rules()
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert not {"deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    # deleted: a PodDisruptionBudget no longer desired (operator/tidemq_operator/budgets.py), and a
    # drained retired broker group's objects (operator/tidemq_operator/scaleinops.py); nothing else
    assert {(g, r) for g, r, v in granted if v == "delete"} == {
        ("policy", "poddisruptionbudgets"), ("apps", "statefulsets"), ("", "services"), ("", "configmaps"),
        ("", "persistentvolumeclaims")}
    groups = {g for g, _, _ in granted}
    assert groups == {"tidemq.io", "apps", "", "policy", "rbac.authorization.k8s.io", "coordination.k8s.io"}
    # Leases: exactly what the operator grants the brokers of replicated groups (a Role may only
    # grant what its creator holds); RBAC objects: created and patched, never bound by 'bind'
    assert {v for _, r, v in granted if r == "leases"} == set(replication.LEASE_VERBS)
    assert {(r, v) for g, r, v in granted if g == "rbac.authorization.k8s.io"} == {
        (r, v) for r in ("roles", "rolebindings") for v in ("create", "patch")}
    # Secrets: created (each Cluster's key, operator/tidemq_operator/clusterkey.py), never read, listed or patched
    assert {v for _, r, v in granted if r == "secrets"} == {"create"}


def test_rbac_covers_what_the_operator_creates() -> None:
    """Every kind the operator applies for a Cluster (operator/tidemq_operator/workloads.py) may be created and
    patched; StatefulSets also read; the custom resources watched and their status patched."""
    granted = {(g, r, v) for rule in operator_rules() for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    cluster = yaml.safe_load((ROOT / "crds" / "examples" / "cluster.yaml").read_text())
    cluster["metadata"]["namespace"] = "default"
    cluster["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    objs = workloads.desired_objects(cluster)
    kinds = {(o["apiVersion"].rpartition("/")[0], o["kind"]) for o in objs}
    assert kinds == {("", "Service"), ("", "ConfigMap"), ("policy", "PodDisruptionBudget"), ("apps", "StatefulSet")}
    cluster["spec"]["brokers"]["replicas"] = 3  # replicated groups add the brokers' Lease RBAC
    kinds |= {(o["apiVersion"].rpartition("/")[0], o["kind"]) for o in workloads.desired_objects(cluster)}
    assert ("", "ServiceAccount") in kinds and ("rbac.authorization.k8s.io", "RoleBinding") in kinds
    assert ("", "pods", "list") in granted  # a replicated group's pods: readiness, revision, IP
    assert ("", "secrets", "create") in granted  # the Cluster key Secret, created apart (operator/tidemq_operator/clusterkey.py)
    plural = {"Service": "services", "ConfigMap": "configmaps", "PodDisruptionBudget": "poddisruptionbudgets",
              "StatefulSet": "statefulsets", "ServiceAccount": "serviceaccounts", "Role": "roles",
              "RoleBinding": "rolebindings"}
    for group, kind in kinds:
        assert (group, plural[kind], "create") in granted and (group, plural[kind], "patch") in granted
    assert ("apps", "statefulsets", "get") in granted
    for res in ("clusters", "topics", "consumergroups"):
        for verb in ("get", "list", "watch", "patch"):  # get: each pass reads its object back
            assert ("tidemq.io", res, verb) in granted
        assert ("tidemq.io", f"{res}/status", "patch") in granted
    assert ("tidemq.io", "clusters/finalizers", "update") in granted  # blockOwnerDeletion
    assert ("", "events", "create") in granted


def test_rbac_templates_are_namespaced_by_default() -> None:
    text = (CHART / "templates" / "rbac.yaml").read_text(encoding="utf-8")
    # the full rule set goes into a ClusterRole only under watchAllNamespaces
    cluster_part, _, namespaced_part = text.partition("{{- else }}")
    assert "{{- if .Values.operator.watchAllNamespaces }}" in cluster_part
    assert 'include "tidemq.operatorRules"' in cluster_part.split("watchAllNamespaces }}", 1)[1]
    assert "kind: Role\n" in namespaced_part and "kind: RoleBinding\n" in namespaced_part
    assert load_values()["operator"]["watchAllNamespaces"] is False


# -- the operator Deployment ------------------------------------------------------------------

def test_operator_flags_exist() -> None:
    """Every flag the Deployment passes is a flag of `tidemq operator`."""
    known = {opt for p in operator_cmd.params for opt in [*p.opts, *p.secondary_opts]}
    text = (CHART / "templates" / "operator-deployment.yaml").read_text(encoding="utf-8")
    used = set(re.findall(r"^\s*- (--[a-z-]+)", text, re.M))
    assert used >= {"--liveness", "--metrics-listen", "--all-namespaces", "--namespace", "--leader-election",
                    "--no-leader-election", "--leader-lease", "--lease-duration", "--manage-crds"}
    assert used <= known, used - known
    assert "readOnlyRootFilesystem: true" in (CHART / "values.yaml").read_text()
    assert load_values()["operator"]["podSecurityContext"]["runAsUser"] == 10001  # the image's user


# -- CRDs --------------------------------------------------------------------------------------

def test_crds_never_drift_from_crds_folder() -> None:
    ours = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert ours
    in_chart = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert in_chart == ours
    for name in ours:
        assert (CHART / "crds" / name).read_bytes() == (ROOT / "crds" / name).read_bytes(), (
            f"charts/tidemq/crds/{name} differs from crds/{name}: cp crds/{name} charts/tidemq/crds/")


def test_chart_crds_are_valid_kubernetes_objects() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            kv.validate(doc, "1.30", strict=True)


# -- versions and notes ------------------------------------------------------------------------

def test_versions_match_the_project() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == version
    assert f"ARG VERSION={version}" in (ROOT / "Dockerfile").read_text()
    assert crds.openapi_schema("Cluster")["properties"]["spec"]["properties"]["image"]["default"].endswith(
        f":{version}")


def test_notes_explain_name_server_topics_and_metrics() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text(encoding="utf-8")
    assert "-namesrv" in notes and "port-forward" in notes
    assert "kind: Topic" in notes and "kubectl" in notes and "apply -f -" in notes
    assert "/metrics" in notes


def test_gitignore_has_the_helm_venv() -> None:
    assert ".venv-helm/" in (ROOT / ".gitignore").read_text().splitlines()
    assert sys.version_info >= (3, 11)


# -- rendering: Helm's Install against the kmock emulator --------------------------------------
# helm-sdkpy has no template/dry-run action; its Install renders the chart with the real Helm
# engine and sends every object to an API server. kmock 0.8's KubernetesEmulator stands in, with
# two adaptations: (1) its core discovery (/api/v1) says groupVersion "/v1", which Helm's REST
# mapper cannot match (no kind ServiceAccount in v1): fixed to "v1"; (2) a GET of a missing object
# must be a 404 (Helm GETs every object before creating it and treats any other error as one):
# tests.support.kube.status_emulator answers so. HELM_DRIVER=memory keeps the release records out
# of the emulator.

INSTALL = """
import asyncio, json, sys
import helm_sdkpy
config = helm_sdkpy.Configuration(namespace="default", kubeconfig=sys.argv[1])
values = json.loads(sys.argv[4])
result = asyncio.run(helm_sdkpy.Install(config).run(sys.argv[2], sys.argv[3], values=values, wait=False,
                                                    timeout=60))
print(json.dumps(result))
"""

THIRDPARTY_CRDS = ROOT.parent / "shared" / "thirdparty-crds"


def build_helm_emulator():
    """kmock.KubernetesEmulator adapted for Helm (see above), with the kinds the chart creates."""
    import kmock  # noqa: PLC0415

    class HelmEmulator(status_emulator()):
        async def _serve_version(self, request):
            result = await super()._serve_version(request)
            if isinstance(result, dict) and str(result.get("groupVersion", "")).startswith("/"):
                result["groupVersion"] = result["groupVersion"][1:]
            return result

    emu = HelmEmulator()
    emu.resources.load_bundled()
    verbs = {"get", "list", "watch", "create", "update", "patch", "delete"}
    custom = [("tidemq.io/v1alpha1", "clusters", "Cluster", True),
              ("tidemq.io/v1alpha1", "topics", "Topic", True),
              ("tidemq.io/v1alpha1", "consumergroups", "ConsumerGroup", True),
              ("monitoring.coreos.com/v1", "servicemonitors", "ServiceMonitor", True),
              ("monitoring.coreos.com/v1", "podmonitors", "PodMonitor", True)]
    for gv, plural, kind, namespaced in custom:
        emu.resources[f"{gv}/{plural}"] = kmock.ResourceInfo(
            kind=kind, namespaced=namespaced, singular=kind.lower(), verbs=verbs, subresources={"status"})
    return emu


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory) -> Path:
    pytest.importorskip("kmock")
    emu = ThreadedEmulator(build_helm_emulator, name="kmock-helm").start()
    path = tmp_path_factory.mktemp("helm") / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: emu\n"
        f"clusters:\n- name: emu\n  cluster:\n    server: {emu.url}\n"
        "users:\n- name: emu\n  user:\n    token: test\n"
        "contexts:\n- name: emu\n  context:\n    cluster: emu\n    user: emu\n")
    yield path
    emu.stop()


def render(helm_python: Path, kubeconfig: Path, release: str, values: dict) -> list[dict]:
    """The objects Helm renders for ``values`` (installed into the emulator)."""
    proc = subprocess.run(
        [str(helm_python), "-c", INSTALL, str(kubeconfig), release, str(CHART), json.dumps(values)],
        capture_output=True, text=True, timeout=120, cwd=CHART.parent,
        env=dict(os.environ, HELM_DRIVER="memory"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["info"]["status"] == "deployed"
    return [doc for doc in yaml.safe_load_all(result["manifest"]) if doc]


@pytest.fixture(scope="module")
def rendered(helm_python, kubeconfig) -> dict[str, list[dict]]:
    return {"default": render(helm_python, kubeconfig, "tidemq", {}),
            "all": render(helm_python, kubeconfig, "all", load_values(VALUES_ALL))}


def _thirdparty_schema(kind: str) -> dict:
    plural = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors"}[kind]
    path = THIRDPARTY_CRDS / f"monitoring.coreos.com_{plural}.yaml"
    if not path.exists():
        pytest.skip(f"{path} is missing (the Prometheus operator's CRDs are kept outside the repository)")
    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return version["schema"]["openAPIV3Schema"]


def validate_object(obj: dict) -> None:
    """Validate one rendered object as an API server would (raises AssertionError)."""
    group = obj["apiVersion"].rpartition("/")[0]
    where = f"{obj['kind']}/{obj['metadata'].get('name')}"
    if group == "tidemq.io":
        _obj, problems = crds.admit(obj)
        assert problems == [], f"{where}: {problems}"
    elif group == "monitoring.coreos.com":
        schema = crds.to_json_schema(_thirdparty_schema(obj["kind"]))
        problems = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
        assert problems == [], f"{where}: {problems}"
    else:
        kv = pytest.importorskip("kubernetes_validate")
        try:
            kv.validate(obj, "1.30", strict=True)
        except kv.ValidationError as exc:
            raise AssertionError(f"{where}: {exc}") from None


@pytest.mark.parametrize("which", ["default", "all"])
def test_rendered_objects_are_valid(rendered, which) -> None:
    objs = rendered[which]
    assert len(objs) >= 8
    for obj in objs:
        validate_object(obj)


def test_validation_catches_a_bad_object(rendered) -> None:
    """The validators above can fail: break one object of each family."""
    objs = {o["kind"]: o for o in rendered["all"]}
    bad = copy.deepcopy(objs["Deployment"])
    bad["spec"]["replicas"] = "two"
    with pytest.raises(AssertionError):
        validate_object(bad)
    bad = copy.deepcopy(objs["Cluster"])
    bad["spec"]["brokers"]["flushMode"] = "fsync"
    with pytest.raises(AssertionError):
        validate_object(bad)
    bad = copy.deepcopy(objs["ServiceMonitor"])
    bad["spec"]["endpoints"] = "metrics"
    with pytest.raises(AssertionError):
        validate_object(bad)


def test_render_default(rendered) -> None:
    objs = rendered["default"]
    kinds = sorted(o["kind"] for o in objs)
    # the operator's Role, the leader election's; the discovery ClusterRole, the CRD upgrades'
    assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding",
                            "Role", "Role", "RoleBinding", "RoleBinding", "Service", "Deployment", "Cluster"])
    by_kind = {o["kind"]: o for o in objs if not o["metadata"]["name"].endswith(("-leader-election", "-crds"))}
    cluster = by_kind["Cluster"]
    assert cluster["metadata"]["name"] == "tidemq"
    assert cluster["spec"]["brokers"]["flushMode"] == "sync"
    assert "storageClassName" not in cluster["spec"]["brokers"]["storage"]
    # the full rule set is namespaced; the ClusterRole is discovery-only (read CRDs, namespaces)
    assert by_kind["Role"]["metadata"]["namespace"] == "default"
    cluster_rules = by_kind["ClusterRole"]["rules"]
    assert {r for rule in cluster_rules for r in rule["resources"]} == {"customresourcedefinitions", "namespaces"}
    assert {v for rule in cluster_rules for v in rule["verbs"]} == {"list", "watch"}
    pod = by_kind["Deployment"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/tidemq/tidemq:0.1.0"
    assert container["args"][0] == "operator"
    assert "--namespace=default" in container["args"] and "--leader-election" in container["args"]
    assert "--leader-lease=tidemq-operator" in container["args"] and "--manage-crds" in container["args"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert by_kind["Deployment"]["spec"]["strategy"] == {"type": "Recreate"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"health": 8080, "metrics": 9090}
    assert container["args"].count("--liveness=http://0.0.0.0:8080/healthz") == 1
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9090"
    assert pod["spec"]["serviceAccountName"] == by_kind["ServiceAccount"]["metadata"]["name"]


def test_render_everything_on(rendered) -> None:
    objs = rendered["all"]
    kinds = {o["kind"] for o in objs}
    assert {"ServiceMonitor", "PodMonitor", "NetworkPolicy", "Topic", "ConsumerGroup", "Cluster"} <= kinds
    # cluster-wide: ClusterRole + ClusterRoleBinding; the leader election's Role is in the release namespace
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Role"] == ["all-tidemq-operator-leader-election"]
    roles = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ClusterRole"}
    full = roles["all-tidemq-operator"]["rules"]
    assert any("statefulsets" in r["resources"] for r in full)
    deploy = next(o for o in objs if o["kind"] == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert "--all-namespaces" in args and "--leader-lease=tidemq-leader" in args and "--lease-duration=20" in args
    assert deploy["spec"]["replicas"] == 2
    # standbys are Ready: replaced one at a time behind a surge pod, an operator always running
    assert deploy["spec"]["strategy"] == {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"][0]["key"] == "dedicated" and "podAntiAffinity" in pod["affinity"]
    topics = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "Topic"}
    assert topics["orders"] == {"clusterRef": {"name": "prod"}, "readQueueNums": 16, "writeQueueNums": 16}
    assert topics["payments-fifo"]["messageType"] == "FIFO" and topics["payments-fifo"]["order"] is True
    cluster = next(o for o in objs if o["kind"] == "Cluster")
    assert cluster["spec"]["brokers"]["config"]["autoCreateTopicEnable"] == "false"
    assert cluster["spec"]["brokers"]["storage"]["storageClassName"] == "fast-ssd"
    sm = next(o for o in objs if o["kind"] == "ServiceMonitor")
    svc = next(o for o in objs if o["kind"] == "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items() | svc["spec"]["selector"].items()
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    pm = next(o for o in objs if o["kind"] == "PodMonitor")
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics" and pm["spec"]["namespaceSelector"] == {"any": True}


def test_acl_comes_from_an_existing_secret(rendered) -> None:
    """acl.enabled puts the Secret's name (never a key) into the Cluster; off by default."""
    default = next(o for o in rendered["default"] if o["kind"] == "Cluster")
    assert "acl" not in default["spec"]["brokers"]
    cluster = next(o for o in rendered["all"] if o["kind"] == "Cluster")
    assert cluster["spec"]["brokers"]["acl"] == {"secretName": "tidemq-acl", "key": "plain_acl.yml"}
    assert not any(o["kind"] == "Secret" for o in rendered["all"])  # the chart never holds the keys
    op = next(o for o in rendered["all"] if o["kind"] == "Deployment")
    env = {e["name"]: e for e in op["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TIDEMQ_OPERATOR_SECRET_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "tidemq-operator-acl", "key": "secretKey"}
    assert "value" not in env["TIDEMQ_OPERATOR_SECRET_KEY"]
    default_op = next(o for o in rendered["default"] if o["kind"] == "Deployment")
    assert "TIDEMQ_OPERATOR_ACCESS_KEY" not in repr(default_op)


def _operator(objs: list[dict]) -> dict:
    return next(o for o in objs if o["kind"] == "Deployment")["spec"]["template"]["spec"]


def test_operator_gets_the_master_key_mounted_never_in_the_chart(rendered) -> None:
    """Name-server write protection (operator/tidemq_operator/clusterkey.py): the operator creates its master key
    Secret at its first start; the chart only mounts it (optional, so the first start works) and
    tells the operator its name and namespace. The chart never renders a Secret."""
    for which, name in (("default", "tidemq-operator-cluster-key"), ("all", "tidemq-master-key")):
        pod = _operator(rendered[which])
        c = pod["containers"][0]
        assert "--cluster-key-file=/etc/tidemq-cluster-key/masterKey" in c["args"]
        assert f"--cluster-key-secret={name}" in c["args"]
        env = {e["name"]: e for e in c["env"]}
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        assert {"name": "cluster-key", "mountPath": "/etc/tidemq-cluster-key", "readOnly": True} in c["volumeMounts"]
        [vol] = [v for v in pod["volumes"] if v["name"] == "cluster-key"]
        assert vol["secret"] == {"secretName": name, "optional": True, "defaultMode": 0o440,
                                 "items": [{"key": "masterKey", "path": "masterKey"}]}
        assert not any(o["kind"] == "Secret" for o in rendered[which])
    # watched namespaces (default: the release's; values-all: all) may create the Cluster key Secrets
    roles = [o for o in rendered["default"] if o["kind"] == "Role"]
    assert any({"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]} in r["rules"] for r in roles)


def test_master_key_role_where_the_release_namespace_is_not_watched(helm_python, kubeconfig) -> None:
    objs = render(helm_python, kubeconfig, "keyns", {"operator": {"watchNamespaces": ["apps", "web"]},
                                                     "cluster": {"enabled": False}})
    roles = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs if o["kind"] == "Role"}
    key_role = roles[("default", "keyns-tidemq-operator-cluster-key")]
    assert key_role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
    binding = next(o for o in objs if o["kind"] == "RoleBinding" and o["metadata"]["name"] == key_role["metadata"]["name"])
    assert binding["roleRef"]["name"] == key_role["metadata"]["name"]
    for ns in ("apps", "web"):
        assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]} in roles[(ns, "keyns-tidemq-operator")]["rules"]
    off = render(helm_python, kubeconfig, "nokey", {"operator": {"watchNamespaces": ["apps"], "clusterKey": {"enabled": False}},
                                                    "cluster": {"enabled": False}})
    assert not any("secrets" in repr(o.get("rules")) for o in off if o["kind"] in ("Role", "ClusterRole"))
    c = _operator(off)["containers"][0]
    assert not any(a.startswith("--cluster-key") for a in c["args"])
    assert all(v["name"] != "cluster-key" for v in _operator(off)["volumes"])


def _allows(rule: dict, labels: dict) -> bool:
    """Whether an ingress rule admits a pod of the release namespace with ``labels``."""
    if "from" not in rule:
        return True
    return any(set(peer) == {"podSelector"} and peer["podSelector"].get("matchLabels", {}).items() <= labels.items()
               for peer in rule["from"])


def check_network_policies(objs: list[dict], values: dict) -> None:
    """Every name-server and broker pod the operator makes from the chart's Cluster is selected by
    one of the chart's NetworkPolicies, which opens exactly that pod's container ports: remoting
    to networkPolicy.clientsFrom (any source when empty) plus, always, the Cluster's own pods and
    the operator (brokers register with the name servers; the operator manages both)."""
    np = values["networkPolicy"]
    cluster = next(o for o in objs if o["kind"] == "Cluster")
    cluster = {**cluster, "metadata": {**cluster["metadata"], "uid": "0000-test"}}
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    operator_labels = _operator_deployment(objs)["spec"]["template"]["metadata"]["labels"]
    sets = [o for o in workloads.desired_objects(cluster) if o["kind"] == "StatefulSet"]
    assert {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in sets} == {"namesrv", "broker"}
    remoting = {}
    for sts in sets:
        template = sts["spec"]["template"]
        labels = template["metadata"]["labels"]
        chosen = [p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert len(chosen) == 1, (sts["metadata"]["name"], [p["metadata"]["name"] for p in chosen])
        spec = chosen[0]["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        opened = {port["port"] for rule in spec["ingress"] for port in rule["ports"]}
        container_ports = {p["containerPort"]: p["name"] for c in template["spec"]["containers"] for p in c["ports"]}
        assert opened == set(container_ports)
        rules = {container_ports[rule["ports"][0]["port"]]: rule for rule in spec["ingress"]}
        if np["clientsFrom"]:
            assert rules["remoting"]["from"][:len(np["clientsFrom"])] == np["clientsFrom"]
        else:
            assert "from" not in rules["remoting"]  # RocketMQ clients connect from anywhere
        assert rules["metrics"]["from"] == (np["metricsFrom"] or [{"podSelector": {}}])
        if "ha" in rules:  # followers stream from the master; nobody else needs the HA port
            assert _allows(rules["ha"], labels) and not _allows(rules["ha"], operator_labels)
        remoting[labels["app.kubernetes.io/component"]] = (rules["remoting"], labels)
    namesrv_rule, _ = remoting["namesrv"]
    broker_rule, broker_labels = remoting["broker"]
    assert _allows(namesrv_rule, broker_labels), "brokers cannot register with the name servers"
    assert _allows(namesrv_rule, operator_labels) and _allows(broker_rule, operator_labels), \
        "the operator cannot reach the name servers and brokers"
    if np["clientsFrom"]:  # and nobody else from inside the namespace
        assert not _allows(broker_rule, {"app.kubernetes.io/name": "other"})


def _operator_deployment(objs: list[dict]) -> dict:
    return next(o for o in objs if o["kind"] == "Deployment")


def test_cluster_pods_get_network_policies_for_exactly_their_ports(rendered) -> None:
    check_network_policies(rendered["all"], values_all())
    default = [o for o in rendered["default"] if o["kind"] == "NetworkPolicy"]
    assert default == []  # off unless networkPolicy.enabled


def test_the_network_policy_check_sees_a_cut_off_name_server(rendered) -> None:
    """What issue 18 found: clientsFrom replacing the allow-list cut the brokers off the name servers."""
    objs = copy.deepcopy(rendered["all"])
    ns_policy = next(o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "prod-namesrv")
    ns_policy["spec"]["ingress"][0]["from"] = values_all()["networkPolicy"]["clientsFrom"]
    with pytest.raises(AssertionError, match="cannot register"):
        check_network_policies(objs, values_all())


# Value combinations rendered by Helm besides the defaults and values-all.yaml: together they give
# every documented choice of values.yaml (each enum value and each switch; test below) at least once.
COMBOS = {
    "replicated": {
        "cluster": {"name": "repl", "brokers": {"groups": 2, "replicas": 3, "minInSync": 2, "replication": "async",
                                                "leaseSeconds": 5, "flushMode": "async"},
                    "placement": {"antiAffinity": "required", "antiAffinityTopologyKey": "topology.kubernetes.io/zone",
                                  "topologySpread": []},
                    "tls": {"mode": "enforcing", "secretName": "repl-tls"}, "metrics": {"enabled": False}},
        "networkPolicy": {"enabled": True, "clientsFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]},
        "operator": {"clusterKey": {"enabled": False}, "leaderElection": {"enabled": False}, "manageCRDs": False,
                     "cleanup": {"enabled": False}, "logLevel": "error"},
        "metrics": {"podAnnotations": False, "podMonitor": {"enabled": True}},
    },
    "open": {
        "cluster": {"name": "open", "brokers": {"replicas": 2, "replication": "sync"},
                    "placement": {"topologySpread": [{"topologyKey": "kubernetes.io/hostname",
                                                      "whenUnsatisfiable": "DoNotSchedule", "maxSkew": 2}]}},
        "networkPolicy": {"enabled": True},
        "image": {"pullPolicy": "Never"},
        "serviceAccount": {"create": False, "name": "existing"},
        "rbac": {"create": False},
        "operator": {"logLevel": "critical"},
        "topics": [{"name": "plain", "perm": "R", "messageType": "NORMAL", "order": False},
                   {"name": "later", "perm": "W", "messageType": "DELAY"},
                   {"name": "tx", "messageType": "TRANSACTION"}],
        "consumerGroups": [{"name": "all-of-it", "consumeEnable": True, "consumeBroadcastEnable": True,
                            "consumeFromMinEnable": True},
                           {"name": "paused", "consumeEnable": False, "consumeFromMinEnable": False}],
    },
    "no-cluster": {"cluster": {"enabled": False}, "networkPolicy": {"enabled": True},
                   "operator": {"watchNamespaces": ["apps"], "logLevel": "warning"}},
}


@pytest.fixture(scope="module")
def combos(helm_python, kubeconfig) -> dict[str, list[dict]]:
    return {name: render(helm_python, kubeconfig, f"combo-{name}", override) for name, override in COMBOS.items()}


def _choices(schema: dict, path: str = "") -> set[tuple[str, object]]:
    """(path, value) of every documented choice: each enum value and both sides of each switch
    (list items count under the list's path)."""
    out: set[tuple[str, object]] = set()
    if isinstance(schema.get("items"), dict):
        return _choices(schema["items"], path)
    for name, sub in (schema.get("properties") or {}).items():
        where = f"{path}{name}"
        if "enum" in sub:
            out |= {(where, v) for v in sub["enum"]}
        elif sub.get("type") == "boolean":
            out |= {(where, True), (where, False)}
        out |= _choices(sub, f"{where}.")
    return out


def _values_at(values: object, path: str) -> list:
    """The values at a dotted path; a list on the way yields each of its items' values."""
    if isinstance(values, list):
        return [v for item in values for v in _values_at(item, path)]
    if not path:
        return [values]
    key, _, rest = path.partition(".")
    return _values_at(values[key], rest) if isinstance(values, dict) and key in values else []


def test_the_combinations_cover_every_documented_choice() -> None:
    variants = [load_values(), values_all(), *(merged(load_values(), o) for o in COMBOS.values())]
    wanted = _choices(values_schema())
    assert ("cluster.placement.topologySpread.whenUnsatisfiable", "DoNotSchedule") in wanted
    seen = {(path, value) for v in variants for path, _ in wanted for value in _values_at(v, path)
            if not isinstance(value, (dict, list))}
    assert wanted - seen == set()
    replicas = {r for v in variants for r in _values_at(v, "cluster.brokers.replicas")}
    assert replicas >= {1, 2, 3}  # lone and replicated groups


@pytest.mark.parametrize("name", sorted(COMBOS))
def test_every_combination_renders_valid_objects(combos, name) -> None:
    objs, values = combos[name], merged(load_values(), COMBOS[name])
    for obj in objs:
        validate_object(obj)
    clusters = [o for o in objs if o["kind"] == "Cluster"]
    assert len(clusters) == int(values["cluster"]["enabled"])
    for cluster in clusters:  # what the operator makes of it is valid too
        cluster = {**cluster, "metadata": {**cluster["metadata"], "uid": "0000-test"}}
        for obj in workloads.desired_objects(crds.admit(cluster)[0]):
            validate_object(obj)
        assert cluster["spec"]["placement"] == values["cluster"]["placement"]
        if values["networkPolicy"]["enabled"]:
            check_network_policies(objs, values)
    assert any(o["kind"] == "NetworkPolicy" for o in objs) == values["networkPolicy"]["enabled"]


def test_the_chart_placement_reaches_the_pods(combos) -> None:
    cluster = next(o for o in combos["replicated"] if o["kind"] == "Cluster")
    objs = workloads.desired_objects({**cluster, "metadata": {**cluster["metadata"], "uid": "0000-test"}})
    pod = next(o for o in objs if o["metadata"]["name"] == "repl-broker-1" and o["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    [term] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "topology.kubernetes.io/zone" and "topologySpreadConstraints" not in pod
    budgets = {o["metadata"]["name"] for o in objs if o["kind"] == "PodDisruptionBudget"}
    assert budgets == {"repl-namesrv", "repl-broker-0", "repl-broker-1"}
    cluster = next(o for o in combos["open"] if o["kind"] == "Cluster")
    assert cluster["spec"]["placement"]["topologySpread"] == [
        {"topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule", "maxSkew": 2}]


def test_a_release_named_like_a_yaml_boolean_renders_string_labels(helm_python, kubeconfig) -> None:
    """`helm install on ...`: YAML 1.1 reads an unquoted `on` (also off, yes, no, 123) as a bool or
    a number, which an API server refuses as a label value or namespace; every one is quoted."""
    objs = render(helm_python, kubeconfig, "on", {
        "cluster": {"name": "yes"}, "networkPolicy": {"enabled": True},
        "topics": [{"name": "off"}], "consumerGroups": [{"name": "no"}]})
    assert {o["kind"] for o in objs} >= {"Cluster", "Topic", "ConsumerGroup", "NetworkPolicy"}
    for obj in objs:
        meta = obj["metadata"]
        where = f"{obj['kind']}/{meta.get('name')}"
        assert all(isinstance(v, str) for v in (meta.get("labels") or {}).values()), where
        assert isinstance(meta.get("namespace", ""), str), where
        assert isinstance(meta.get("name"), str), where
        if obj["kind"] == "Deployment":
            assert obj["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "on"
        if obj["kind"] in ("Topic", "ConsumerGroup"):
            assert obj["spec"]["clusterRef"]["name"] == "yes", where
        if obj["kind"] == "NetworkPolicy":
            for v in obj["spec"]["podSelector"].get("matchLabels", {}).values():
                assert isinstance(v, str), where
