"""SendAccumulator alone (no broker, no network): what is merged with what, how a part's answer
reaches each caller, and that every caller is answered (aiokafka's test_message_accumulator)."""

from __future__ import annotations

import asyncio

from tidemq.client.accumulator import (
    MAX_MERGED,
    SendAccumulator,
    mergeable,
    split_parts,
)
from tidemq.client.batching import BATCH_LOG_OVERHEAD
from tidemq.client.route import MessageQueue
from tidemq.client.send import OutgoingMessage, SendResult, SendStatus, prepare_message
from tidemq.errors import BrokerError, ClientError
from tidemq.message import Message
from tidemq.remoting import ResponseCode

MQ = MessageQueue("T", "broker-a", 1)


def out(i: int, topic: str = "T", body: bytes = b"x") -> OutgoingMessage:
    return prepare_message(Message(topic, body), f"U{i}", None)


class FakeSender:
    """Answers each merged part as a broker would (offset ids comma-joined, consecutive offsets);
    ``fail`` maps an attempt to the error it raises instead."""

    def __init__(self, fail=None, one_id: bool = False) -> None:
        self.parts: list[tuple[str, list[str], float]] = []
        self.ones: list[tuple[str, float]] = []
        self.fail = fail or (lambda what: None)
        self.one_id = one_id
        self.offset = 100

    async def send_merged(self, topic: str, outs: list[OutgoingMessage], timeout: float) -> SendResult:
        self.parts.append((topic, [o.uniq_key for o in outs], timeout))
        await asyncio.sleep(0)
        exc = self.fail([o.uniq_key for o in outs])
        if exc is not None:
            raise exc
        ids = "OFF" if self.one_id else ",".join(f"OFF-{o.uniq_key}" for o in outs)
        self.offset += len(outs)
        return SendResult(SendStatus.SEND_OK, "", ids, MQ, self.offset - len(outs))

    async def send_one(self, o: OutgoingMessage, timeout: float) -> SendResult:
        self.ones.append((o.uniq_key, timeout))
        exc = self.fail([o.uniq_key])
        if exc is not None:
            raise exc
        return SendResult(SendStatus.SEND_OK, o.uniq_key, f"OFF-{o.uniq_key}", MQ, 7)


def accumulator(sender: FakeSender, tasks: set | None = None, max_size: int = 4 * 1024 * 1024):
    return SendAccumulator(sender.send_merged, sender.send_one, max_size=max_size, default_timeout=3.0,
                           tasks=set() if tasks is None else tasks)


async def test_sends_of_one_iteration_are_merged_and_each_caller_gets_its_own_result():
    sender = FakeSender()
    acc = accumulator(sender)
    results = await asyncio.gather(*(acc.add(out(i), None) for i in range(5)))
    assert sender.parts == [("T", [f"U{i}" for i in range(5)], 3.0)]
    assert [r.msg_id for r in results] == [f"U{i}" for i in range(5)]
    assert [r.offset_msg_id for r in results] == [f"OFF-U{i}" for i in range(5)]
    assert [r.queue_offset for r in results] == [100, 101, 102, 103, 104]
    assert {r.message_queue for r in results} == {MQ}


async def test_a_lone_send_is_handed_back_to_its_caller():
    sender = FakeSender()
    acc = accumulator(sender)
    assert await acc.add(out(1), None) is None
    assert sender.parts == []


async def test_only_sends_of_one_topic_and_one_time_budget_are_merged():
    sender = FakeSender()
    acc = accumulator(sender)
    futs = [acc.add(out(1), 2.0), acc.add(out(2), 2.0), acc.add(out(3), 5.0), acc.add(out(4), 5.0),
            acc.add(out(5, "Other"), 2.0), acc.add(out(6), None), acc.add(out(7), 3.0)]
    results = await asyncio.gather(*futs)
    assert sorted(sender.parts) == [("T", ["U1", "U2"], 2.0), ("T", ["U3", "U4"], 5.0),
                                    ("T", ["U6", "U7"], 3.0)]  # None means the default, 3 s
    assert results[4] is None  # alone on its topic


async def test_many_sends_go_out_in_parts_of_max_merged():
    sender = FakeSender()
    acc = accumulator(sender)
    results = await asyncio.gather(*(acc.add(out(i), None) for i in range(2 * MAX_MERGED + 3)))
    assert [len(keys) for _t, keys, _ in sender.parts] == [MAX_MERGED, MAX_MERGED, 3]
    assert [r.msg_id for r in results] == [f"U{i}" for i in range(2 * MAX_MERGED + 3)]


def test_parts_respect_the_size_limit_as_the_broker_counts_a_batch():
    outs = [out(i, body=b"b" * 1000) for i in range(10)]
    one = len(b"T") + BATCH_LOG_OVERHEAD + 1000 + len(outs[0].properties.encode())
    parts = split_parts("T", outs, max_size=3 * one)
    assert sum(parts, []) == list(range(10))
    assert all(len(p) <= 3 for p in parts) and len(parts) == 4
    assert split_parts("T", [out(1, body=b"b" * 5000)], max_size=1000) == [[0]]  # too big: alone


async def test_a_failed_part_fails_every_caller_of_it():
    sender = FakeSender(fail=lambda keys: BrokerError("disk full", ResponseCode.SYSTEM_ERROR))
    acc = accumulator(sender)
    outcomes = await asyncio.gather(*(acc.add(out(i), None) for i in range(3)), return_exceptions=True)
    assert all(isinstance(o, BrokerError) and "disk full" in str(o) for o in outcomes)
    assert sender.ones == []


async def test_a_part_refused_for_one_message_is_resent_one_by_one():
    def fail(keys):
        if "U1" in keys:
            return BrokerError("message too large", ResponseCode.MESSAGE_ILLEGAL)
        return None

    sender = FakeSender(fail=fail)
    acc = accumulator(sender)
    outcomes = await asyncio.gather(*(acc.add(out(i), 2.0) for i in range(3)), return_exceptions=True)
    assert isinstance(outcomes[1], BrokerError)
    assert [o.msg_id for o in (outcomes[0], outcomes[2])] == ["U0", "U2"]
    assert [k for k, _t in sender.ones] == ["U0", "U1", "U2"]
    assert all(0 < t <= 2.0 for _k, t in sender.ones)  # within what was left of the part's budget


async def test_a_broker_answering_a_batch_with_one_id_gives_it_to_every_caller():
    acc = accumulator(FakeSender(one_id=True))
    results = await asyncio.gather(*(acc.add(out(i), None) for i in range(3)))
    assert [r.offset_msg_id for r in results] == ["OFF"] * 3


async def test_a_cancelled_caller_drops_out_of_the_merge():
    sender = FakeSender()
    acc = accumulator(sender)
    futs = [acc.add(out(i), None) for i in range(3)]
    futs[1].cancel()
    await asyncio.gather(futs[0], futs[2])
    assert sender.parts == [("T", ["U0", "U2"], 3.0)]


async def test_abandoned_and_cancelled_merges_answer_every_caller():
    sender = FakeSender()
    acc = accumulator(sender)
    queued = [acc.add(out(i), None) for i in range(3)]
    acc.abandon()  # the producer closes before the merge ran
    outcomes = await asyncio.gather(*queued, return_exceptions=True)
    assert all(isinstance(o, ClientError) and "abandoned" in str(o) for o in outcomes)
    await asyncio.sleep(0)
    assert sender.parts == []

    tasks: set[asyncio.Task] = set()
    acc = accumulator(sender, tasks)
    in_flight = [acc.add(out(i), None) for i in range(3)]
    await asyncio.sleep(0)  # the merge task starts ...
    for t in tasks:
        t.cancel()  # ... and is cancelled (close() after its wait ran out)
    outcomes = await asyncio.gather(*in_flight, return_exceptions=True)
    assert all(isinstance(o, ClientError) and "may or may not have been stored" in str(o) for o in outcomes)


def test_what_a_batch_cannot_carry_is_not_mergeable():
    def may(body: bytes = b"x", topic: str = "T", **props: str) -> bool:
        msg = Message(topic, body, properties=props)
        return mergeable(prepare_message(msg, "U", 4096), msg.all_properties())

    assert may() and may(WAIT="TRUE")
    assert not may(b"z" * 10_000)  # compressed (sysFlag set)
    assert not may(topic="%RETRY%g")
    for props in ({"DELAY": "0"}, {"TIMER_DELIVER_MS": "1"}, {"WAIT": "false"}, {"TRAN_MSG": "true"},
                  {"MSG_TYPE": "reply"}):
        assert not may(**props), props
