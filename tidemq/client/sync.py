"""Blocking facades over the asyncio clients, for scripts and Spark executors.

Each facade owns one private event loop running in a daemon thread and the async client living
in it (:mod:`tidemq.client.facade`); every method submits a coroutine to that loop and waits for
its result. ``close()`` closes the client and then stops and joins the loop thread. The facades
are safe to call from any thread except their own loop thread (which would deadlock and is
refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidemq.client.admin import Admin
from tidemq.client.config import ClientConfig
from tidemq.client.consumer import PullConsumer
from tidemq.client.facade import SyncFacade, blocking
from tidemq.client.producer import (
    DEFAULT_REQUEST_TIMEOUT,
    ExceptionCallback,
    Producer,
    SuccessCallback,
)
from tidemq.client.route import MessageQueue
from tidemq.client.selectors import QueueSelector
from tidemq.message import Message


class SyncProducer(SyncFacade):
    """Blocking :class:`~tidemq.client.producer.Producer`."""

    _thread_name = "tidemq-producer"
    _client: Producer

    def __init__(self, group: str, name_servers: str | Sequence[str] | None = None,
                 config: ClientConfig | None = None, *,
                 send_latency_fault_enable: bool = True) -> None:
        super().__init__(Producer(group, name_servers, config,
                                  send_latency_fault_enable=send_latency_fault_enable))

    @property
    def group(self) -> str:
        return self._client.group

    send = blocking(Producer.send)
    send_oneway = blocking(Producer.send_oneway)
    send_batch = blocking(Producer.send_batch)
    send_batches = blocking(Producer.send_batches)
    request = blocking(Producer.request)

    def send_async(self, msg: Message, on_success: SuccessCallback | None = None,
                   on_exception: ExceptionCallback | None = None,
                   queue: MessageQueue | None = None, selector: QueueSelector | None = None,
                   arg: Any = None, timeout: float | None = None) -> None:
        """Start a send and return at once; the callbacks run in the producer's loop thread."""
        async def start() -> None:
            self._client.send_async(msg, on_success, on_exception, queue, selector, arg, timeout)
        self._run(start())

    def request_with_callback(self, msg: Message, on_success: SuccessCallback | None = None,
                              on_exception: ExceptionCallback | None = None,
                              timeout: float = DEFAULT_REQUEST_TIMEOUT,
                              queue: MessageQueue | None = None,
                              selector: QueueSelector | None = None, arg: Any = None) -> None:
        """Start a request and return at once; the callbacks run in the producer's loop thread."""
        async def start() -> None:
            self._client.request_with_callback(msg, on_success, on_exception, timeout, queue,
                                               selector, arg)
        self._run(start())


class SyncPullConsumer(SyncFacade):
    """Blocking :class:`~tidemq.client.consumer.PullConsumer`."""

    _thread_name = "tidemq-consumer"
    _client: PullConsumer

    def __init__(self, group: str, name_servers: str | Sequence[str] | None = None,
                 config: ClientConfig | None = None) -> None:
        super().__init__(PullConsumer(group, name_servers, config))

    @property
    def group(self) -> str:
        return self._client.group

    fetch_queues = blocking(PullConsumer.fetch_queues)
    pull = blocking(PullConsumer.pull)
    pull_raw = blocking(PullConsumer.pull_raw)
    committed_offset = blocking(PullConsumer.committed_offset)
    commit = blocking(PullConsumer.commit)
    max_offset = blocking(PullConsumer.max_offset)
    min_offset = blocking(PullConsumer.min_offset)
    search_offset = blocking(PullConsumer.search_offset)


class SyncAdmin(SyncFacade):
    """Blocking :class:`~tidemq.client.admin.Admin`."""

    _thread_name = "tidemq-admin"

    def __init__(self, name_servers: str | Sequence[str] | None = None,
                 config: ClientConfig | None = None) -> None:
        super().__init__(Admin(name_servers, config))

    cluster_info = blocking(Admin.cluster_info)
    create_topic = blocking(Admin.create_topic)
    delete_topic = blocking(Admin.delete_topic)
    topic_list = blocking(Admin.topic_list)
    topic_route = blocking(Admin.topic_route)
    topic_status = blocking(Admin.topic_status)
    update_subscription_group = blocking(Admin.update_subscription_group)
    consumer_progress = blocking(Admin.consumer_progress)
    get_consumer_list = blocking(Admin.get_consumer_list)
    query_msg_by_key = blocking(Admin.query_msg_by_key)
    query_msg_by_id = blocking(Admin.query_msg_by_id)
