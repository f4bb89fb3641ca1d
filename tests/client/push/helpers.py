"""Shared helpers of the push / lite-pull tests: client configs, sending, collecting listeners,
reading committed offsets (topics and waiting: tests/support)."""

from __future__ import annotations

import threading

from tidemq.client import Admin, ClientConfig, Producer
from tidemq.client.push import ConsumeConcurrentlyStatus
from tidemq.client.sync import SyncProducer
from tidemq.message import Message, MessageExt


def cfg(cluster, instance: str = "DEFAULT") -> ClientConfig:
    return ClientConfig(name_servers=cluster.namesrv_addr, instance_name=instance)


async def send(cluster, topic: str, bodies: list[bytes], **kw) -> list:
    async with Producer("push-test-pg", config=cfg(cluster, "producer")) as p:
        return [await p.send(Message(topic, b, **kw)) for b in bodies]


def send_sync(cluster, topic: str, bodies: list[bytes], **kw) -> list:
    """Blocking `send`, for tests that are not async."""
    with SyncProducer("push-test-pg", config=cfg(cluster, "producer")) as p:
        return [p.send(Message(topic, b, **kw)) for b in bodies]


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
    async with Admin(config=cfg(cluster, "probe")) as admin:
        progress = await admin.consumer_progress(group, topic)
    return {q.queue.queue_id: q.consumer_offset for q in progress if q.queue.topic == topic}
