"""The operator's calls to a TideMQ (or Apache RocketMQ) cluster, all through tidemq.client.Admin.

Invariants:
- Everything here is async and goes through :class:`tidemq.client.admin.Admin`; nothing imports
  the broker or the name server packages (an import-linter contract checks it).
- "The cluster" is every master broker the name servers know (``mqadmin -c`` semantics for each
  cluster they report), so an external cluster needs only its name-server addresses.
- Topic reconciliation is one pass of the pure state machine in :mod:`tidemq.operator.topics` per
  broker: idempotent, safe to repeat, never lowers read queues before they are drained. Every
  UPDATE_AND_CREATE_TOPIC carries the topic attribute ``message.type`` of the spec's messageType.
- A Topic pass reads the masters and each broker's topic table through
  :class:`tidemq.operator.adminpool.ClusterView`, copies shared by every Topic of the Cluster and
  at most one timer interval old; a step that writes is decided on a copy at most ``DECIDE_AGE``
  old, and what it writes updates the copy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidemq.client.admin import Admin
from tidemq.errors import TideMQError
from tidemq.operator import workloads
from tidemq.operator.groups import GroupSpec
from tidemq.operator.topics import (
    DEFAULT_MESSAGE_TYPE,
    MESSAGE_TYPE_ATTRIBUTE,
    Action,
    BrokerQueues,
    InvalidSpec,
    QuietPeriod,
    Step,
    TopicSpec,
    format_since,
    hold_for_routes,
    perm_name,
    plan,
    undrained_queues,
)

if TYPE_CHECKING:
    from tidemq.operator.adminpool import ClusterView

log = logging.getLogger(__name__)


class ClusterNotReady(TideMQError):
    """The cluster a resource refers to cannot be reached or has no broker yet (retry later)."""


def name_servers_of(cluster: Mapping) -> list[str]:
    """Name-server addresses of a Cluster resource (its body as a mapping).

    ``spec.external.nameServers`` for an external cluster, otherwise the in-cluster address the
    workloads module derives.
    """
    spec = cluster.get("spec") or {}
    external = spec.get("external") or {}
    if external.get("nameServers"):
        servers = external["nameServers"]
        if not isinstance(servers, list) or not all(isinstance(s, str) and s for s in servers):
            raise InvalidSpec("spec.external.nameServers must be a list of host:port strings")
        return list(servers)
    addr = workloads.name_server_address(dict(cluster))
    return [a for a in addr.split(";") if a]


@dataclass(slots=True)
class TopicReport:
    """What one reconcile pass of a topic did and saw."""

    steps: dict[str, Step] = field(default_factory=dict)  # broker name -> step taken
    brokers: list[dict] = field(default_factory=list)     # status.brokers rows

    @property
    def draining(self) -> dict[str, tuple[int, ...]]:
        return {b: s.draining for b, s in self.steps.items() if s.is_draining}


async def masters(admin: Admin) -> dict[str, str]:
    """broker name -> master address, over every cluster the name servers know."""
    try:
        info = await admin.cluster_info()
    except TideMQError as exc:
        raise ClusterNotReady(f"cannot reach the name servers: {exc}") from None
    found = info.all_master_addrs()
    if not found:
        raise ClusterNotReady("the name servers know no master broker yet")
    return dict(found)


def broker_queues(table: Mapping[str, dict], topic: str) -> BrokerQueues | None:
    """The queue counts a broker's own topic table (GET_ALL_TOPIC_CONFIG) has for ``topic``
    (None: absent). The route lags behind the broker (it registers in the background), so
    decisions use this."""
    tc = table.get(topic)
    if tc is None:
        return None
    attributes = tc.get("attributes") or {}
    return BrokerQueues(int(tc.get("readQueueNums", 0)), int(tc.get("writeQueueNums", 0)),
                        int(tc.get("perm", 6)) & 6, bool(tc.get("order", False)),
                        str(attributes.get(MESSAGE_TYPE_ATTRIBUTE) or DEFAULT_MESSAGE_TYPE))


async def _drain_state(admin: Admin, topic: str, broker: str, addr: str,
                       going: range) -> tuple[int, ...]:
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    for q in going:  # per queue: topic stats cover only the write queues
        lo[q], hi[q] = await admin.queue_offset_range(addr, topic, q)
    committed: dict[str, dict[int, int]] = {}
    for group in await admin.topic_consumer_groups(topic):
        progress = await admin.consumer_progress(group, topic)
        committed[group] = {q.queue.queue_id: q.consumer_offset for q in progress.queues
                            if q.queue.broker_name == broker}
    return undrained_queues(going, lo, hi, committed)


# A step that writes is decided on a topic table at most this old (seconds), whatever age the
# pass accepts for looking: with many Topics changed at once one fetch a second serves them all,
# and a topic someone else made meanwhile (a producer's auto-creation) is seen before a write
# could lower its read queues.
DECIDE_AGE = 1.0


async def reconcile_topic(view: ClusterView, spec: TopicSpec, quiet: QuietPeriod | None = None,
                          max_age: float = 0.0) -> TopicReport:
    """One pass: create/grow immediately, shrink write first, lower read once drained and the
    quiet period (``quiet``; default: ROUTE_GRACE from now) has passed. The masters and their
    topic tables come from ``view``, copies at most ``max_age`` seconds old (0: fetched now)."""
    quiet = quiet if quiet is not None else QuietPeriod(time.time())
    admin = view.admin
    brokers = await view.masters(max_age)
    report = TopicReport()
    for name, addr in sorted(brokers.items()):
        have = broker_queues(await view.topic_configs(addr, max_age), spec.topic_name)
        step = plan(spec, have)
        if step.action is not Action.READY and max_age > DECIDE_AGE:
            have = broker_queues(await view.topic_configs(addr, DECIDE_AGE), spec.topic_name)
            step = plan(spec, have)
        if have is not None and spec.read_queues < have.read and step.action is not Action.SHRINK_WRITE:
            undrained = await _drain_state(admin, spec.topic_name, name, addr,
                                           range(spec.read_queues, have.read))
            step = plan(spec, have, undrained)
        step = hold_for_routes(step, name, have, quiet)
        if step.writes:
            log.info("topic %s on %s (%s): %s read=%d write=%d perm=%s", spec.topic_name, name,
                     addr, step.action.value, step.read, step.write, perm_name(step.perm))
            attributes = {MESSAGE_TYPE_ATTRIBUTE: spec.message_type}
            await admin.create_topic(spec.topic_name, step.read, step.write, step.perm,
                                     spec.order, broker_addr=addr, attributes=attributes)
            view.wrote(addr, spec.topic_name, {
                "topicName": spec.topic_name, "readQueueNums": step.read, "writeQueueNums": step.write,
                "perm": step.perm, "order": spec.order, "attributes": attributes})
            after = BrokerQueues(step.read, step.write, step.perm, spec.order, spec.message_type)
        else:
            after = have if have is not None else BrokerQueues(0, 0, 0)
        report.steps[name] = step
        report.brokers.append({
            "name": name, "address": addr, "readQueueNums": after.read,
            "writeQueueNums": after.write, "perm": perm_name(after.perm),
        })
        if step.is_draining and step.quiet_since is not None:  # the next pass's QuietPeriod.since
            report.brokers[-1]["drainingSince"] = format_since(step.quiet_since)
    return report


async def delete_topic(admin: Admin, topic: str) -> list[str]:
    """Delete ``topic`` on every master of every cluster, then from the name servers."""
    info = await admin.cluster_info()
    done: list[str] = []
    for cluster in sorted(info.cluster_addr_table):
        if info.master_addrs(cluster):
            done += await admin.delete_topic(topic, cluster)
    return done


async def update_group(view: ClusterView, spec: GroupSpec, max_age: float = 0.0) -> list[str]:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP on every master broker (the masters from ``view``, a
    copy at most ``max_age`` seconds old). A broker stores an unchanged group without a write."""
    admin = view.admin
    brokers = await view.masters(max_age)
    done = await asyncio.gather(*(
        admin.update_subscription_group(spec.group_name, broker_addr=addr, **spec.admin_kwargs())
        for addr in sorted(brokers.values())
    ))
    return [a for part in done for a in part]


async def group_lag(view: ClusterView, group: str, max_age: float = 0.0) -> tuple[dict[str, int], list[str]]:
    """(lag per topic = sum of max offset minus committed offset, consumer client ids online),
    from the masters of ``view`` (a copy at most ``max_age`` seconds old)."""
    admin = view.admin
    progress = await admin.consumer_progress(group, broker_addrs=list((await view.masters(max_age)).values()))
    lag: dict[str, int] = {}
    for q in progress.queues:
        lag[q.queue.topic] = lag.get(q.queue.topic, 0) + max(0, q.lag)
    online: set[str] = set()
    for topic in sorted(lag):
        try:
            online.update(await admin.get_consumer_list(group, topic))
        except TideMQError as exc:  # no consumer online answers an error on some servers
            log.debug("consumer list of %s on %s: %s", group, topic, exc)
    return lag, sorted(online)
