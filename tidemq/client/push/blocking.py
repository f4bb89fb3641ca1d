"""Blocking facades of PushConsumer and LitePullConsumer, for scripts and threads.

Each owns a private event loop in a daemon thread (tidemq.client.facade's machinery). A plain
listener of a SyncPushConsumer runs in the consumer's thread pool, an async one on the private
loop; neither ever runs on the caller's thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tidemq.client.config import ClientConfig
from tidemq.client.facade import SyncFacade, blocking
from tidemq.client.lite_pull import LitePullConsumer
from tidemq.client.push.push_consumer import PushConsumer
from tidemq.client.push.types import MessageListener
from tidemq.client.route import MessageQueue


class SyncPushConsumer(SyncFacade):
    """Blocking :class:`~tidemq.client.push.PushConsumer`; takes the same settings."""

    _thread_name = "tidemq-push-consumer"
    _client: PushConsumer

    def __init__(self, group: str, name_servers: str | Sequence[str] | None = None,
                 config: ClientConfig | None = None, **options: Any) -> None:
        super().__init__(PushConsumer(group, name_servers, config, **options))

    @property
    def group(self) -> str:
        return self._client.group

    subscribe = blocking(PushConsumer.subscribe)
    unsubscribe = blocking(PushConsumer.unsubscribe)

    def register_listener(self, listener: MessageListener) -> None:
        self._client.register_listener(listener)

    assigned_queues = blocking(PushConsumer.assigned_queues)
    process_queues = blocking(PushConsumer.process_queues)


class SyncLitePullConsumer(SyncFacade):
    """Blocking :class:`~tidemq.client.lite_pull.LitePullConsumer`; takes the same settings."""

    _thread_name = "tidemq-lite-pull"
    _client: LitePullConsumer

    def __init__(self, group: str, name_servers: str | Sequence[str] | None = None,
                 config: ClientConfig | None = None, **options: Any) -> None:
        super().__init__(LitePullConsumer(group, name_servers, config, **options))

    @property
    def group(self) -> str:
        return self._client.group

    subscribe = blocking(LitePullConsumer.subscribe)

    _assign = blocking(LitePullConsumer.assign)

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        self._assign(list(queues))  # the caller's iterable is read on the caller's thread

    fetch_queues = blocking(LitePullConsumer.fetch_queues)
    assignment = blocking(LitePullConsumer.assignment)
    poll = blocking(LitePullConsumer.poll)
    seek = blocking(LitePullConsumer.seek)
    seek_to_begin = blocking(LitePullConsumer.seek_to_begin)
    seek_to_end = blocking(LitePullConsumer.seek_to_end)
    committed = blocking(LitePullConsumer.committed)
    commit = blocking(LitePullConsumer.commit)
    commit_sync = commit
