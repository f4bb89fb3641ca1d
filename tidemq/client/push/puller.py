"""QueuePuller: the long-polling pull loop of one owned queue (one asyncio task per queue).

The loop asks its host for permission before each pull (flow control, orderly locks, pauses:
the host answers a delay), sends PULL_MESSAGE with SUSPEND | SUBSCRIPTION (| COMMIT_OFFSET when a
committed offset is known and piggy-backing is on), and follows ``nextBeginOffset`` whatever the
status:

* FOUND: hand the (tag-filtered) messages to the host, pull again at once;
* NO_NEW_MSG / NO_MATCHED_MSG: when nothing of the queue is cached, record ``nextBeginOffset``
  as consumed (it skips filtered-out messages), pull again;
* OFFSET_ILLEGAL: the broker moved us (queue truncated or offset beyond its end): forget the
  cache, commit ``nextBeginOffset`` and continue from there;
* an error: wait ``error_backoff`` seconds (3 s as in RocketMQ) and try again. A connection
  error or timeout also re-reads the topic's route at once and then once per refresh interval
  during the back-off (the instance's bounded FaultRefresher, issue 17): as soon as it names a new
  address to read the queue's broker group from (a new master, or a follower while the group has
  none registered), the pull goes there without waiting out the back-off.

Pulls go to the group's master, or, while the route names none (a failover in progress), to its
lowest-id follower (ClientInstance.queue_read_addr), which serves what it holds replicated; the
next pull after the route names a master again goes back to it.

The loop ends when its process queue is dropped or its task is cancelled; a pull answered after
the drop is discarded (its messages are pulled again by the queue's next owner).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

from tidemq.client.heartbeat import Subscription
from tidemq.client.instance import ClientInstance
from tidemq.client.pull import PullStatus, build_pull_request, parse_pull_response, parse_tag_expression
from tidemq.client.push.broker_api import ConsumerBrokerApi
from tidemq.client.push.offset_store import OffsetStore, ReadOffsetType
from tidemq.client.push.process_queue import ProcessQueue
from tidemq.client.route import MessageQueue
from tidemq.errors import RemotingError, TideMQError
from tidemq.message import MessageExt

log = logging.getLogger(__name__)

ERROR_BACKOFF = 3.0
FLOW_CONTROL_DELAY = 0.05


@dataclass(frozen=True, slots=True)
class PullSettings:
    batch_size: int = 32
    suspend_ms: int = 15000
    commit_offset: bool = True  # piggy-back the committed offset (clustering only)
    error_backoff: float = ERROR_BACKOFF


class PullHost(Protocol):
    group: str
    instance: ClientInstance
    api: ConsumerBrokerApi
    offset_store: OffsetStore

    def subscription(self, topic: str) -> Subscription | None: ...
    async def pull_gate(self, puller: "QueuePuller") -> float: ...
    def deliver(self, puller: "QueuePuller", msgs: list[MessageExt]) -> None: ...
    def on_caught_up(self, puller: "QueuePuller", next_offset: int) -> None: ...


class QueuePuller:
    def __init__(self, host: PullHost, mq: MessageQueue, pq: ProcessQueue, next_offset: int,
                 settings: PullSettings) -> None:
        self.host = host
        self.mq = mq
        self.pq = pq
        self.next_offset = next_offset
        self.settings = settings
        self.previously_locked = True  # orderly: False until the first pull under a fresh lock
        self.pulls = 0

    async def run(self) -> None:
        mq, pq, s = self.mq, self.pq, self.settings
        inst = self.host.instance
        log.debug("pulling %s of group %s from offset %d", mq, self.host.group, self.next_offset)
        while not pq.dropped:
            delay = await self.host.pull_gate(self)
            if pq.dropped:
                break
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            sub = self.host.subscription(mq.topic)
            if sub is None:  # unsubscribed: the next rebalance drops the queue
                await asyncio.sleep(s.error_backoff)
                continue
            commit = None
            if s.commit_offset:
                committed = await self.host.offset_store.read(mq, ReadOffsetType.MEMORY)
                commit = committed if committed > 0 else None
            cmd = build_pull_request(self.host.group, mq, self.next_offset, s.batch_size,
                                     sub.expression, s.suspend_ms, sub.sub_version, commit)
            pq.mark_pulled()
            pulled_from = inst.routes.read_addr(mq.broker_name)
            try:
                addr = await inst.queue_read_addr(mq)
                resp = await inst.invoke(addr, cmd, inst.config.request_timeout + s.suspend_ms / 1000)
                result = parse_pull_response(resp, mq, parse_tag_expression(sub.expression), addr)
            except TideMQError as exc:
                if pq.dropped:
                    break
                log.warning("pull of %s (group %s, offset %d) failed, retrying in %g s: %s", mq,
                            self.host.group, self.next_offset, s.error_backoff, exc)
                waited = 0.0
                if isinstance(exc, RemotingError):
                    started = asyncio.get_running_loop().time()
                    if await self._follow(pulled_from):
                        continue
                    waited = asyncio.get_running_loop().time() - started
                await asyncio.sleep(max(0.0, s.error_backoff - waited))
                continue
            self.pulls += 1
            if pq.dropped:
                break
            status = result.status
            if status is PullStatus.FOUND:
                self.next_offset = result.next_begin_offset
                if result.messages:
                    self.host.deliver(self, result.messages)
            elif status in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
                self.next_offset = result.next_begin_offset
                if not pq.has_messages():
                    self.host.on_caught_up(self, result.next_begin_offset)
            else:  # OFFSET_ILLEGAL
                log.warning("offset %d of %s (group %s) is illegal (queue holds %d..%d); "
                            "continuing from %d", self.next_offset, mq, self.host.group,
                            result.min_offset, result.max_offset, result.next_begin_offset)
                self.next_offset = result.next_begin_offset
                pq.clear()
                self.host.offset_store.update(mq, result.next_begin_offset, increase_only=False)
                await self.host.offset_store.persist(mq)
        log.debug("stopped pulling %s of group %s", mq, self.host.group)

    async def _follow(self, failed_addr: str | None) -> bool:
        """After a connection error or timeout: re-read the route (bounded refreshes, one per
        ``fault_route_refresh_interval`` at most) for up to the error back-off; True as soon as it
        names another address to read the queue's broker group from (a new master, or a follower
        while it has none). The name servers may still list a master killed a moment ago: they
        drop it when they see its connection close, so one look right after the fault is not
        enough to stay within a failover's time."""
        inst, loop = self.host.instance, asyncio.get_running_loop()
        until = loop.time() + self.settings.error_backoff
        while True:
            refresh = inst.refresh_route_after_fault(self.mq.topic)
            if refresh is not None:
                try:
                    await asyncio.wait_for(asyncio.shield(refresh), max(0.0, until - loop.time()))
                except asyncio.TimeoutError:
                    return False
            addr = inst.routes.read_addr(self.mq.broker_name)
            if addr is not None and addr != failed_addr:
                role = "master" if addr == inst.routes.master_addr(self.mq.broker_name) else \
                    "follower (no master registered)"
                log.info("broker %s is now read from its %s %s (was %s): pulling %s of group %s there",
                         self.mq.broker_name, role, addr, failed_addr, self.mq, self.host.group)
                return True
            now = loop.time()
            if now >= until:
                return False
            await asyncio.sleep(min(inst.config.fault_route_refresh_interval, until - now))
