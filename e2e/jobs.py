"""In-cluster producers and consumers: Kubernetes Jobs running e2e/incluster/tmqload.py in the
TideMQ image, and what they printed.

Clients run inside the cluster because brokers advertise their pod DNS names
(``POD.CLUSTER-broker-N-headless.NS.svc``), which only resolve there.

Invariants:
- The script reaches the pods through one ConfigMap (:data:`SCRIPT_CONFIGMAP`), applied by
  :meth:`LoadJobs.install` (idempotent); Jobs mount it read-only.
- A Job never retries (``backoffLimit: 0``) and carries an ``activeDeadlineSeconds`` bound, so a
  stuck client fails instead of hanging the suite; :meth:`LoadJobs.wait` is bounded as well.
- A Job's result is its ``TMQLOAD-SUMMARY`` line; a Job that failed or printed none raises
  :class:`JobFailed` with its logs.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from e2e.incluster import tmqload
from e2e.k8s import Kube
from e2e.proc import E2EError, NotYet, wait_for
from e2e.settings import E2E_DIR

log = logging.getLogger(__name__)

SCRIPT_CONFIGMAP = "tidemq-e2e-tmqload"
SCRIPT_FILE = E2E_DIR / "incluster" / "tmqload.py"
MOUNT = "/opt/tidemq-e2e"
PYTHON = "/opt/tidemq/bin/python"  # the image's virtual environment (Dockerfile: /opt/tidemq)
STOP_FILE = "/tmp/tmqload-stop"
LABEL = "tidemq.io/e2e-load"
_serial = itertools.count(1)


class JobFailed(E2EError):
    pass


def script_configmap() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": SCRIPT_CONFIGMAP, "labels": {"app.kubernetes.io/part-of": "tidemq-e2e"}},
            "data": {"tmqload.py": SCRIPT_FILE.read_text(encoding="utf-8")}}


def load_job(name: str, image: str, args: Sequence[str], deadline: int) -> dict[str, Any]:
    """A Job running ``tmqload.py ARGS`` once (pure)."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {LABEL: name, "app.kubernetes.io/part-of": "tidemq-e2e"}},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline,
            "template": {
                "metadata": {"labels": {LABEL: name}},
                "spec": {
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    "containers": [{
                        "name": "tmqload",
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": [PYTHON, f"{MOUNT}/tmqload.py"],
                        "args": list(args),
                        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                        "resources": {"requests": {"cpu": "100m", "memory": "96Mi"},
                                      "limits": {"memory": "512Mi"}},
                        "volumeMounts": [{"name": "script", "mountPath": MOUNT, "readOnly": True}],
                    }],
                    "volumes": [{"name": "script", "configMap": {"name": SCRIPT_CONFIGMAP}}],
                },
            },
        },
    }


@dataclass(frozen=True, slots=True)
class JobOutcome:
    name: str
    succeeded: bool
    logs: str
    summary: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class LoadJobs:
    """Starts and reads tmqload Jobs in ``kube.namespace`` against the name servers ``namesrv``."""

    kube: Kube
    image: str
    namesrv: str

    def install(self) -> None:
        self.kube.apply(script_configmap())

    # starting ------------------------------------------------------------------------------------
    def start(self, role: str, run: str, args: Sequence[str], deadline: int) -> str:
        name = f"tmq-{role[:4]}-{run}-{next(_serial)}"[:52]
        self.kube.create(load_job(name, self.image, [role, "--namesrv", self.namesrv, "--run", run,
                                                     "--max-seconds", str(deadline - 30), *args],
                                  deadline))
        log.info("started Job %s: %s %s", name, role, " ".join(args))
        return name

    def start_producer(self, topic: str, run: str, count: int, *extra: str, deadline: int = 900) -> str:
        return self.start("produce", run, ["--topic", topic, "--count", str(count), *extra], deadline)

    def start_consumer(self, topic: str, run: str, group: str, *extra: str, deadline: int = 900) -> str:
        return self.start("consume", run, ["--topic", topic, "--group", group, *extra], deadline)

    # reading -------------------------------------------------------------------------------------
    def pod(self, job: str) -> str:
        pods = self.kube.items("pods", selector=f"{LABEL}={job}")
        if not pods:
            raise NotYet(f"Job {job} has no pod yet")
        return str(pods[0]["metadata"]["name"])

    def logs(self, job: str) -> str:
        return self.kube.logs(self.pod(job), container="tmqload")

    def progress(self, job: str) -> Mapping[str, Any] | None:
        """The Job's last progress line; None before its container runs."""
        try:
            return tmqload.parse_progress(self.logs(job))
        except (E2EError, NotYet):
            return None  # no pod yet, or ContainerCreating (kubectl logs answers with an error)

    def stop(self, job: str) -> None:
        """Ask a producer started with ``--stop-file`` to finish (it completes in-flight sends)."""
        self.kube.exec(self.pod(job), ["touch", STOP_FILE], container="tmqload")

    def wait(self, job: str, timeout: float) -> JobOutcome:
        def finished() -> bool:
            status = self.kube.get("job", job).get("status") or {}
            if status.get("succeeded") or status.get("failed"):
                return True
            raise NotYet(f"Job {job}: active={status.get('active', 0)}")

        wait_for(finished, timeout, f"Job {job} to finish", interval=2.0)
        status = self.kube.get("job", job).get("status") or {}
        try:
            text = self.logs(job)
        except (E2EError, NotYet) as exc:  # a Job past its deadline has its pod deleted
            text = f"(no logs: {str(exc).splitlines()[0]}; Job status {status})"
        return JobOutcome(job, bool(status.get("succeeded")), text, tmqload.parse_summary(text))

    def result(self, job: str, timeout: float) -> dict[str, Any]:
        """The Job's summary; raises JobFailed (with its logs) when it failed or printed none."""
        outcome = self.wait(job, timeout)
        if not outcome.succeeded or outcome.summary is None:
            raise JobFailed(f"Job {job} {'succeeded' if outcome.succeeded else 'failed'} without a "
                            f"summary; its logs (tail):\n{outcome.logs[-6000:]}")
        return outcome.summary

    def wait_progress(self, job: str, key: str, at_least: int, timeout: float) -> int:
        """Wait until the Job's last progress line says ``key`` >= ``at_least``; returns the value."""
        def there() -> int:
            seen = self.progress(job)
            value = int((seen or {}).get(key, 0))
            if value < at_least:
                raise NotYet(f"{key}={value} (want {at_least}); last progress {seen}")
            return value

        return wait_for(there, timeout, f"Job {job} to report {key} >= {at_least}", interval=2.0)

    # both ends -----------------------------------------------------------------------------------
    def produce(self, topic: str, run: str, count: int, *extra: str, timeout: float = 600) -> dict[str, Any]:
        return self.result(self.start_producer(topic, run, count, *extra, deadline=int(timeout) + 60), timeout)

    def consume(self, topic: str, run: str, group: str, *extra: str, timeout: float = 600) -> dict[str, Any]:
        return self.result(self.start_consumer(topic, run, group, *extra, deadline=int(timeout) + 60), timeout)


def acked(summary: Mapping[str, Any]) -> set[int]:
    return tmqload.from_ranges(summary.get("acked") or [])


def received(summary: Mapping[str, Any]) -> set[int]:
    return tmqload.from_ranges(summary.get("ids") or [])
