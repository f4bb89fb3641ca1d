"""Producer.send() coalescing against a real broker: concurrent sends of one topic go out as
SEND_BATCH_MESSAGEs, every caller gets its own SendResult, and what must not be merged is not."""

from __future__ import annotations

import asyncio
import uuid

from tidemq.client import ClientConfig, MessageQueue, Producer, PullConsumer
from tidemq.client.accumulator import MAX_MERGED, MAX_MERGED_BODY
from tidemq.client.accumulator import mergeable as may_merge
from tidemq.client.send import SendStatus, prepare_message
from tidemq.errors import BrokerError, ClientError
from tidemq.message import Message
from tidemq.remoting.codes import ResponseCode


def _config(cluster, **kw) -> ClientConfig:
    return ClientConfig(name_servers=cluster.namesrv_addr, **{"request_timeout": 5.0, **kw})


def _topic(cluster) -> str:
    topic = "Coalesce_" + uuid.uuid4().hex[:8]
    cluster.create_topic(topic, queues=4)
    return topic


async def _read_all(cluster, topic: str) -> dict[tuple[int, int], object]:
    """(queue id, queue offset) -> stored message, over the topic's 4 queues."""
    out = {}
    async with PullConsumer("coalesce-reader", config=_config(cluster)) as consumer:
        for q in range(4):
            offset = 0
            while True:
                got = await consumer.pull(MessageQueue(topic, cluster.broker_name, q), offset, 256)
                if not got.messages:
                    break
                for m in got.messages:
                    out[(q, m.queue_offset)] = m
                offset = got.next_begin_offset
    return out


async def test_concurrent_sends_are_merged_and_each_caller_gets_its_own_result(cluster):
    topic = _topic(cluster)

    async with Producer("coalesce-pg", config=_config(cluster)) as p:
        await p.send(Message(topic, b"warm-up"))  # route known: the next sends start together
        msgs = [Message(topic, b"m%03d" % i, tags="T%d" % (i % 3), keys=f"k{i}") for i in range(300)]
        results = await asyncio.gather(*(p.send(m) for m in msgs))
    stored = await _read_all(cluster, topic)
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len({r.msg_id for r in results}) == 300 and len({r.offset_msg_id for r in results}) == 300
    # the first found none in flight and went out at once, alone (round-robin: the next queue)
    assert results[0].message_queue != results[1].message_queue
    for i in range(1, 300, MAX_MERGED):  # merged in parts of MAX_MERGED: one queue, consecutive offsets
        part = results[i : i + MAX_MERGED]
        assert len({r.message_queue for r in part}) == 1
        assert [r.queue_offset for r in part] == list(range(part[0].queue_offset, part[0].queue_offset + len(part)))
    for m, r in zip(msgs, results):  # each result names where its own message is
        got = stored[(r.message_queue.queue_id, r.queue_offset)]
        assert got.body == m.body and got.tags == m.tags and got.keys == [m.keys]
        assert got.msg_id == r.msg_id and got.offset_msg_id == r.offset_msg_id
    assert len(stored) == 301


async def test_a_send_made_while_none_is_in_flight_goes_out_at_once_and_alone(cluster):
    """Nothing to merge it with yet: it does not wait for the end of the loop iteration (two
    iterations of a one-in-flight send's round trip); the sends that join it there are merged."""
    topic = _topic(cluster)

    async with Producer("coalesce-lone-pg", config=_config(cluster)) as p:
        await p.send(Message(topic, b"warm-up"))
        first, *rest = await asyncio.gather(*(p.send(Message(topic, b"n%d" % i)) for i in range(5)))
    assert first.message_queue not in {r.message_queue for r in rest}
    assert len({r.message_queue for r in rest}) == 1
    assert [r.queue_offset for r in rest] == list(range(rest[0].queue_offset, rest[0].queue_offset + 4))


async def test_without_coalescing_concurrent_sends_go_one_by_one(cluster):
    topic = _topic(cluster)

    async with Producer("coalesce-off-pg", config=_config(cluster, coalesce_sends=False)) as p:
        await p.send(Message(topic, b"warm-up"))
        results = await asyncio.gather(*(p.send(Message(topic, b"x%d" % i)) for i in range(40)))
    assert len({r.message_queue for r in results}) == 4  # round-robin, one request each


async def test_what_may_not_be_batched_is_sent_alone_next_to_merged_sends(cluster):
    topic = _topic(cluster)

    async with Producer("coalesce-mixed-pg", config=_config(cluster)) as p:
        await p.send(Message(topic, b"warm-up"))
        delayed_msg = Message(topic, b"delayed", properties={"DELAY": "1"})
        big_msg = Message(topic, b"z" * 10_000)  # above compress_threshold: compressed, sent alone
        plain_msgs = [Message(topic, b"p%d" % i) for i in range(10)]
        delayed, big, *plain = await asyncio.gather(p.send(delayed_msg), p.send(big_msg),
                                                    *(p.send(m) for m in plain_msgs))
    assert len({r.message_queue for r in plain}) == 1  # merged
    assert delayed.message_queue.topic == big.message_queue.topic == plain[0].message_queue.topic
    stored = await _read_all(cluster, topic)
    assert stored[(big.message_queue.queue_id, big.queue_offset)].body == b"z" * 10_000
    # the delayed message waits in SCHEDULE_TOPIC_XXXX, not in the topic's queue yet
    assert (delayed.message_queue.queue_id, delayed.queue_offset) not in stored or \
        stored[(delayed.message_queue.queue_id, delayed.queue_offset)].body != b"delayed"


async def test_a_failed_merged_send_fails_every_caller_and_a_cancelled_one_drops_out(cluster):
    async with Producer("coalesce-fail-pg", config=_config(cluster, request_timeout=2.0)) as p:
        missing = "NoSuchTopic_" + uuid.uuid4().hex[:6]
        outcomes = await asyncio.gather(*(p.send(Message(missing, b"x")) for _ in range(5)),
                                        return_exceptions=True)
        topic = _topic(cluster)
        await p.send(Message(topic, b"warm-up"))
        sends = [asyncio.ensure_future(p.send(Message(topic, b"c%d" % i))) for i in range(5)]
        await asyncio.sleep(0)  # every send has queued itself; cancel one before the merge
        sends[2].cancel()
        done = await asyncio.gather(*sends, return_exceptions=True)
    assert all(isinstance(o, ClientError) and "no route" in str(o) for o in outcomes)
    assert isinstance(done[2], asyncio.CancelledError)
    ok = [d for i, d in enumerate(done) if i != 2]
    # c0 found none in flight and went out alone; the others were merged
    assert all(r.status is SendStatus.SEND_OK for r in ok) and len({r.message_queue for r in ok[1:]}) == 1
    bodies = sorted(m.body for m in (await _read_all(cluster, topic)).values())
    assert bodies == [b"c0", b"c1", b"c3", b"c4", b"warm-up"]


async def test_one_message_the_broker_refuses_fails_only_its_own_caller(cluster_factory):
    """A broker with a smaller body limit than the client's refuses the merged batch whole
    (MESSAGE_ILLEGAL, nothing stored); the producer resends each alone, so the nine others land
    once and only the oversized one fails, with the broker's reason."""
    small = cluster_factory(extra_broker_args=["--max-message-size", "2048"])
    topic = _topic(small)

    async with Producer("coalesce-illegal-pg", config=_config(small)) as p:
        await p.send(Message(topic, b"warm-up"))
        bodies = [b"b%d" % i for i in range(10)]
        bodies[4] = b"x" * 3000  # under MAX_MERGED_BODY: merged with the others
        outcomes = await asyncio.gather(*(p.send(Message(topic, b)) for b in bodies),
                                        return_exceptions=True)
    bad = outcomes[4]
    assert isinstance(bad, BrokerError) and bad.code == ResponseCode.MESSAGE_ILLEGAL
    assert "larger than the broker's maximum 2048" in str(bad)
    assert all(o.status is SendStatus.SEND_OK for i, o in enumerate(outcomes) if i != 4)
    stored = sorted(m.body for m in (await _read_all(small, topic)).values())
    assert stored == sorted([b for i, b in enumerate(bodies) if i != 4] + [b"warm-up"])


async def test_a_large_body_and_a_cancelled_merge_never_leave_a_caller_hanging(cluster):
    """Bodies over MAX_MERGED_BODY go alone (compression off here, so only the size keeps them out);
    if the merged request's task is cancelled (e.g. at close), its callers get an error saying the
    outcome is unknown (not a cancellation they never asked for, and never a hang)."""
    topic = _topic(cluster)

    cfg = _config(cluster, compress_threshold=10 << 20)
    async with Producer("coalesce-big-pg", config=cfg) as p:
        await p.send(Message(topic, b"warm-up"))
        big = Message(topic, b"b" * (MAX_MERGED_BODY + 1))
        small = [Message(topic, b"s%d" % i) for i in range(4)]
        r_big, *r_small = await asyncio.gather(p.send(big), *(p.send(m) for m in small))
        # alone, it took a queue of its own (round-robin: the merged part took the next one)
        assert r_big.message_queue != r_small[0].message_queue
        assert len({r.message_queue for r in r_small}) == 1
        lead = asyncio.ensure_future(p.send(Message(topic, b"lead")))  # in flight: the next are merged
        sends = [asyncio.ensure_future(p.send(Message(topic, b"c%d" % i))) for i in range(3)]
        for _ in range(3):  # let them queue and the merge task start
            await asyncio.sleep(0)
        for task in list(p._tasks):
            task.cancel()
        outcomes = await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 5)
        assert (await lead).status is SendStatus.SEND_OK
    assert all(isinstance(o, ClientError) and "abandoned" in str(o) for o in outcomes), outcomes


async def test_delays_timers_odd_wait_values_and_different_timeouts_are_not_merged(cluster):
    """A batch element may carry no DELAY key (not even "0") and no delivery time, WAIT is compared
    as the broker does (case-insensitively), and sends with different timeouts are not merged."""
    def mergeable(**props):
        msg = Message("T", b"x", properties=props)
        return may_merge(prepare_message(msg, "U", None), msg.all_properties())

    assert mergeable() and mergeable(WAIT="TRUE")
    for props in ({"DELAY": "0"}, {"DELAY": "3"}, {"TIMER_DELAY_SEC": "10"}, {"TIMER_DELIVER_MS": "1"},
                  {"TIMER_DELAY_MS": "5"}, {"__STARTDELIVERTIME": "1"}, {"WAIT": "False"}, {"TRAN_MSG": "true"}):
        assert not mergeable(**props), props
    topic = _topic(cluster)

    async with Producer("coalesce-timeouts-pg", config=_config(cluster)) as p:
        await p.send(Message(topic, b"warm-up"))
        results = await asyncio.gather(*(p.send(Message(topic, b"a%d" % i), timeout=4.0) for i in range(3)),
                                       *(p.send(Message(topic, b"b%d" % i), timeout=9.0) for i in range(3)))
    a, b = results[1:3], results[3:]  # the first found none in flight: sent at once, alone
    assert len({r.message_queue for r in a}) == 1 and len({r.message_queue for r in b}) == 1
    assert a[0].message_queue != b[0].message_queue  # two merged requests, one per time budget
