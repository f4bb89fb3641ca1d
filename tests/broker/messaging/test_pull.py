"""PullService against a fake store: RocketMQ's check order, status -> code mapping, commits and
the long-poll hold."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tidemq.broker.clients import ClientRegistry
from tidemq.broker.longpoll import PullHoldService
from tidemq.broker.messaging.pull import PullRequest, PullResult, PullService
from tidemq.broker.offsets import ConsumerOffsetManager
from tidemq.broker.store.results import PutRequest
from tidemq.errors import BrokerError
from tidemq.message import tags_code
from tidemq.remoting import ResponseCode

from tests.broker.messaging.fakes import CALLER, Parts

TOPIC = "Orders"


@pytest.fixture
def parts(tmp_path) -> Parts:
    p = Parts(tmp_path)
    p.topic(TOPIC, queues=2)
    return p


def service(p: Parts, holds: PullHoldService | None = None) -> tuple[PullService, ConsumerOffsetManager]:
    offsets = ConsumerOffsetManager(p.tmp / "offsets.json")
    svc = PullService(settings=p.settings, store=p.store, topics=p.topics, groups=p.groups, creation=p.creation,
                      clients=ClientRegistry(), offsets=offsets, holds=holds or PullHoldService(), on_get=p.on_get)
    return svc, offsets


def put(p: Parts, n: int, tags: str = "a") -> None:
    for i in range(n):
        p.store.put(PutRequest(TOPIC, 0, f"m{i}".encode(), {"TAGS": tags}))


def request(offset: int = 0, **over) -> PullRequest:
    return dataclasses.replace(PullRequest(CALLER, "g1", TOPIC, 0, offset, 32, subscription="*"), **over)


def test_found_messages_are_served_and_counted(parts):
    put(parts, 3)
    svc, _ = service(parts)
    r = svc.pull(request(max_nums=2))
    assert (r.code, r.next_begin_offset, r.max_offset, len(r.records)) == (ResponseCode.SUCCESS, 2, 3, 2)
    assert parts.gets == [(TOPIC, 2, sum(map(len, r.records)))]


def test_statuses_map_to_rocketmqs_codes(parts):
    svc, _ = service(parts)
    assert svc.pull(request()).code == ResponseCode.PULL_NOT_FOUND  # empty queue at 0
    moved = svc.pull(request(offset=5))
    assert (moved.code, moved.remark) == (ResponseCode.PULL_OFFSET_MOVED, "the queue is empty")
    put(parts, 2, tags="b")
    assert svc.pull(request(subscription="a")).code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert svc.pull(request(offset=2)).code == ResponseCode.PULL_NOT_FOUND  # at the end (no hold asked)


@pytest.mark.parametrize("over, code, words", [
    ({"topic": "Missing"}, ResponseCode.TOPIC_NOT_EXIST, "topic[Missing] not exist"),
    ({"queue_id": 2}, ResponseCode.SYSTEM_ERROR, "queueId[2] is illegal"),
    ({"expression_type": "SQL92"}, ResponseCode.SUBSCRIPTION_PARSE_FAILED, "SQL92 is not supported"),
    ({"subscription": None}, ResponseCode.SUBSCRIPTION_NOT_EXIST, "send a heartbeat first"),
])
def test_refusals(parts, over, code, words):
    svc, _ = service(parts)
    with pytest.raises(BrokerError) as e:
        svc.pull(request(**over))
    assert e.value.code == code and words in e.value.remark


def test_a_read_only_broker_refuses_before_looking_at_the_group(parts):
    parts.config = dataclasses.replace(parts.config, broker_permission=2)
    svc, _ = service(parts)
    with pytest.raises(BrokerError, match=r"the broker\[broker-a\] pulling message is forbidden"):
        svc.pull(request(group="bad group name!"))
    assert not parts.groups.groups


def test_a_commit_offset_is_committed_first(parts):
    svc, offsets = service(parts)
    svc.pull(request(commit_offset=7))
    assert offsets.table[f"{TOPIC}@g1"] == {0: 7}


def test_a_held_pull_wakes_when_a_matching_message_arrives(parts):
    holds = PullHoldService()

    async def main():
        svc, _ = service(parts, holds)
        pending = svc.pull(request(suspend=True, suspend_timeout_ms=5000))
        assert not isinstance(pending, PullResult)
        task = asyncio.ensure_future(pending)
        await asyncio.sleep(0.01)
        assert holds.waiting == 1
        put(parts, 1)
        holds.on_dispatch(TOPIC, 0, 0, tags_code("a"))
        r = await asyncio.wait_for(task, 1)
        assert r.code == ResponseCode.SUCCESS and len(r.records) == 1

    asyncio.run(main())


def test_a_held_pull_answers_not_found_at_its_timeout_capped_by_the_broker(parts):
    parts.config = dataclasses.replace(parts.config, max_long_poll_ms=20)

    async def main():
        svc, _ = service(parts)
        r = await asyncio.wait_for(svc.pull(request(suspend=True, suspend_timeout_ms=60_000)), 2)
        assert r.code == ResponseCode.PULL_NOT_FOUND

    asyncio.run(main())
