"""The `tidemq local --demo` walk-through: create a topic, send, consume, print what happened."""

from __future__ import annotations

import time

import click

from tidemq.client import Admin, Producer, PullConsumer
from tidemq.message import Message

DEMO_TOPIC = "demo"


async def run_demo(namesrv: str, count: int = 5) -> None:
    async with Admin(name_servers=[namesrv]) as admin:
        brokers = await admin.create_topic(DEMO_TOPIC, read_queues=4, write_queues=4, cluster="DefaultCluster")
        click.echo(f"demo: created topic {DEMO_TOPIC!r} (4 queues) on {', '.join(brokers)}")
    async with Producer("demo-producer", name_servers=[namesrv]) as producer:
        for i in range(count):
            msg = Message(DEMO_TOPIC, f"hello from tidemq #{i}".encode(), tags="demo", keys=f"key-{i}")
            r = await producer.send(msg)
            click.echo(f"demo: sent #{i} -> queue {r.message_queue.queue_id} offset {r.queue_offset} id {r.msg_id}")
    received = 0
    async with PullConsumer("demo-consumer", name_servers=[namesrv]) as consumer:
        deadline = time.monotonic() + 10
        for mq in await consumer.fetch_queues(DEMO_TOPIC):
            offset = await consumer.committed_offset(mq) or 0
            while time.monotonic() < deadline:
                result = await consumer.pull(mq, offset, 32)
                for m in result.messages:
                    received += 1
                    click.echo(f"demo: received {m.body.decode(errors='replace')!r} (queue {mq.queue_id} offset {m.queue_offset})")
                if result.next_begin_offset == offset:
                    break
                offset = result.next_begin_offset
            await consumer.commit(mq, offset)
    click.echo(f"demo: {received} messages consumed by group 'demo-consumer'")
