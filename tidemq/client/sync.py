"""Blocking facades over the asyncio clients, for scripts and Spark executors.

Each facade owns one private event loop running in a daemon thread and the async client living
in it; every method submits a coroutine to that loop and waits for its result. ``close()`` closes
the client and then stops and joins the loop thread. The facades are safe to call from any thread
except their own loop thread (which would deadlock and is refused).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from tidemq.client.admin import Admin
from tidemq.client.admin_protocol import ConsumerProgress, TopicOffset
from tidemq.client.config import ClientConfig
from tidemq.client.consumer import PullConsumer
from tidemq.client.producer import (
    DEFAULT_REQUEST_TIMEOUT,
    ExceptionCallback,
    Producer,
    QueueSelector,
    SuccessCallback,
)
from tidemq.client.pull import PullResult
from tidemq.client.route import ClusterInfo, MessageQueue, TopicRouteData
from tidemq.client.send import SendResult
from tidemq.errors import ClientError
from tidemq.message import Message, MessageExt

T = TypeVar("T")
_ids = itertools.count(1)
JOIN_TIMEOUT = 5.0


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._stopped = False
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-{next(_ids)}", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._stopped:
            coro.close()
            raise ClientError("this client is closed; create a new one")
        if threading.current_thread() is self._thread:
            coro.close()
            raise ClientError("blocking client called from its own loop thread (would deadlock)")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(JOIN_TIMEOUT)
        if not self._thread.is_alive():
            self.loop.close()


class _SyncClient:
    _thread_name = "tidemq-sync"

    def __init__(self) -> None:
        self._lt = _LoopThread(self._thread_name)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._lt.run(coro)

    async def _close_async(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Close the client and stop its loop thread. Idempotent."""
        if self._lt._stopped:
            return
        try:
            self._run(self._close_async())
        finally:
            self._lt.stop()

    def __enter__(self):
        self.start()  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncProducer(_SyncClient):
    """Blocking :class:`~tidemq.client.producer.Producer`."""

    _thread_name = "tidemq-producer"

    def __init__(self, group: str, name_servers: str | Sequence[str] | None = None,
                 config: ClientConfig | None = None, *,
                 send_latency_fault_enable: bool = True) -> None:
        self._producer = Producer(group, name_servers, config,
                                  send_latency_fault_enable=send_latency_fault_enable)
        super().__init__()

    @property
    def group(self) -> str:
        return self._producer.group

    def start(self) -> None:
        self._run(self._producer.start())

    async def _close_async(self) -> None:
        await self._producer.close()

    def send(self, msg: Message, queue: MessageQueue | None = None,
             selector: QueueSelector | None = None, arg: Any = None,
             timeout: float | None = None) -> SendResult:
        return self._run(self._producer.send(msg, queue, selector, arg, timeout))

    def send_oneway(self, msg: Message, queue: MessageQueue | None = None,
                    selector: QueueSelector | None = None, arg: Any = None) -> None:
        self._run(self._producer.send_oneway(msg, queue, selector, arg))

    def send_batch(self, msgs: Sequence[Message], queue: MessageQueue | None = None,
                   timeout: float | None = None) -> SendResult:
        return self._run(self._producer.send_batch(msgs, queue, timeout))

    def send_batches(self, msgs: Sequence[Message], queue: MessageQueue | None = None,
                     timeout: float | None = None) -> list[SendResult]:
        return self._run(self._producer.send_batches(msgs, queue, timeout))

    def send_async(self, msg: Message, on_success: SuccessCallback | None = None,
                   on_exception: ExceptionCallback | None = None,
                   queue: MessageQueue | None = None, selector: QueueSelector | None = None,
                   arg: Any = None, timeout: float | None = None) -> None:
        """Start a send and return at once; the callbacks run in the producer's loop thread."""
        async def start() -> None:
            self._producer.send_async(msg, on_success, on_exception, queue, selector, arg, timeout)
        self._run(start())

    def request(self, msg: Message, timeout: float = DEFAULT_REQUEST_TIMEOUT,
                queue: MessageQueue | None = None, selector: QueueSelector | None = None,
                arg: Any = None) -> MessageExt:
        return self._run(self._producer.request(msg, timeout, queue, selector, arg))

    def request_with_callback(self, msg: Message, on_success: SuccessCallback | None = None,
                              on_exception: ExceptionCallback | None = None,
                              timeout: float = DEFAULT_REQUEST_TIMEOUT,
                              queue: MessageQueue | None = None,
                              selector: QueueSelector | None = None, arg: Any = None) -> None:
        """Start a request and return at once; the callbacks run in the producer's loop thread."""
        async def start() -> None:
            self._producer.request_with_callback(msg, on_success, on_exception, timeout, queue,
                                                 selector, arg)
        self._run(start())


class SyncPullConsumer(_SyncClient):
    """Blocking :class:`~tidemq.client.consumer.PullConsumer`."""

    _thread_name = "tidemq-consumer"

    def __init__(self, group: str, name_servers: str | Sequence[str] | None = None,
                 config: ClientConfig | None = None) -> None:
        self._consumer = PullConsumer(group, name_servers, config)
        super().__init__()

    @property
    def group(self) -> str:
        return self._consumer.group

    def start(self) -> None:
        self._run(self._consumer.start())

    async def _close_async(self) -> None:
        await self._consumer.close()

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        return self._run(self._consumer.fetch_queues(topic))

    def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32, expression: str = "*",
             suspend_ms: int = 0, timeout: float | None = None) -> PullResult:
        return self._run(self._consumer.pull(mq, offset, max_nums, expression, suspend_ms, timeout))

    def committed_offset(self, mq: MessageQueue) -> int | None:
        return self._run(self._consumer.committed_offset(mq))

    def commit(self, mq: MessageQueue, offset: int) -> None:
        self._run(self._consumer.commit(mq, offset))

    def max_offset(self, mq: MessageQueue) -> int:
        return self._run(self._consumer.max_offset(mq))

    def min_offset(self, mq: MessageQueue) -> int:
        return self._run(self._consumer.min_offset(mq))

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._run(self._consumer.search_offset(mq, timestamp_ms))


class SyncAdmin(_SyncClient):
    """Blocking :class:`~tidemq.client.admin.Admin`."""

    _thread_name = "tidemq-admin"

    def __init__(self, name_servers: str | Sequence[str] | None = None,
                 config: ClientConfig | None = None) -> None:
        self._admin = Admin(name_servers, config)
        super().__init__()

    def start(self) -> None:
        self._run(self._admin.start())

    async def _close_async(self) -> None:
        await self._admin.close()

    def cluster_info(self) -> ClusterInfo:
        return self._run(self._admin.cluster_info())

    def create_topic(self, topic: str, read_queues: int = 8, write_queues: int = 8, perm: int = 6,
                     order: bool = False, cluster: str | None = None,
                     broker_addr: str | None = None) -> list[str]:
        return self._run(self._admin.create_topic(topic, read_queues, write_queues, perm, order,
                                                  cluster, broker_addr))

    def delete_topic(self, topic: str, cluster: str) -> list[str]:
        return self._run(self._admin.delete_topic(topic, cluster))

    def topic_list(self) -> list[str]:
        return self._run(self._admin.topic_list())

    def topic_route(self, topic: str) -> TopicRouteData:
        return self._run(self._admin.topic_route(topic))

    def topic_status(self, topic: str) -> list[TopicOffset]:
        return self._run(self._admin.topic_status(topic))

    def update_subscription_group(self, group: str, cluster: str | None = None,
                                  broker_addr: str | None = None, consume_enable: bool = True,
                                  consume_broadcast_enable: bool = True, retry_max_times: int = 16,
                                  retry_queue_nums: int = 1,
                                  consume_from_min_enable: bool = True) -> list[str]:
        return self._run(self._admin.update_subscription_group(
            group, cluster, broker_addr, consume_enable, consume_broadcast_enable,
            retry_max_times, retry_queue_nums, consume_from_min_enable))

    def consumer_progress(self, group: str, topic: str | None = None) -> ConsumerProgress:
        return self._run(self._admin.consumer_progress(group, topic))

    def get_consumer_list(self, group: str, topic: str) -> list[str]:
        return self._run(self._admin.get_consumer_list(group, topic))

    def query_msg_by_key(self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0,
                         end_ms: int | None = None) -> list[MessageExt]:
        return self._run(self._admin.query_msg_by_key(topic, key, max_num, begin_ms, end_ms))

    def query_msg_by_id(self, topic: str | None, msg_id: str) -> MessageExt:
        return self._run(self._admin.query_msg_by_id(topic, msg_id))
