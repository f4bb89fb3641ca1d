"""Steps several scenarios share: Topics and groups applied with kubectl and awaited, routes as
the name servers serve them, the no-loss check, and numbers kept for the CI artifacts."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from e2e import resources
from e2e.install import NAMESRV_SELECTOR, Deployed
from e2e.jobs import acked, received
from e2e.k8s import Kube, condition_is, conditions_text
from e2e.proc import NotYet, wait_for

log = logging.getLogger(__name__)

TOPIC_READY_TIMEOUT = 180.0


def apply_topic(kube: Kube, tidemq: Deployed, name: str, queues: int,
                timeout: float = TOPIC_READY_TIMEOUT) -> dict[str, Any]:
    """``kubectl apply`` a Topic with ``queues`` read and write queues; the Topic once Ready."""
    kube.apply(resources.topic(name, tidemq.cluster, queues, queues))
    return wait_topic(kube, name, resources.topic_ready, timeout, "Ready")


def wait_topic(kube: Kube, name: str, check: Callable[[Mapping[str, Any] | None], bool],
               timeout: float, what: str) -> dict[str, Any]:
    def seen() -> dict[str, Any]:
        obj = kube.get_or_none(resources.TOPICS, name)
        check(obj)
        assert obj is not None
        return obj

    return wait_for(seen, timeout, f"Topic {name} to be {what}", interval=2.0)


def apply_group(kube: Kube, tidemq: Deployed, name: str, timeout: float = TOPIC_READY_TIMEOUT) -> dict[str, Any]:
    kube.apply(resources.consumer_group(name, tidemq.cluster))

    def ready() -> dict[str, Any]:
        obj = kube.get_or_none(resources.GROUPS, name)
        if obj is None or not condition_is(obj, "Ready"):
            raise NotYet(conditions_text(obj or {}))
        return obj

    return wait_for(ready, timeout, f"ConsumerGroup {name} to be Ready", interval=2.0)


def route(kube: Kube, tidemq: Deployed, topic: str) -> dict[str, Any]:
    """The topic's route as a name server serves it (``tidemq admin topicRoute`` in its pod)."""
    pod = kube.items("pods", selector=NAMESRV_SELECTOR)[0]["metadata"]["name"]
    out = kube.exec(pod, ["tidemq", "admin", "topicRoute", "-n", f"127.0.0.1:{tidemq.namesrv_port}",
                          "-t", topic], container="namesrv")
    return json.loads(out)


def wait_route(kube: Kube, tidemq: Deployed, topic: str, want: Mapping[str, tuple[int, int]],
               timeout: float = 120.0) -> dict[str, tuple[int, int]]:
    """Wait until every broker's (read, write) queue counts in the route are ``want``."""
    def matches() -> dict[str, tuple[int, int]]:
        counts = resources.route_queue_counts(route(kube, tidemq, topic))
        if counts != dict(want):
            raise NotYet(f"route has {counts}")
        return counts

    return wait_for(matches, timeout, f"the route of {topic} to show {dict(want)}", interval=3.0)


def lost(producer: Mapping[str, Any], consumer: Mapping[str, Any]) -> list[int]:
    """Acknowledged ids the consumer never received, sorted."""
    return sorted(acked(producer) - received(consumer))


def record(artifacts: Path, name: str, data: Mapping[str, Any]) -> None:
    """Keep a scenario's numbers (send failures, timings) in ARTIFACTS/results/NAME.json."""
    path = artifacts / "results" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(data), indent=2, sort_keys=True), encoding="utf-8")
    log.info("%s: %s", name, json.dumps(dict(data), sort_keys=True))


def brief(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A summary without its id ranges (for messages and records)."""
    return {k: v for k, v in summary.items() if k not in ("acked", "ids", "bodies", "gave_up")}


def _pod_of(addr: str) -> str:
    """The pod a name-server address names (``tidemq-namesrv-0.tidemq-namesrv-headless.ns.svc:9876``)."""
    return addr.split(".", 1)[0].split(":", 1)[0]


def answers_without_routes_once_ready(routes: Mapping[str, Any], ready_since: Mapping[str, float],
                                      slack: float = 1.0) -> dict[str, list[float]]:
    """Per name-server address, the times it answered without a route although its pod had been
    Ready since ``ready_since[pod]`` (epoch seconds; ``slack`` covers the condition's 1 s
    resolution). A ready name server must hold routes: every list should be empty."""
    out = {}
    for addr, times in (routes.get("none_at") or {}).items():
        since = ready_since.get(_pod_of(addr))
        late = [t for t in times if since is not None and t > since + slack]
        if late:
            out[addr] = late
    return out
