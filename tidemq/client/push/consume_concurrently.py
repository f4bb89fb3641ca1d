"""Concurrent consumption (RocketMQ's ConsumeMessageConcurrentlyService).

Pulled messages are cut into batches of ``batch_size`` and each batch is consumed by its own
task (listener calls bounded by the invoker). After the listener answers:

* success: the batch leaves the process queue and the queue's offset becomes the process queue's
  committable offset (the smallest message still in flight), so offsets never pass a slow message;
* "later", CLUSTERING: each message is sent back to the broker (re-delivered through
  ``%RETRY%<group>``) and then acknowledged; a message that cannot be sent back stays in the
  process queue and is consumed again locally after ``local_retry_delay`` with its reconsume
  count + 1;
* "later", BROADCASTING: the messages are dropped with a warning, as RocketMQ does;
* the queue was dropped meanwhile (rebalanced away): nothing is acknowledged; the new owner
  consumes the batch again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tidemq.client.push.consume_service import ConsumeService, ConsumeSetup
from tidemq.client.push.invoker import SKIPPED
from tidemq.client.push.process_queue import ProcessQueue
from tidemq.client.push.protocol import reset_retry_topic
from tidemq.client.push.types import succeeded
from tidemq.client.route import MessageQueue
from tidemq.message import MessageExt

log = logging.getLogger(__name__)

LOCAL_RETRY_DELAY = 5.0


class ConcurrentConsumeService(ConsumeService):
    def __init__(
        self,
        setup: ConsumeSetup,
        local_retry_delay: float = LOCAL_RETRY_DELAY,
        on_consumed: Callable[[int, int], None] | None = None,
    ) -> None:
        super().__init__(setup)
        self.local_retry_delay = local_retry_delay
        self.on_consumed = on_consumed
        self._delayed: set[asyncio.Task] = set()

    def submit(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        for i in range(0, len(msgs), self.batch_size):
            self._spawn(self._consume(mq, pq, msgs[i : i + self.batch_size]))

    async def _later(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        await asyncio.sleep(self.local_retry_delay)
        if not pq.dropped:
            self._spawn(self._consume(mq, pq, msgs))

    async def _consume(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        if pq.dropped:
            return
        reset_retry_topic(msgs, self.group)
        status = await self.invoker.call(msgs)
        if status is SKIPPED:
            return
        if pq.dropped:
            log.info("queue %s was dropped while %d message(s) were consumed; its next owner gets "
                     "them again", mq, len(msgs))
            return
        ok = succeeded(status)
        if self.on_consumed is not None:
            self.on_consumed(len(msgs) if ok else 0, 0 if ok else len(msgs))
        acked = msgs
        if not ok:
            if not self.clustering:
                for m in msgs:
                    log.warning("broadcasting consumer of group %s drops message %s it failed on "
                                "(broadcasting has no retry)", self.group, m.msg_id)
            else:
                kept = []
                for m in msgs:
                    if not await self.send_back.send(mq, m):
                        m.reconsume_times += 1
                        kept.append(m)
                if kept:
                    kept_ids = {id(m) for m in kept}
                    acked = [m for m in msgs if id(m) not in kept_ids]
                    self._spawn(self._later(mq, pq, kept), self._delayed)
        offset = pq.remove_messages(acked)
        if offset >= 0 and not pq.dropped:
            self.offset_store.update(mq, offset, increase_only=True)

    async def close(self, timeout: float) -> None:
        """Let in-flight batches finish for up to ``timeout`` seconds, then cancel the rest.
        Local retries still waiting are cancelled at once (their messages were not
        acknowledged, so the queue's next owner gets them)."""
        for t in list(self._delayed):
            t.cancel()
        cancelled = await self._finish(timeout)
        if cancelled:
            log.warning("group %s: %d consume task(s) still running after %g s were cancelled; "
                        "their messages will be delivered again", self.group, cancelled, timeout)
