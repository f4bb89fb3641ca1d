"""What a failed e2e test leaves behind: pod logs, events and the custom resources.

:func:`collect` writes, under ``dest``: ``objects.txt`` (``kubectl get`` of the workloads),
``events.txt`` (sorted by time), ``custom-resources.yaml`` (Clusters, Topics, ConsumerGroups,
SparkApplications), ``describe-pods.txt`` and ``logs/POD.CONTAINER[.previous].log`` for every
container of every pod (init containers too; ``--previous`` where a container restarted). It
returns a short text for the pytest report: events, CRs and the last lines of each log.

Invariant: collecting never raises; whatever kubectl cannot answer is noted in the output instead.
"""

from __future__ import annotations

import logging
from pathlib import Path

from e2e.k8s import Kube
from e2e.proc import E2EError

log = logging.getLogger(__name__)

REPORT_LOG_LINES = 60
CUSTOM_KINDS = ("clusters.tidemq.io", "topics.tidemq.io", "consumergroups.tidemq.io",
                "sparkapplications.sparkoperator.k8s.io")
TIMEOUT = 60.0


def _kubectl(kube: Kube, namespace: str, *args: str) -> str:
    try:
        return kube.kubectl(*args, namespace=namespace, timeout=TIMEOUT).stdout
    except E2EError as exc:
        return f"(kubectl {' '.join(args)} failed: {str(exc).splitlines()[0]})\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _containers(pod: dict) -> list[tuple[str, bool]]:
    """(container name, restarted) for init and regular containers."""
    status = pod.get("status") or {}
    statuses = {s["name"]: s for s in (status.get("initContainerStatuses") or []) +
                (status.get("containerStatuses") or [])}
    spec = pod.get("spec") or {}
    names = [c["name"] for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])]
    return [(n, int((statuses.get(n) or {}).get("restartCount") or 0) > 0) for n in names]


def _last_lines(text: str, n: int = REPORT_LOG_LINES) -> str:
    return "\n".join(text.splitlines()[-n:])


def collect_namespace(kube: Kube, namespace: str, dest: Path) -> str:
    report = [f"===== namespace {namespace} ====="]
    objects = _kubectl(kube, namespace, "get", "all,pvc,configmaps,pdb", "-o", "wide")
    _write(dest / "objects.txt", objects)
    events = _kubectl(kube, namespace, "get", "events", "--sort-by=.lastTimestamp")
    _write(dest / "events.txt", events)
    report += ["--- kubectl get all,pvc ---", objects, "--- events (last lines) ---", _last_lines(events, 80)]
    crs = []
    for kind in CUSTOM_KINDS:
        crs.append(f"# {kind}\n" + _kubectl(kube, namespace, "get", kind, "-o", "yaml"))
    _write(dest / "custom-resources.yaml", "\n".join(crs))
    report += ["--- custom resources ---", "\n".join(crs)[-20000:]]
    _write(dest / "describe-pods.txt", _kubectl(kube, namespace, "describe", "pods"))
    try:
        pods = kube.items("pods", namespace=namespace)
    except E2EError as exc:
        report.append(f"(cannot list pods: {str(exc).splitlines()[0]})")
        return "\n".join(report)
    for pod in pods:
        name = pod["metadata"]["name"]
        for container, restarted in _containers(pod):
            for previous in ((False, True) if restarted else (False,)):
                suffix = ".previous" if previous else ""
                args = ["logs", name, "-c", container] + (["--previous"] if previous else [])
                text = _kubectl(kube, namespace, *args)
                _write(dest / "logs" / f"{name}.{container}{suffix}.log", text)
                report += [f"--- logs {name}/{container}{' (previous)' if previous else ''} ---",
                           _last_lines(text)]
    return "\n".join(report)


def collect(kube: Kube, namespaces: list[str], dest: Path) -> str:
    """Dump every namespace in ``namespaces`` under ``dest``; the text for the test report."""
    parts = []
    for ns in namespaces:
        try:
            parts.append(collect_namespace(kube, ns, dest / ns))
        except Exception as exc:  # noqa: BLE001 (diagnostics must never hide the test's failure)
            log.warning("collecting diagnostics of %s failed: %s", ns, exc)
            parts.append(f"(diagnostics of namespace {ns} failed: {exc})")
    parts.append(f"(full dumps in {dest})")
    return "\n".join(parts)
