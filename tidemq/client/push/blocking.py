"""Blocking facades of PushConsumer and LitePullConsumer, for scripts and threads.

Each owns a private event loop in a daemon thread (tidemq.client.sync's machinery). A plain
listener of a SyncPushConsumer runs in the consumer's thread pool, an async one on the private
loop; neither ever runs on the caller's thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tidemq.client.config import ClientConfig
from tidemq.client.lite_pull import LitePullConsumer
from tidemq.client.push.push_consumer import PushConsumer
from tidemq.client.push.types import MessageListener, ProcessQueueStats
from tidemq.client.route import MessageQueue
from tidemq.client.sync import _SyncClient
from tidemq.message import MessageExt


class SyncPushConsumer(_SyncClient):
    """Blocking :class:`~tidemq.client.push.PushConsumer`; takes the same keyword settings."""

    _thread_name = "tidemq-push-consumer"

    def __init__(self, group: str, name_servers: str | Sequence[str] | None = None,
                 config: ClientConfig | None = None, **settings: Any) -> None:
        self._consumer = PushConsumer(group, name_servers, config, **settings)
        super().__init__()

    @property
    def group(self) -> str:
        return self._consumer.group

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._run(_call(self._consumer.subscribe, topic, expression))

    def unsubscribe(self, topic: str) -> None:
        self._run(_call(self._consumer.unsubscribe, topic))

    def register_listener(self, listener: MessageListener) -> None:
        self._consumer.register_listener(listener)

    def start(self) -> None:
        self._run(self._consumer.start())

    async def _close_async(self) -> None:
        await self._consumer.close()

    def assigned_queues(self, topic: str | None = None) -> list[MessageQueue]:
        return self._run(_call(self._consumer.assigned_queues, topic))

    def process_queues(self) -> dict[MessageQueue, ProcessQueueStats]:
        return self._run(_call(self._consumer.process_queues))


class SyncLitePullConsumer(_SyncClient):
    """Blocking :class:`~tidemq.client.lite_pull.LitePullConsumer`."""

    _thread_name = "tidemq-lite-pull"

    def __init__(self, group: str, name_servers: str | Sequence[str] | None = None,
                 config: ClientConfig | None = None, **settings: Any) -> None:
        self._consumer = LitePullConsumer(group, name_servers, config, **settings)
        super().__init__()

    @property
    def group(self) -> str:
        return self._consumer.group

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._run(_call(self._consumer.subscribe, topic, expression))

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        self._run(_call(self._consumer.assign, list(queues)))

    def start(self) -> None:
        self._run(self._consumer.start())

    async def _close_async(self) -> None:
        await self._consumer.close()

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        return self._run(self._consumer.fetch_queues(topic))

    def assignment(self) -> list[MessageQueue]:
        return self._run(_call(self._consumer.assignment))

    def poll(self, timeout: float | None = None) -> list[MessageExt]:
        return self._run(self._consumer.poll(timeout))

    def seek(self, mq: MessageQueue, offset: int) -> None:
        self._run(self._consumer.seek(mq, offset))

    def seek_to_begin(self, mq: MessageQueue) -> None:
        self._run(self._consumer.seek_to_begin(mq))

    def seek_to_end(self, mq: MessageQueue) -> None:
        self._run(self._consumer.seek_to_end(mq))

    def committed(self, mq: MessageQueue) -> int:
        return self._run(self._consumer.committed(mq))

    def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        self._run(self._consumer.commit(offsets))

    commit_sync = commit


async def _call(fn: Any, *args: Any) -> Any:
    """Run a plain method on the private loop (the consumer's state belongs to that thread)."""
    return fn(*args)
