"""The Spark scenario's pieces: the Kubeflow spark-operator, and spark/manifests adapted to the run.

:func:`e2e_objects` takes the repository's manifests (rbac.yaml, checkpoint-pvc.yaml,
tag-counts.yaml) and changes only what the e2e run must: the namespace (the run's), the
names, the image (``tidemq-spark:e2e`` loaded into kind), a ReadWriteOnce claim (kind's
local-path provisioner offers no ReadWriteMany: driver and executor share the one worker node),
one executor with a small CPU request, no restarts, and job arguments that make the streaming job
finish (``--available-now``) and write its counts to a topic a consumer Job reads back. The
RoleBinding's ServiceAccount subject moves to the run's namespace with everything else.

The operator's chart comes from its Helm repository on the internet: :func:`chart_problem` asks
for it first (``helm show chart``), so that the scenario is skipped with that reason, before the
Spark image is built, when the repository cannot be reached or no longer has the version.

Invariant: :func:`e2e_objects` is pure (manifest dicts in, new dicts out; the inputs are not
modified), so what the suite applies can be checked without a cluster.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from e2e.k8s import Kube
from e2e.proc import CommandError, NotYet, run, wait_for
from e2e.settings import ROOT

log = logging.getLogger(__name__)

MANIFESTS = ROOT / "spark" / "manifests"
MANIFEST_FILES = ("rbac.yaml", "checkpoint-pvc.yaml", "tag-counts.yaml")
CHART_CHECK_TIMEOUT = 120.0
OPERATOR_REPO = "https://kubeflow.github.io/spark-operator"
OPERATOR_NAMESPACE = "spark-operator"
OPERATOR_RELEASE = "spark-operator"
TERMINAL_STATES = ("COMPLETED", "FAILED", "SUBMISSION_FAILED")
WINDOW = "1 second"
WATERMARK = "0 seconds"


def load_manifests(folder: Path = MANIFESTS) -> list[dict[str, Any]]:
    import yaml  # noqa: PLC0415 (pyyaml: in the test extra)

    docs: list[dict[str, Any]] = []
    for name in MANIFEST_FILES:
        docs += [d for d in yaml.safe_load_all((folder / name).read_text(encoding="utf-8")) if d]
    return docs


def job_arguments(name_servers: str, topic_in: str, topic_out: str, checkpoint: str) -> list[str]:
    return ["--name-servers", name_servers, "--topic", topic_in, "--starting-offsets", "earliest",
            "--window", WINDOW, "--watermark", WATERMARK, "--available-now",
            "--shuffle-partitions", "2", "--output-topic", topic_out, "--checkpoint", checkpoint]


def e2e_objects(docs: Iterable[Mapping[str, Any]], *, namespace: str, app: str, image: str, claim: str,
                name_servers: str, topic_in: str, topic_out: str) -> list[dict[str, Any]]:
    out = []
    for doc in docs:
        obj = copy.deepcopy(dict(doc))
        obj.setdefault("metadata", {})["namespace"] = namespace
        kind = obj["kind"]
        if kind == "RoleBinding":  # the driver's ServiceAccount lives in the run's namespace too
            for subject in obj.get("subjects") or []:
                if subject.get("kind") == "ServiceAccount":
                    subject["namespace"] = namespace
        elif kind == "PersistentVolumeClaim":
            obj["metadata"]["name"] = claim
            obj["spec"]["accessModes"] = ["ReadWriteOnce"]
            obj["spec"]["resources"] = {"requests": {"storage": "1Gi"}}
        elif kind == "SparkApplication":
            obj["metadata"]["name"] = app
            spec = obj["spec"]
            spec["image"] = image
            spec["imagePullPolicy"] = "IfNotPresent"
            mount = next(m["mountPath"] for m in spec["driver"]["volumeMounts"])
            spec["arguments"] = job_arguments(name_servers, topic_in, topic_out,
                                              f"{mount}/{app}/checkpoint")
            spec["restartPolicy"] = {"type": "Never"}
            for volume in spec.get("volumes") or []:
                if "persistentVolumeClaim" in volume:
                    volume["persistentVolumeClaim"]["claimName"] = claim
            spec["executor"]["instances"] = 1
            for role in ("driver", "executor"):
                spec[role]["coreRequest"] = "250m"
        out.append(obj)
    return out


def chart_problem(version: str) -> str | None:
    """None when Helm can fetch the spark-operator chart (``version``; empty: the newest), else
    one line saying why not, for the skip reason."""
    args = ["helm", "show", "chart", "spark-operator", "--repo", OPERATOR_REPO]
    if version:
        args += ["--version", version]
    try:
        run(args, timeout=CHART_CHECK_TIMEOUT)
    except CommandError as exc:
        said = [ln.strip() for ln in (exc.stderr or exc.stdout or "").splitlines() if ln.strip()]
        why = said[-1][:200] if said else f"exit status {exc.returncode}"
        return (f"the Kubeflow spark-operator chart {version or '(newest)'} cannot be fetched from "
                f"{OPERATOR_REPO} ({why}); set TIDEMQ_E2E_SPARK_OPERATOR_VERSION to a published version")
    return None


def install_operator(kube: Kube, version: str, job_namespace: str, artifacts: Path, wait: str = "--wait") -> None:
    """``wait``: :func:`e2e.install.wait_flag` of the Helm in use."""
    log.info("helm upgrade --install the Kubeflow spark-operator %s", version or "(newest)")
    args = ["upgrade", "--install", OPERATOR_RELEASE, "spark-operator", "--repo", OPERATOR_REPO,
            "--namespace", OPERATOR_NAMESPACE, "--create-namespace",
            "--set", f"spark.jobNamespaces={{{job_namespace}}}", "--set", "webhook.enable=true",
            wait, "--timeout", "10m"]
    if version:
        args += ["--version", version]
    kube.helm(*args, timeout=900, log_file=artifacts / "helm-spark-operator.log")


def app_state(obj: Mapping[str, Any] | None) -> str:
    return str(((obj or {}).get("status") or {}).get("applicationState", {}).get("state") or "")


def wait_finished(kube: Kube, app: str, timeout: float) -> dict[str, Any]:
    """The SparkApplication once it reached a terminal state (COMPLETED, FAILED ...)."""
    def finished() -> dict[str, Any]:
        obj = kube.get_or_none("sparkapplications.sparkoperator.k8s.io", app)
        state = app_state(obj)
        if state not in TERMINAL_STATES:
            raise NotYet(f"state {state or '(none yet)'}")
        assert obj is not None
        return obj

    return wait_for(finished, timeout, f"SparkApplication {app} to finish", interval=5.0)
