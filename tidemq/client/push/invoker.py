"""Calling the user's listener: async listeners on the loop, plain ones in a thread pool.

At most ``concurrency`` listener calls run at once (a semaphore; the pool has as many threads),
so user code may block without stalling the event loop or the pull loops. A listener that raises
answers "later" (RECONSUME_LATER / SUSPEND); the exception is logged once, here. A listener that
returns None (forgot the return) also answers "later", as in RocketMQ, with one warning per
consumer.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from concurrent.futures import ThreadPoolExecutor

from tidemq.client.push.types import AnyStatus, MessageListener
from tidemq.message import MessageExt

log = logging.getLogger(__name__)

SKIPPED = object()  # call() answer when the consumer closed before the listener could run


class ListenerInvoker:
    def __init__(self, listener: MessageListener, concurrency: int, name: str) -> None:
        self.listener = listener
        self.name = name
        self._is_async = _is_async(listener)
        self._semaphore = asyncio.Semaphore(concurrency)
        self._pool: ThreadPoolExecutor | None = None
        if not self._is_async:
            self._pool = ThreadPoolExecutor(max_workers=concurrency,
                                            thread_name_prefix=f"tidemq-consume-{name}")
        self._warned_none = False
        self.closing = False
        self.calls = 0
        self.failures = 0

    async def call(self, msgs: list[MessageExt]) -> AnyStatus | object:
        """The listener's answer, or SKIPPED when the consumer began closing before a slot
        was free (the messages stay unacknowledged)."""
        async with self._semaphore:
            if self.closing:
                return SKIPPED
            self.calls += 1
            try:
                if self._pool is not None:
                    loop = asyncio.get_running_loop()
                    result = await loop.run_in_executor(self._pool, self.listener, msgs)
                else:
                    result = self.listener(msgs)
                if inspect.isawaitable(result):
                    result = await result
            except asyncio.CancelledError:
                raise
            except Exception:
                self.failures += 1
                log.warning("listener of %s raised on %d message(s) (first %s of %s#%d offset %d); "
                            "they will be consumed again later", self.name, len(msgs),
                            msgs[0].msg_id, msgs[0].topic, msgs[0].queue_id, msgs[0].queue_offset,
                            exc_info=True)
                return None
        if result is None and not self._warned_none:
            self._warned_none = True
            log.warning("listener of %s returned None; that means 'consume again later'. Return "
                        "ConsumeConcurrentlyStatus.CONSUME_SUCCESS (or ConsumeOrderlyStatus."
                        "SUCCESS) to acknowledge", self.name)
        return result

    def shutdown(self) -> None:
        """Stop the pool without waiting: a listener still blocked keeps its thread until it
        returns, and its result is ignored."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _is_async(fn: object) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)
    return call is not None and inspect.iscoroutinefunction(call)
