"""Settings of an e2e run, read from the environment in this one place.

| variable | default | meaning |
|---|---|---|
| TIDEMQ_E2E_CLUSTER | tidemq-e2e | kind cluster name (kubectl context ``kind-<name>``) |
| TIDEMQ_E2E_REUSE | 0 | 1: use the kind cluster of that name if it exists (create it otherwise); never delete it |
| TIDEMQ_E2E_KEEP | 0 | 1: do not delete the kind cluster at the end (for debugging) |
| TIDEMQ_E2E_IMAGE | (build) | a prebuilt TideMQ image to use instead of ``docker build`` (tagged tidemq:e2e) |
| TIDEMQ_E2E_SPARK_IMAGE | (build) | a prebuilt ``--target spark`` image (tagged tidemq-spark:e2e) |
| TIDEMQ_E2E_NODE_IMAGE | kind's default | kindest/node image, e.g. kindest/node:v1.31.0 |
| TIDEMQ_E2E_NAMESPACE | tidemq-e2e | namespace of the Helm release and of every test object |
| TIDEMQ_E2E_ARTIFACTS | e2e-artifacts | folder for build logs and failure dumps (pod logs, events, CRs) |
| TIDEMQ_E2E_SPARK_OPERATOR_VERSION | 2.5.2 | Kubeflow spark-operator chart version (empty: the newest) |
| TIDEMQ_E2E_TEST_TIMEOUT | 2400 | pytest-timeout of each e2e test, seconds (the first one also sets the cluster up) |

Invariant: nothing else under e2e/ reads these variables (the commands run get the caller's
environment unchanged, plus KUBECONFIG for kubectl and helm).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
E2E_DIR = Path(__file__).resolve().parent
IMAGE = "tidemq:e2e"
IMAGE_NEXT = "tidemq:e2e-2"  # a retagged copy: the rolling-upgrade scenario changes the Cluster to it
SPARK_IMAGE = "tidemq-spark:e2e"
RELEASE = "tidemq"
CLUSTER = "tidemq"  # cluster.name in values-e2e.yaml
KIND_CONFIG = E2E_DIR / "kind-config.yaml"
VALUES = E2E_DIR / "values-e2e.yaml"
CHART = ROOT / "charts" / "tidemq"


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class Settings:
    cluster_name: str = "tidemq-e2e"
    reuse: bool = False
    keep: bool = False
    prebuilt_image: str | None = None
    prebuilt_spark_image: str | None = None
    node_image: str | None = None
    namespace: str = "tidemq-e2e"
    artifacts: Path = ROOT / "e2e-artifacts"
    spark_operator_version: str = "2.5.2"
    test_timeout: float = 2400.0

    @property
    def delete_cluster_at_end(self) -> bool:
        return not (self.keep or self.reuse)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        artifacts = Path(env.get("TIDEMQ_E2E_ARTIFACTS") or ROOT / "e2e-artifacts")
        return cls(
            cluster_name=env.get("TIDEMQ_E2E_CLUSTER") or "tidemq-e2e",
            reuse=_flag(env, "TIDEMQ_E2E_REUSE"),
            keep=_flag(env, "TIDEMQ_E2E_KEEP"),
            prebuilt_image=env.get("TIDEMQ_E2E_IMAGE") or None,
            prebuilt_spark_image=env.get("TIDEMQ_E2E_SPARK_IMAGE") or None,
            node_image=env.get("TIDEMQ_E2E_NODE_IMAGE") or None,
            namespace=env.get("TIDEMQ_E2E_NAMESPACE") or "tidemq-e2e",
            artifacts=artifacts if artifacts.is_absolute() else ROOT / artifacts,
            spark_operator_version=env.get("TIDEMQ_E2E_SPARK_OPERATOR_VERSION", "2.5.2"),
            test_timeout=float(env.get("TIDEMQ_E2E_TEST_TIMEOUT") or 2400),
        )
