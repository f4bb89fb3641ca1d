"""Sending to a topic nobody created: along TBW102's route when a broker creates topics on first send
(autoCreateTopicEnable, as RocketMQ's producers do), else a clear error that says to create it."""

from __future__ import annotations

import uuid

import pytest

from tests.support.waiting import wait_until
from tidemq.client import Admin, ClientConfig, Producer
from tidemq.client.route import TopicRouteData
from tidemq.client.send import SendStatus
from tidemq.errors import AdminError, ClientError
from tidemq.message import Message


def _config(cluster) -> ClientConfig:
    return ClientConfig(name_servers=cluster.namesrv_addr, request_timeout=5.0)


async def test_first_send_creates_the_topic_on_a_broker_that_allows_it(cluster_factory):
    c = cluster_factory(extra_broker_args=["--auto-create-topic"])
    topic = "Auto_" + uuid.uuid4().hex[:8]

    async with Producer("auto-pg", config=_config(c)) as p:
        first = [await p.send(Message(topic, b"a%d" % i)) for i in range(8)]
    async with Admin(config=_config(c)) as admin:
        async def routed() -> TopicRouteData | None:
            try:
                return await admin.topic_route(topic)
            except AdminError:  # TOPIC_NOT_EXIST until the broker's registration arrives
                return None

        # the broker registers the new topic at once, not at its next 30 s round
        route = await wait_until(routed, f"the name server to route the created topic {topic}",
                                 timeout=15, interval=0.1)
    async with Producer("auto-pg2", config=_config(c)) as p2:  # a new client finds the topic's own route
        second = await p2.send(Message(topic, b"b"))
    assert all(r.status is SendStatus.SEND_OK for r in first)
    assert {r.message_queue.queue_id for r in first} <= set(range(4))
    assert len({r.message_queue.queue_id for r in first}) > 1  # round-robin over the borrowed queues
    assert [(q.broker_name, q.read_queue_nums, q.write_queue_nums) for q in route.queue_datas] == [(c.broker_name, 4, 4)]
    assert second.status is SendStatus.SEND_OK


async def test_without_auto_creation_the_error_says_to_create_the_topic(cluster):
    async with Producer("no-auto-pg", config=_config(cluster)) as p:
        with pytest.raises(ClientError) as info:
            await p.send(Message("Missing_" + uuid.uuid4().hex[:6], b"x"))
    text = str(info.value)
    assert "no route for topic" in text and "tidemq admin updateTopic" in text
