"""What the concurrent and orderly consume services share (RocketMQ's ConsumeMessageService): the
listener invoker, the offset store, send-back, and the consume tasks they own.

A consume task that fails is logged once (it never takes the consumer down); ``_finish`` stops
consumption, lets running tasks end for a bounded time and cancels the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass

from tidemq.client.push.invoker import ListenerInvoker
from tidemq.client.push.offset_store import OffsetStore
from tidemq.client.push.send_back import SendBack
from tidemq.client.tasks import finish_or_cancel, keep

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConsumeSetup:
    """The parts of a push consumer both consume services work with."""

    group: str
    invoker: ListenerInvoker
    offset_store: OffsetStore
    send_back: SendBack
    batch_size: int  # messages per listener call
    clustering: bool


class ConsumeService:
    _task_name = "consume task"  # for the log

    def __init__(self, setup: ConsumeSetup) -> None:
        self.group = setup.group
        self.invoker = setup.invoker
        self.offset_store = setup.offset_store
        self.send_back = setup.send_back
        self.batch_size = setup.batch_size
        self.clustering = setup.clustering
        self._tasks: set[asyncio.Task] = set()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def _spawn(self, coro: Awaitable[object], tasks: set[asyncio.Task] | None = None) -> None:
        keep(self._tasks if tasks is None else tasks, coro).add_done_callback(self._log_failure)

    def _log_failure(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s of group %s failed", self._task_name, self.group, exc_info=task.exception())

    async def _finish(self, timeout: float) -> int:
        """Start no new listener call; wait up to ``timeout`` seconds for the consume tasks, then
        cancel the rest. Returns how many were cancelled."""
        self.invoker.closing = True
        return await finish_or_cancel(self._tasks, timeout)
