"""The executor's pulls: an event loop owned by the reading thread, and one pull sent ahead.

Spark runs a data source's ``read`` in one thread of a Python worker and iterates the generator
between Arrow batches. A :class:`ReaderLoop` is that thread's asyncio loop with a started async
:class:`~tidemq.client.consumer.PullConsumer` in it. The thread drives the loop itself, once per
Arrow batch (:meth:`ReaderLoop.run`, ~38 pulls of 256 KiB for 8192 rows of 1 KiB), so a pull
costs no hand-over to another thread. (Through the blocking facade, whose loop runs in a thread
of its own, a 256 KiB pull cost 93-108 us of client time against 22-36 us awaited on the caller's
loop: docs/benchmarks.md, "Client codecs and the Spark executor's decode".) While Spark holds a
batch the loop is idle; the client's background work (heartbeats, route refreshes) runs with the
next batch.

Invariants:

- A loop is only run by the thread that made it: :func:`tidemq.spark.brokers.read_slice` keeps one
  ReaderLoop per (process, thread), so two threads never run one loop, and a forked child never
  uses its parent's.
- A reader sends the next pull (:meth:`ReaderLoop.send`) as soon as an answer says where it
  starts, before decoding that answer, so the broker serves it while the worker decodes and Spark
  takes the batch: at most one pull per slice is in flight beyond the one awaited. A pull whose
  start the decode then proves wrong is cancelled (:meth:`ReaderLoop.cancel`) and its answer never
  read (the connection drops answers nobody waits for).
- A connection the broker closed while the loop was idle (its idle timeout) is seen as soon as
  the loop runs again, before the next pull is written (the close is read in the same turn that
  starts the pull), so the pull goes out on a new connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from tidemq.client.config import ClientConfig
from tidemq.client.consumer import PullConsumer
from tidemq.client.facade import new_event_loop
from tidemq.client.pull import RawPullResult
from tidemq.client.route import MessageQueue

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Pull:
    """A pull from ``offset``, sent or about to be (its request leaves when the loop next turns)."""

    offset: int
    task: asyncio.Task[RawPullResult]


class ReaderLoop:
    """An event loop and a started async pull consumer, driven by the thread that reads."""

    def __init__(self, group: str, config: ClientConfig) -> None:
        self.loop = new_event_loop()
        self.consumer = PullConsumer(group, config=config)
        self._sent: set[asyncio.Task[RawPullResult]] = set()  # answers not taken yet
        self._running: set[asyncio.Task[RawPullResult]] = set()  # not done (cancelled ones too)
        try:
            self.loop.run_until_complete(self.consumer.start())
        except BaseException:
            self.loop.close()
            raise

    @property
    def in_flight(self) -> int:
        """Pulls sent whose answers nobody has taken (:meth:`answer`) or dropped yet."""
        return len(self._sent)

    def run(self, coro: Awaitable[T]) -> T:
        """Run the loop until ``coro`` is done (from the thread that owns this reader)."""
        return self.loop.run_until_complete(coro)

    def send(self, mq: MessageQueue, offset: int, max_nums: int, expression: str) -> Pull:
        """Start a pull; the caller lets the loop turn (``await asyncio.sleep(0)``) to send it
        before doing anything long."""
        task = self.loop.create_task(self.consumer.pull_raw(mq, offset, max_nums, expression))
        self._sent.add(task)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return Pull(offset, task)

    async def answer(self, pull: Pull) -> RawPullResult:
        """``pull``'s answer (the client's errors are raised as they are)."""
        self._sent.discard(pull.task)
        return await pull.task

    def cancel(self, pull: Pull) -> None:
        """Forget a pull sent ahead; its answer, if one comes, is dropped by the connection."""
        task = pull.task
        self._sent.discard(task)
        if self.loop.is_closed():  # the reader was dropped after a failure: its tasks went with it
            return
        if not task.done():
            task.cancel()  # takes effect when the loop next runs
        elif not task.cancelled():
            task.exception()  # seen: an error of a pull nobody needs is not worth a log line

    def close(self) -> None:
        """Close the consumer and the loop (from a thread not running it). Idempotent."""
        loop = self.loop
        if loop.is_closed():
            return
        try:
            left = list(self._running)
            self._sent.clear()
            for t in left:
                t.cancel()
            loop.run_until_complete(self._close(left))
        finally:
            loop.close()

    async def _close(self, left: list[asyncio.Task[RawPullResult]]) -> None:
        await asyncio.gather(*left, return_exceptions=True)
        await self.consumer.close()


__all__ = ["Pull", "ReaderLoop"]
