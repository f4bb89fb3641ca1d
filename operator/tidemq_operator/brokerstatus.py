"""status.brokers of a managed Cluster from its live broker StatefulSets (pure; issue 18).

Invariants:
- A row stands for a pod the StatefulSet controller reports (``status.replicas``: ordinals
  0..n-1), never for one the spec merely asks for: a group scaled to 0 by hand, or not created yet,
  has no rows, and a group that grows shows its new pods only once they exist.
- ``version`` is the image tag a pod runs: the live template's for the pods the controller counts
  as updated (the highest ordinals, which a rolling update replaces first), otherwise what the
  last status said of that pod (its old revision's image is not in the StatefulSet), and the
  template's when there is no earlier row.
- brokerId is what the pod registers with the name servers: its ordinal for a lone broker; in a
  replicated group 0 for the master and replica id + 1 for the others (``masters``, as the
  replicas report it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tidemq.operator import rollout, workloads


def _template_version(sts: Mapping[str, Any]) -> str:
    containers = ((((sts.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or [])
    image = next((c.get("image") for c in containers if c.get("name") == "broker"), None)
    if image is None and containers:
        image = containers[0].get("image")
    return workloads.image_version(str(image or ""))


def live_brokers(cluster: dict[str, Any], live: Mapping[str, Mapping[str, Any] | None],
                 masters: Mapping[str, int | None] | None = None,
                 previous: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """One row (name, brokerId, address, version) per broker pod that exists, over the groups
    whose StatefulSet ``live`` holds (name -> API JSON, None when missing). ``previous`` is the
    last status.brokers (for the version of pods not updated yet)."""
    name, _ = workloads.cluster_identity(cluster)
    groups = int(((cluster.get("spec") or {}).get("brokers") or {}).get("groups") or 1)
    before = {str(r.get("address")): r.get("version") for r in previous if isinstance(r, Mapping)}
    rows: list[dict[str, Any]] = []
    for g in range(groups):
        broker = workloads.broker_name(name, g)
        sts = live.get(broker)
        if not sts:
            continue
        status = sts.get("status") or {}
        pods = int(status.get("replicas") or 0)
        updated = int(status.get("updatedReplicas") or 0)
        template = _template_version(sts)
        replicated = rollout.is_replicated(sts)
        for i in range(pods):
            address = workloads.broker_pod_address(cluster, g, i)
            version = template if i >= pods - updated else (before.get(address) or template)
            broker_id = (0 if (masters or {}).get(broker) == i else i + 1) if replicated else i
            rows.append({"name": broker, "brokerId": broker_id, "address": address, "version": version})
    return rows
