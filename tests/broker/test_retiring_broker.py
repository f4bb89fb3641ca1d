"""A broker made read-only the way RocketMQ retires one (updateBrokerConfig brokerPermission=4), and
what the operator reads to know it drained (issue 18, item 4), against a real name server + broker.

The name servers must learn the broker's permission: it registers its topics without WRITE, so
producers are routed elsewhere; its own topic table keeps the topics' permissions (restoring 6
makes them writable again, and a Topic pass never sees a change to undo).
"""

from __future__ import annotations

import uuid

from tests.support.topics import create_topic
from tests.support.waiting import wait_until
from tidemq.client import Admin
from tidemq.client.route import MessageQueue, Perm
from tidemq.client.sync import SyncPullConsumer
from tidemq.errors import ClientError


async def _route_perm(admin: Admin, topic: str, broker: str) -> int:
    admin._require().routes.forget(topic)  # a fresh route from the name server, not the cache
    route = await admin.topic_route(topic)
    return int(next(q.perm for q in route.queue_datas if q.broker_name == broker))


async def test_a_read_only_broker_registers_its_topics_without_write(cluster):
    topic = f"Retire_{uuid.uuid4().hex[:8]}"
    async with Admin(cluster.namesrv_addr) as admin:
        await create_topic(cluster, topic, 2, admin=admin)
        assert (await admin.broker_config(cluster.broker_addr))["brokerPermission"] == "6"
        await admin.update_broker_config(cluster.broker_addr, {"brokerPermission": "4"})
        try:
            assert (await admin.broker_config(cluster.broker_addr))["brokerPermission"] == "4"
            # fails before the fix: the broker refused sends but the route still offered its queues
            perm = await wait_until(
                lambda: _readonly(admin, topic, cluster.broker_name), "the route without WRITE", timeout=10)
            assert perm & Perm.READ
            assert admin._require().routes.get(topic).publish_queues(topic) == []
            # the broker's own table is unchanged: the mask is the broker's, not the topic's
            assert (await admin.broker_topic_configs(cluster.broker_addr))[topic]["perm"] == 6
        finally:
            await admin.update_broker_config(cluster.broker_addr, {"brokerPermission": "6"})
        await wait_until(lambda: _writable(admin, topic, cluster.broker_name), "the route writable again",
                         timeout=10)


async def test_the_route_has_the_new_permission_when_the_update_is_answered(cluster):
    """RocketMQ's updateBrokerConfig registers before it answers: a producer routing right after
    the admin call must see the new permission. Fails before the fix: the registration ran in a
    task after the answer, and a round still running for the previous change (4 -> 6 flips here)
    left the name server with the old permission for a moment."""
    topic = f"Flip_{uuid.uuid4().hex[:8]}"
    async with Admin(cluster.namesrv_addr) as admin:
        await create_topic(cluster, topic, 2, admin=admin)
        try:
            for perm in (4, 6, 4, 6, 4, 6):
                await admin.update_broker_config(cluster.broker_addr, {"brokerPermission": str(perm)})
                writable = await _writable(admin, topic, cluster.broker_name)
                assert writable == bool(perm & Perm.WRITE), f"brokerPermission={perm}: route writable={writable}"
        finally:
            await admin.update_broker_config(cluster.broker_addr, {"brokerPermission": "6"})


async def _readonly(admin: Admin, topic: str, broker: str) -> int | None:
    perm = await _route_perm(admin, topic, broker)
    return None if perm & Perm.WRITE else perm or None


async def _writable(admin: Admin, topic: str, broker: str) -> bool:
    return bool(await _route_perm(admin, topic, broker) & Perm.WRITE)


async def test_broker_config_changes_are_refused_with_a_sentence_before_sending(cluster):
    async with Admin(cluster.namesrv_addr) as admin:
        for bad in ({}, {"brokerPermission": "4\nautoCreateTopicEnable=true"}, {"a=b": "1"}):
            try:
                await admin.update_broker_config(cluster.broker_addr, bad)
            except ClientError as exc:
                assert "key=value" in str(exc)
            else:
                raise AssertionError(f"{bad!r} was sent")
        assert (await admin.broker_config(cluster.broker_addr))["brokerPermission"] == "6"  # nothing sent


async def test_committed_offsets_of_one_broker_by_topic_and_group(cluster):
    topic = f"Offsets_{uuid.uuid4().hex[:8]}"
    group = f"offsets_{uuid.uuid4().hex[:8]}"
    async with Admin(cluster.namesrv_addr) as admin:
        await create_topic(cluster, topic, 2, admin=admin)
        with SyncPullConsumer(group, cluster.namesrv_addr) as consumer:
            consumer.commit(MessageQueue(topic, cluster.broker_name, 1), 7)
        offsets = await wait_until(
            lambda: _offsets_of(admin, cluster.broker_addr, topic), "the committed offset on the broker")
        assert offsets == {group: {1: 7}}


async def _offsets_of(admin: Admin, addr: str, topic: str) -> dict | None:
    return (await admin.broker_consumer_offsets(addr)).get(topic)


async def test_delay_progress_tells_delayed_messages_not_delivered_yet(cluster):
    """GET_ALL_DELAY_OFFSET: a message held at delay level 5 (1 min) is not delivered, one at
    level 1 (1 s) soon is; the operator's scale-in waits for the first (tidemq.operator.scalein)."""
    from tidemq.client import Producer  # noqa: PLC0415
    from tidemq.message import Message, Prop  # noqa: PLC0415
    from tidemq.operator import scalein  # noqa: PLC0415

    topic = f"Later_{uuid.uuid4().hex[:8]}"
    async with Admin(cluster.namesrv_addr) as admin:
        await create_topic(cluster, topic, 1, admin=admin)
        levels, _timer = await admin.broker_delay_progress(cluster.broker_addr)
        before = {lv: (await admin.queue_offset_range(cluster.broker_addr, scalein.SCHEDULE_TOPIC, lv - 1))[1]
                  for lv in (1, 5)}
        async with Producer("later_pg", cluster.namesrv_addr) as producer:
            await producer.send(Message(topic, b"in a minute", properties={Prop.DELAY: "5"}))
            await producer.send(Message(topic, b"in a second", properties={Prop.DELAY: "1"}))

        async def progress() -> tuple[dict[int, int], dict[int, int]] | None:
            levels, timer = await admin.broker_delay_progress(cluster.broker_addr)
            assert timer is not None  # TideMQ reports its timer queue too
            highs = {lv: (await admin.queue_offset_range(cluster.broker_addr, scalein.SCHEDULE_TOPIC, lv - 1))[1]
                     for lv in (1, 5)}
            return (levels, highs) if levels.get(1, 0) >= highs[1] > before[1] else None

        levels, highs = await wait_until(progress, "the 1 s message delivered", timeout=15)
        assert highs[5] == before[5] + 1 and levels.get(5, 0) == before[5]  # held for a minute
        assert scalein.undelivered(levels, highs, None, 0) == {scalein.SCHEDULE_TOPIC: (4,)}
