"""What a replicated broker group (``spec.brokers.replicas`` > 1, issue 17) adds to its workloads.

Pure functions used by :mod:`tidemq.operator.workloads`; no Kubernetes client. For a Cluster ``c``
with a replicated group ``c-broker-i``:

- each pod of the group's StatefulSet is one replica; its replica id is the pod's ordinal, read
  from the label ``apps.kubernetes.io/pod-index`` through the downward API (Kubernetes >= 1.28)
  and passed as ``--replica-id $(REPLICA_ID)``, with ``--coordination kubernetes``,
  ``--min-in-sync``, ``--replication`` and ``--lease-seconds``;
- the broker's HA port (listen port + 1, RocketMQ's convention and the broker's default
  ``--ha-listen``) is a container port and a port of the group's headless Service: the master
  registers ``<pod DNS name>:<port + 1>`` with the name servers and followers connect there;
- the pods run under the ServiceAccount ``c-broker`` with its token mounted (the Lease store reads
  it); the Role ``c-broker-leases`` (bound by the RoleBinding of the same name) grants exactly the
  ``coordination.k8s.io`` leases verbs of the election, in the Cluster's namespace only;
- the StatefulSet's RollingUpdate ``partition`` starts at ``replicas`` (no pod is replaced by the
  controller on its own): :mod:`tidemq.operator.grouproll` lowers it one pod at a time, followers
  first, the master after a switchover;
- the PodDisruptionBudget allows ``replicas - minInSync`` pods away at once. With
  ``minInSync == replicas`` that is 0: a node drain waits rather than make the group refuse
  writes (lower ``minInSync``, or accept the wait).

Invariants: with ``replicas == 1`` nothing here applies (no ``--coordination``, no token, no
RBAC objects), so lone brokers keep exactly the objects they had; ``1 <= minInSync <= replicas``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidemq.errors import ConfigError

POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
REPLICA_ID_ENV = "REPLICA_ID"
# What the broker's Lease store (tidemq.broker.ha.kubernetes) does: GET a Lease, POST one, PATCH
# it (compare-and-swap, renewal, revoke), watch it; list for a watch's start. It never PUTs or
# DELETEs one (a lapsed lease is read as absent, nothing is removed), so update/delete are not granted.
LEASE_VERBS = ("get", "list", "watch", "create", "patch")
MAX_REPLICAS = 5


@dataclass(frozen=True, slots=True)
class ReplicationSpec:
    """``spec.brokers``' replication fields with the operator's defaults applied."""

    replicas: int
    min_in_sync: int
    replication: str   # "sync" | "async"
    lease_seconds: int

    @property
    def replicated(self) -> bool:
        return self.replicas > 1

    @property
    def max_unavailable(self) -> int:
        """Pods of the group that may be away at once without leaving fewer than minInSync."""
        return self.replicas - self.min_in_sync


def replication_spec(brokers: dict[str, Any]) -> ReplicationSpec:
    """The replication settings of a defaulted ``spec.brokers``; ConfigError when they do not fit
    (the CRD refuses the same, this covers API servers without CEL and emulators)."""
    replicas = int(brokers.get("replicas", 1))
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ConfigError(f"spec.brokers.replicas is {replicas}: a broker group has 1 to {MAX_REPLICAS} replicas")
    min_in_sync = int(brokers.get("minInSync") or min(2, replicas))
    if not 1 <= min_in_sync <= replicas:
        raise ConfigError(f"spec.brokers.minInSync is {min_in_sync} but the group has {replicas} replica(s): "
                          "set it between 1 and spec.brokers.replicas")
    mode = str(brokers.get("replication") or "sync")
    if mode not in ("sync", "async"):
        raise ConfigError(f"spec.brokers.replication is {mode!r}: use sync or async")
    return ReplicationSpec(replicas, min_in_sync, mode, int(brokers.get("leaseSeconds") or 10))


def ha_port(listen_port: int) -> int:
    """The broker's replication port: listen port + 1 (the broker's default ``--ha-listen``)."""
    return listen_port + 1


def service_account_name(cluster_name: str) -> str:
    """The ServiceAccount of a Cluster's replicated broker pods (also its Role and RoleBinding)."""
    return f"{cluster_name}-broker"


def role_name(cluster_name: str) -> str:
    return f"{cluster_name}-broker-leases"


def broker_args(spec: ReplicationSpec) -> list[str]:
    """The broker's replica options (the CLI flags of ``tidemq broker``)."""
    return ["--coordination", "kubernetes", "--replica-id", f"$({REPLICA_ID_ENV})",
            "--min-in-sync", str(spec.min_in_sync), "--replication", spec.replication,
            "--lease-seconds", str(spec.lease_seconds)]


def replica_id_env() -> dict[str, Any]:
    """REPLICA_ID = the pod's ordinal, from the label the StatefulSet controller sets."""
    return {"name": REPLICA_ID_ENV, "valueFrom": {"fieldRef": {
        "apiVersion": "v1", "fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}}}


def rbac_objects(metadata: Any, cluster_name: str) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding of the replicated broker pods. ``metadata(name)``
    returns the owned metadata (namespace, labels, owner reference) of an object ``name``."""
    sa = service_account_name(cluster_name)
    role = role_name(cluster_name)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(sa),
         "automountServiceAccountToken": False},  # the pods opt in; nothing else gets the token
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": metadata(role),
         "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                    "verbs": list(LEASE_VERBS)}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": metadata(role),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": metadata(sa)["namespace"]}]},
    ]


def apply_to_broker(spec: ReplicationSpec, cluster_name: str, listen_port: int, container: dict[str, Any],
                    pod_spec: dict[str, Any], sts_spec: dict[str, Any], headless: dict[str, Any]) -> None:
    """Turn a lone broker's container, pod, StatefulSet and headless Service into a replica's
    (in place; nothing when the group is not replicated)."""
    if not spec.replicated:
        return
    container["args"] += broker_args(spec)
    container["env"].append(replica_id_env())
    container["ports"].append({"name": "ha", "containerPort": ha_port(listen_port), "protocol": "TCP"})
    headless["spec"]["ports"].append({"name": "ha", "port": ha_port(listen_port), "targetPort": "ha",
                                      "protocol": "TCP"})
    pod_spec["serviceAccountName"] = service_account_name(cluster_name)
    pod_spec["automountServiceAccountToken"] = True  # the Lease store authenticates with it
    # The controller replaces no pod by itself: tidemq.operator.grouproll lowers the partition.
    sts_spec["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"partition": spec.replicas}}
