"""The tidemq.io objects the scenarios apply, and what "ready" means for them (pure functions).

Readiness as the operator writes it (operator/tidemq_operator/handlers.py):
- Cluster: condition Ready=True (reason AllReady: every StatefulSet settled with the desired spec
  hash) for the current ``metadata.generation`` (conditions carry ``observedGeneration``);
- Topic: Ready=True (reason Reconciled) with ``status.observedGeneration`` = generation; while a
  shrink waits for consumers, Ready=False and Draining=True (reason Draining);
- ConsumerGroup: Ready=True, and ``status.totalLag`` / ``status.consumersOnline`` refreshed by the
  operator's timer (the ``Lag`` and ``Consumers`` printer columns of ``kubectl get tmqg``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from e2e.k8s import condition, condition_is, conditions_text
from e2e.proc import NotYet

API_VERSION = "tidemq.io/v1alpha1"
CLUSTERS = "clusters.tidemq.io"
TOPICS = "topics.tidemq.io"
GROUPS = "consumergroups.tidemq.io"


def topic(name: str, cluster: str, read: int, write: int, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Topic",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "tidemq-e2e"}},
            "spec": {"clusterRef": {"name": cluster}, "readQueueNums": read, "writeQueueNums": write,
                     **extra}}


def consumer_group(name: str, cluster: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ConsumerGroup",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "tidemq-e2e"}},
            "spec": {"clusterRef": {"name": cluster}, **extra}}


def _generation(obj: Mapping[str, Any]) -> int | None:
    return (obj.get("metadata") or {}).get("generation")


def cluster_ready(obj: Mapping[str, Any] | None) -> bool:
    """Raise NotYet (saying why) unless the Cluster is Ready for its current generation."""
    if obj is None:
        raise NotYet("the Cluster does not exist")
    ready = condition(obj, "Ready")
    gen = _generation(obj)
    if not ready or ready.get("status") != "True":
        raise NotYet(conditions_text(obj))
    if gen is not None and (ready.get("observedGeneration") or 0) < gen:
        raise NotYet(f"Ready is for generation {ready.get('observedGeneration')}, spec is at {gen}")
    return True


def topic_ready(obj: Mapping[str, Any] | None) -> bool:
    if obj is None:
        raise NotYet("the Topic does not exist")
    status = obj.get("status") or {}
    if (status.get("observedGeneration") or 0) < (_generation(obj) or 0):
        raise NotYet(f"status is for generation {status.get('observedGeneration')}")
    if not condition_is(obj, "Ready"):
        raise NotYet(conditions_text(obj))
    return True


def topic_draining(obj: Mapping[str, Any] | None) -> bool:
    if obj is None:
        raise NotYet("the Topic does not exist")
    if not condition_is(obj, "Draining"):
        raise NotYet(conditions_text(obj))
    return True


def topic_queue_counts(obj: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """Broker name -> (read, write) as the Topic's status reports it."""
    return {b["name"]: (int(b["readQueueNums"]), int(b["writeQueueNums"]))
            for b in (obj.get("status") or {}).get("brokers") or []}


def route_queue_counts(route: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """Broker name -> (read, write) from ``tidemq admin topicRoute`` JSON."""
    return {q["brokerName"]: (int(q["readQueueNums"]), int(q["writeQueueNums"]))
            for q in route.get("queueDatas") or []}
