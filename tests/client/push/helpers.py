"""Shared helpers of the push / lite-pull tests: topics, waiting, collecting listeners."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from tidemq.client import Admin, ClientConfig, Producer
from tidemq.client.push import ConsumeConcurrentlyStatus
from tidemq.message import Message, MessageExt
from tests.support.routes import wait_for_route

TEST_TIMEOUT = 40


def run(coro_fn, timeout: float = TEST_TIMEOUT):
    return asyncio.run(asyncio.wait_for(coro_fn(), timeout))


def cfg(cluster, instance: str = "DEFAULT") -> ClientConfig:
    return ClientConfig(name_servers=cluster.namesrv_addr, instance_name=instance)


async def create_topic(cluster, topic: str, queues: int = 4) -> None:
    """Create ``topic`` and wait until the name server routes all its queues."""
    async with Admin(config=cfg(cluster)) as admin:
        await admin.create_topic(topic, read_queues=queues, write_queues=queues,
                                 cluster=cluster.cluster_name)
        await wait_for_route(admin, topic, queues, interval=0.05)


async def send(cluster, topic: str, bodies: list[bytes], **kw) -> list:
    async with Producer("push-test-pg", config=cfg(cluster, "producer")) as p:
        return [await p.send(Message(topic, b, **kw)) for b in bodies]


async def wait_until(pred: Callable[[], object], timeout: float = 10.0, what: str = "condition",
                     interval: float = 0.05) -> float:
    """Wait for ``pred()`` to be truthy; return the seconds it took."""
    start = time.monotonic()
    while not pred():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)
    return time.monotonic() - start


class Collector:
    """A plain (threaded) listener that records every delivery and acknowledges it."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.msgs: list[MessageExt] = []
        self._lock = threading.Lock()

    def __call__(self, msgs: list[MessageExt]) -> ConsumeConcurrentlyStatus:
        with self._lock:
            self.msgs.extend(msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def bodies(self) -> list[bytes]:
        with self._lock:
            return [m.body for m in self.msgs]

    def __len__(self) -> int:
        return len(self.msgs)


async def committed_offsets(cluster, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets of ``topic`` by queue id, as the broker reports them."""
    from tidemq.client import Admin

    async with Admin(config=cfg(cluster, "probe")) as admin:
        progress = await admin.consumer_progress(group, topic)
    return {q.queue.queue_id: q.consumer_offset for q in progress if q.queue.topic == topic}
