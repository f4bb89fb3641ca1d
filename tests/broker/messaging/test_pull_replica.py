"""PullService on a replica of a replicated group (issue 17) that is not its acknowledging master:
it serves what it holds, ignores commit offsets carried by pulls (RocketMQ's slave does) and never
moves a consumer's offset (it may lag the master). The same requests to a master, for contrast."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tidemq.broker.clients import ClientRegistry
from tidemq.broker.longpoll import PullHoldService
from tidemq.broker.messaging.pull import PullRequest, PullResult, PullService
from tidemq.broker.offsets import ConsumerOffsetManager
from tidemq.broker.store.results import GetResult, GetStatus, PutRequest
from tidemq.message import tags_code
from tidemq.remoting import ResponseCode

from tests.broker.messaging.fakes import CALLER, FakeStore, Parts

TOPIC = "Orders"


class TrimmedStore(FakeStore):
    """A FakeStore whose queues start at ``first`` (older records removed by retention) and that
    answers offsets past the end as the real reader does (OFFSET_OVERFLOW_BADLY)."""

    first = 0

    def get_messages(self, topic: str, queue_id: int, offset: int, max_msgs: int,
                     tag_codes: frozenset[int] | None, max_bytes: int = 256 * 1024) -> GetResult:
        hi = len(self.queues.get((topic, queue_id), ()))
        if hi and offset < self.first:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, self.first, self.first, hi)
        if hi and offset > hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, hi, self.first, hi)
        r = super().get_messages(topic, queue_id, offset, max_msgs, tag_codes, max_bytes)
        return dataclasses.replace(r, min_offset=self.first) if hi else r


@pytest.fixture
def parts(tmp_path) -> Parts:
    p = Parts(tmp_path, store=TrimmedStore())
    p.topic(TOPIC, queues=2)
    return p


def service(p: Parts, master: bool, holds: PullHoldService | None = None) -> tuple[PullService, ConsumerOffsetManager]:
    offsets = ConsumerOffsetManager(p.tmp / "offsets.json")
    svc = PullService(settings=p.settings, store=p.store, topics=p.topics, groups=p.groups, creation=p.creation,
                      clients=ClientRegistry(), offsets=offsets, holds=holds or PullHoldService(), on_get=p.on_get,
                      is_master=lambda: master)
    return svc, offsets


def put(p: Parts, n: int) -> None:
    for i in range(n):
        p.store.put(PutRequest(TOPIC, 0, f"m{i}".encode(), {"TAGS": "a"}))


def request(offset: int = 0, **over) -> PullRequest:
    return dataclasses.replace(PullRequest(CALLER, "g1", TOPIC, 0, offset, 32, subscription="*"), **over)


def test_a_follower_serves_what_it_holds(parts):
    put(parts, 3)
    svc, _ = service(parts, master=False)
    r = svc.pull(request(max_nums=2))
    assert (r.code, r.next_begin_offset, len(r.records)) == (ResponseCode.SUCCESS, 2, 2)


@pytest.mark.parametrize("master", [True, False])
def test_a_commit_carried_by_a_pull_is_stored_by_the_master_only(parts, master):
    put(parts, 3)
    svc, offsets = service(parts, master)
    assert svc.pull(request(commit_offset=2)).code == ResponseCode.SUCCESS
    assert offsets.table.get(f"{TOPIC}@g1") == ({0: 2} if master else None)


def test_an_offset_past_a_followers_end_waits_there_where_a_master_moves_it(parts):
    put(parts, 3)
    follower, _ = service(parts, master=False)
    r = follower.pull(request(offset=7))
    assert (r.code, r.next_begin_offset, r.max_offset) == (ResponseCode.PULL_NOT_FOUND, 7, 3)
    master, _ = service(parts, master=True)
    r = master.pull(request(offset=7))
    assert (r.code, r.next_begin_offset) == (ResponseCode.PULL_OFFSET_MOVED, 3)


def test_a_queue_a_follower_does_not_hold_yet_is_not_found_at_the_requested_offset(parts):
    follower, _ = service(parts, master=False)
    r = follower.pull(request(offset=5))
    assert (r.code, r.next_begin_offset) == (ResponseCode.PULL_NOT_FOUND, 5)
    master, _ = service(parts, master=True)
    assert master.pull(request(offset=5)).code == ResponseCode.PULL_OFFSET_MOVED


def test_an_offset_below_a_followers_first_continues_at_its_first_without_a_move(parts):
    put(parts, 5)
    parts.store.first = 2  # type: ignore[attr-defined]
    follower, _ = service(parts, master=False)
    r = follower.pull(request(offset=0))
    assert (r.code, r.next_begin_offset) == (ResponseCode.PULL_RETRY_IMMEDIATELY, 2)
    master, _ = service(parts, master=True)
    r = master.pull(request(offset=0))
    assert (r.code, r.next_begin_offset) == (ResponseCode.PULL_OFFSET_MOVED, 2)


def test_a_held_pull_past_a_followers_end_is_answered_when_the_record_is_replicated(parts):
    put(parts, 2)
    holds = PullHoldService()

    async def main():
        svc, _ = service(parts, master=False, holds=holds)
        pending = svc.pull(request(offset=3, suspend=True, suspend_timeout_ms=5000))
        assert not isinstance(pending, PullResult)
        task = asyncio.ensure_future(pending)
        await asyncio.sleep(0.01)
        assert holds.waiting == 1
        put(parts, 1)  # offset 2: not what it waits for
        holds.on_dispatch(TOPIC, 0, 2, tags_code("a"))
        await asyncio.sleep(0.01)
        assert not task.done()
        put(parts, 1)  # offset 3 arrives from the master
        holds.on_dispatch(TOPIC, 0, 3, tags_code("a"))
        r = await asyncio.wait_for(task, 1)
        assert (r.code, r.next_begin_offset, len(r.records)) == (ResponseCode.SUCCESS, 4, 1)

    asyncio.run(main())
