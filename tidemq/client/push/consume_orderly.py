"""Orderly consumption (RocketMQ's ConsumeMessageOrderlyService).

At most one consume task per queue runs at a time (the process queue's ``consuming`` flag starts
one, a per-queue asyncio lock serialises it with queue removal). The task takes messages in
offset order, ``batch_size`` at a time, and in CLUSTERING only while this client holds the
queue's broker lock (reference 6.7; a lock older than 30 s no longer counts: the task re-locks
or waits). After the listener answers:

* SUCCESS: the taken messages are committed (offset = highest taken + 1);
* SUSPEND_CURRENT_QUEUE_A_MOMENT (or an exception): the same messages are delivered again after
  ``suspend_time`` with their reconsume count + 1, locally, nothing is sent to the broker; once
  a message has been re-delivered ``max_reconsume_times`` times it is sent back with delay level
  -1 (straight to ``%DLQ%<group>``) and skipped; if that send fails it is suspended again.

Invariant: the listener never sees a message of a queue before every lower offset of that queue
has been acknowledged (or parked in the DLQ) by this client.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tidemq.client.push.consume_service import ConsumeService, ConsumeSetup
from tidemq.client.push.invoker import SKIPPED
from tidemq.client.push.process_queue import ProcessQueue
from tidemq.client.push.protocol import reset_retry_topic
from tidemq.client.push.send_back import DLQ_DELAY_LEVEL
from tidemq.client.push.types import succeeded
from tidemq.client.route import MessageQueue
from tidemq.client.send import PROPERTY_RECONSUME_TIME
from tidemq.message import MessageExt

log = logging.getLogger(__name__)

SUSPEND_TIME = 1.0
RELOCK_RETRY = 1.0


class OrderlyConsumeService(ConsumeService):
    _task_name = "orderly consume task"

    def __init__(
        self,
        setup: ConsumeSetup,
        lock_queues: Callable[[list[MessageQueue]], Awaitable[set[MessageQueue]]],
        max_reconsume_times: int,
        suspend_time: float = SUSPEND_TIME,
    ) -> None:
        super().__init__(setup)
        self.lock_queues = lock_queues
        self.max_reconsume_times = max_reconsume_times
        self.suspend_time = suspend_time
        self._locks: dict[MessageQueue, asyncio.Lock] = {}

    def consume_lock(self, mq: MessageQueue) -> asyncio.Lock:
        lock = self._locks.get(mq)
        if lock is None:
            lock = self._locks[mq] = asyncio.Lock()
        return lock

    def forget(self, mq: MessageQueue) -> None:
        lock = self._locks.get(mq)
        if lock is not None and not lock.locked():
            del self._locks[mq]

    def submit(self, mq: MessageQueue, pq: ProcessQueue, dispatch: bool) -> None:
        if not dispatch:
            return
        self._spawn(self._run(mq, pq))

    async def _run(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        while not pq.dropped:
            pause = await self._step(mq, pq)
            if pause is None:
                return
            if pause > 0:
                await asyncio.sleep(pause)

    async def _step(self, mq: MessageQueue, pq: ProcessQueue) -> float | None:
        """One batch under the queue's consume lock: None when the task should end, else how
        long to pause before the next step."""
        async with self.consume_lock(mq):
            if pq.dropped or self.invoker.closing:
                return None
            if self.clustering and not pq.lock_valid():
                if mq in await self.lock_queues([mq]):
                    pq.set_locked(True)
                else:
                    pq.set_locked(False)
                    return RELOCK_RETRY
                if pq.dropped:
                    return None
            msgs = pq.take_messages(self.batch_size)
            if not msgs:
                return None
            reset_retry_topic(msgs, self.group)
            status = await self.invoker.call(msgs)
            if status is SKIPPED or pq.dropped:
                pq.make_message_to_consume_again(msgs)
                return None
            if succeeded(status):
                self._commit(mq, pq)
                return 0.0
            again = await self._reconsume_or_park(mq, msgs)
            if again:
                pq.make_message_to_consume_again(again)
                return self.suspend_time
            self._commit(mq, pq)
            return 0.0

    def _commit(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        offset = pq.commit()
        if offset >= 0:
            self.offset_store.update(mq, offset, increase_only=False)

    async def _reconsume_or_park(self, mq: MessageQueue,
                                 msgs: list[MessageExt]) -> list[MessageExt]:
        """The messages to deliver again; the others went to the DLQ."""
        again = []
        for m in msgs:
            if m.reconsume_times >= self.max_reconsume_times:
                m.properties[PROPERTY_RECONSUME_TIME] = str(m.reconsume_times)
                if await self.send_back.send(mq, m, DLQ_DELAY_LEVEL):
                    log.warning("orderly consumer of group %s gave up on message %s after %d "
                                "attempts; it is in the dead-letter queue", self.group, m.msg_id,
                                m.reconsume_times + 1)
                    continue
            m.reconsume_times += 1
            again.append(m)
        return again

    async def close(self, timeout: float) -> None:
        """Finish the batches being consumed (up to ``timeout`` seconds), start no new one."""
        cancelled = await self._finish(timeout)
        if cancelled:
            log.warning("group %s: %d orderly consume task(s) still running after %g s were "
                        "cancelled", self.group, cancelled, timeout)
