"""Pod hardening (matrix row S4): every pod template the operator renders (operator/tidemq_operator/workloads.py) and
the chart's operator Deployment run non-root, read-only, without privilege escalation or
capabilities, with RuntimeDefault seccomp; broker and name-server pods get no API token.

The chart's RBAC is compared with the operator's recorded API use in
tests/operator/test_operator_integration.py (it needs the operator running against the emulator)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from click.testing import CliRunner

yaml = pytest.importorskip("yaml")

from tests.charts import test_chart  # noqa: E402
from tests.charts.test_chart import helm_python, kubeconfig  # noqa: E402,F401 (fixtures, for Helm rendering)
from tidemq.cli.operator import operator_cmd  # noqa: E402
from tidemq.cli.servers import broker_cmd, namesrv_cmd  # noqa: E402
from tidemq.operator import crds, workloads  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


def example_cluster(**spec_changes) -> dict:
    cluster = yaml.safe_load((ROOT / "crds" / "examples" / "cluster.yaml").read_text())
    cluster["metadata"].update(namespace="default", uid="00000000-0000-0000-0000-000000000001")
    cluster["spec"].update(spec_changes)
    return cluster


def check_pod(where: str, pod: dict, *, needs_api: bool) -> None:
    psc = pod.get("securityContext") or {}
    assert psc.get("runAsNonRoot") is True, where
    assert (psc.get("seccompProfile") or {}).get("type") == "RuntimeDefault", where
    assert psc.get("runAsUser", 1) != 0, where
    if not needs_api:
        assert pod.get("automountServiceAccountToken") is False, f"{where}: no API access is needed"
    writable = {v["name"] for v in pod.get("volumes", [])}
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c.get("securityContext") or {}
        cw = f"{where} container {c['name']}"
        assert sc.get("readOnlyRootFilesystem") is True, cw
        assert sc.get("allowPrivilegeEscalation") is False, cw
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], cw
        assert not sc.get("capabilities", {}).get("add"), cw
        assert sc.get("privileged") is not True, cw
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        assert mounts.get("/tmp") in writable, f"{cw}: /tmp must be a writable volume"


def test_operator_rendered_pods_are_hardened():
    objs = workloads.desired_objects(example_cluster())
    sts = [o for o in objs if o["kind"] == "StatefulSet"]
    assert {o["metadata"]["name"].rsplit("-", 1)[-1] for o in sts} >= {"namesrv"}
    assert len(sts) >= 2  # name servers and at least one broker group
    for o in sts:
        check_pod(f"StatefulSet {o['metadata']['name']}", o["spec"]["template"]["spec"], needs_api=False)
    broker = next(o for o in sts if "broker" in o["metadata"]["name"])
    mounts = {m["mountPath"] for m in broker["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert workloads.DATA_DIR in mounts  # the store lives on the PVC, not the read-only root


def test_check_pod_has_teeth():
    pod = workloads.desired_objects(example_cluster())[-1]["spec"]["template"]["spec"]
    for breaker in (
        lambda p: p["securityContext"].pop("runAsNonRoot"),
        lambda p: p.__setitem__("automountServiceAccountToken", True),
        lambda p: p["containers"][0]["securityContext"].__setitem__("readOnlyRootFilesystem", False),
        lambda p: p["containers"][0]["securityContext"]["capabilities"].__setitem__("drop", []),
        lambda p: p["securityContext"].pop("seccompProfile"),
    ):
        bad = copy.deepcopy(pod)
        breaker(bad)
        with pytest.raises(AssertionError):
            check_pod("broken", bad, needs_api=False)


def test_chart_operator_pod_is_hardened():
    """The chart's operator Deployment, from its template and default values (rendered by Helm in
    tests/charts; here the values that feed it): it needs the API, so it keeps its token."""
    values = yaml.safe_load((ROOT / "charts" / "tidemq" / "values.yaml").read_text())
    op = values["operator"]
    text = (ROOT / "charts" / "tidemq" / "templates" / "operator-deployment.yaml").read_text()
    assert "toYaml $op.podSecurityContext" in text and "toYaml $op.securityContext" in text
    assert "mountPath: /tmp" in text and "emptyDir: {}" in text
    pod = {"securityContext": op["podSecurityContext"],
           "containers": [{"name": "operator", "securityContext": op["securityContext"],
                           "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
           "volumes": [{"name": "tmp", "emptyDir": {}}]}
    check_pod("operator Deployment", pod, needs_api=True)


# -- TLS (matrix row S3): the Cluster's spec.tls reaches the pods ---------------------------------

def _container(sts: dict) -> dict:
    return sts["spec"]["template"]["spec"]["containers"][0]


def test_tls_spec_mounts_the_secret_and_passes_the_flags():
    cluster = example_cluster(tls={"mode": "enforcing", "secretName": "demo-tls", "metrics": True})
    assert crds.admit({**cluster, "apiVersion": "tidemq.io/v1alpha1", "kind": "Cluster"})[1] == []
    sts = [o for o in workloads.desired_objects(cluster) if o["kind"] == "StatefulSet"]
    for o in sts:
        c, pod = _container(o), o["spec"]["template"]["spec"]
        args = c["args"]
        assert args[args.index("--tls-mode") + 1] == "enforcing"
        assert args[args.index("--tls-cert-file") + 1] == f"{workloads.TLS_DIR}/tls.crt"
        assert args[args.index("--tls-key-file") + 1] == f"{workloads.TLS_DIR}/tls.key"
        assert args[args.index("--tls-ca-file") + 1] == f"{workloads.TLS_DIR}/ca.crt"
        assert "--metrics-tls" in args
        assert {"name": "tls", "mountPath": workloads.TLS_DIR, "readOnly": True} in c["volumeMounts"]
        assert {"name": "tls", "secret": {"secretName": "demo-tls", "defaultMode": 0o440}} in pod["volumes"]
        assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
        check_pod(o["metadata"]["name"], pod, needs_api=False)
        is_broker = c["name"] == "broker"
        assert ("--namesrv-tls" in args) is is_broker
        # every flag exists on the command the container runs (parsed, not run)
        cmd = broker_cmd if is_broker else namesrv_cmd
        parsed = CliRunner().invoke(cmd, [a.replace("$(POD_NAME)", "p").replace("$(POD_NAMESPACE)", "n")
                                          for a in args if not a.startswith("--config")
                                          and not a.startswith("/etc/tidemq/")] + ["--help"])
        assert parsed.exit_code == 0, parsed.output
    # off by default: no flags, no volume, HTTP probes
    plain = [o for o in workloads.desired_objects(example_cluster()) if o["kind"] == "StatefulSet"]
    for o in plain:
        assert "--tls-mode" not in _container(o)["args"]
        assert _container(o)["readinessProbe"]["httpGet"]["scheme"] == "HTTP"


@pytest.mark.parametrize("tls, ok", [
    ({"mode": "permissive", "secretName": "s"}, True),
    ({"mode": "disabled"}, True),
    ({"mode": "enforcing"}, False),          # no Secret
    ({"metrics": True}, False),              # no Secret
    ({"mode": "strict", "secretName": "s"}, False),  # unknown mode: refused, never a fallback
])
def test_tls_spec_is_validated_by_the_crd(tls, ok):
    cluster = example_cluster(tls=tls)
    problems = crds.admit({**cluster, "apiVersion": "tidemq.io/v1alpha1", "kind": "Cluster"})[1]
    assert (problems == []) is ok, problems


def test_chart_rendered_by_helm_hardens_the_operator_and_wires_tls(request):
    """Helm renders the chart with every option on (tests/charts/values-all.yaml: TLS permissive with
    HTTPS metrics): the operator pod is hardened, keeps its API token, and gets only ca.crt of the
    TLS Secret; the Cluster carries spec.tls; the PodMonitor scrapes over verified HTTPS."""
    pytest.importorskip("kmock")

    helm = request.getfixturevalue("helm_python")
    kube = request.getfixturevalue("kubeconfig")
    rendered = test_chart.render(helm, kube, "sec", test_chart.load_values(test_chart.VALUES_ALL))
    objs = {o["kind"]: o for o in rendered}
    operator_policy = [o for o in rendered if o["kind"] == "NetworkPolicy"
                       and o["metadata"]["name"] == objs["Deployment"]["metadata"]["name"]]
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    check_pod("operator Deployment", pod, needs_api=True)
    container = pod["containers"][0]
    assert "--tls-ca-file=/etc/tidemq-tls/ca.crt" in container["args"]
    parsed = CliRunner().invoke(operator_cmd, container["args"][1:] + ["--help"])  # every flag exists
    assert parsed.exit_code == 0, parsed.output
    tls_volume = next(v for v in pod["volumes"] if v["name"] == "tls-ca")
    assert tls_volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # never the key
    assert objs["Cluster"]["spec"]["tls"] == {"mode": "permissive", "secretName": "prod-tls", "metrics": True}
    endpoint = objs["PodMonitor"]["spec"]["podMetricsEndpoints"][0]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["ca"]["secret"]["key"] == "ca.crt"
    assert "insecureSkipVerify" not in endpoint["tlsConfig"]
    # the operator's NetworkPolicy: its pod only, ingress to the metrics and health ports only
    values = test_chart.load_values(test_chart.VALUES_ALL)
    assert len(operator_policy) == 1  # the Cluster's pods have their own (tests/charts/test_chart.py)
    policy = operator_policy[0]["spec"]
    assert policy["podSelector"]["matchLabels"] == objs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert policy["policyTypes"] == ["Ingress"]
    ports = sorted(p["port"] for rule in policy["ingress"] for p in rule["ports"])
    defaults = test_chart.load_values()["operator"]
    op = {**defaults, **values.get("operator", {})}
    assert ports == sorted([op["metricsPort"], op["healthPort"]])
