"""SendService against a fake store: checks, single and batch puts, the %RETRY% -> %DLQ% rule,
big batches off the loop turn, and SYNC_FLUSH answers."""

from __future__ import annotations

import asyncio
import dataclasses
import zlib

import pytest

from tidemq.broker.delay import DEFAULT_DELAY_LEVELS, parse_delay_levels
from tidemq.broker.messaging.send import BATCH_SLICE, PendingSend, SendRequest, SendResult, SendService
from tidemq.broker.schedule import ScheduleMessageService
from tidemq.broker.store.results import PutStatus
from tidemq.broker.topics import TopicConfig
from tidemq.broker.transaction.service import TransactionConfig, TransactionService
from tidemq.errors import BrokerError
from tidemq.message import Prop, SysFlag, decode_record, encode_batch, encode_properties
from tidemq.remoting import ResponseCode

from tests.broker.messaging.fakes import CALLER, STORE_HOST, Parts

TOPIC = "Orders"


@pytest.fixture
def parts(tmp_path) -> Parts:
    p = Parts(tmp_path)
    p.topic(TOPIC, queues=4)
    return p


def service(p: Parts) -> SendService:
    return SendService(
        settings=p.settings, store=p.store, topics=p.topics, groups=p.groups, creation=p.creation,
        schedule=ScheduleMessageService(p.store, parse_delay_levels(DEFAULT_DELAY_LEVELS), p.tmp / "delay.json",
                                        STORE_HOST),
        transactions=TransactionService(p.store, TransactionConfig(), STORE_HOST, p.tmp / "tx.json"),
        store_host=STORE_HOST, on_put=p.on_put,
    )


def request(topic: str = TOPIC, body: bytes = b"hello", props: dict[str, str] | None = None, **over) -> SendRequest:
    return dataclasses.replace(
        SendRequest(CALLER, ("10.0.0.1", 5555), topic, 1, body, encode_properties(props or {"TAGS": "a"})), **over)


def refusal(svc: SendService, req: SendRequest) -> tuple[int, str]:
    with pytest.raises(BrokerError) as e:
        svc.send(req)
    return e.value.code, e.value.remark


def test_a_message_is_stored_with_the_cluster_property_and_counted(parts):
    result = service(parts).send(request(born_timestamp=7, flag=3))
    assert result == SendResult("00000000000000000000000000000000", 1, 0)
    [put] = parts.store.puts
    assert (put.topic, put.queue_id, put.body, put.flag, put.born_timestamp) == (TOPIC, 1, b"hello", 3, 7)
    assert put.born_host == ("10.0.0.1", 5555) and put.store_host == STORE_HOST
    assert put.properties == {"TAGS": "a", Prop.CLUSTER: "DefaultCluster"}
    assert parts.puts == [(TOPIC, 1, 5)]


def test_queue_minus_one_picks_a_writable_queue(parts):
    parts.topic("Few", queues=2)
    queues = {service(parts).send(request("Few", queue_id=-1)).queue_id for _ in range(40)}
    assert queues <= {0, 1} and queues


@pytest.mark.parametrize("req, code, words", [
    (request(queue_id=4), ResponseCode.SYSTEM_ERROR, "request queueId[4] is illegal, topic Orders has 4 queues"),
    (request(body=b""), ResponseCode.MESSAGE_ILLEGAL, "message body is empty"),
    (request("bad topic!"), ResponseCode.SYSTEM_ERROR, "fix the topic name"),
    (request("SCHEDULE_TOPIC_XXXX"), ResponseCode.NO_PERMISSION, "sending message to topic[SCHEDULE_TOPIC_XXXX] is forbidden"),
    (request("Missing"), ResponseCode.TOPIC_NOT_EXIST, "tidemq admin updateTopic -n NAMESRV_ADDR -c DefaultCluster -t Missing"),
    (request(props={"TIMER_DELIVER_MS": "soon"}), ResponseCode.MESSAGE_ILLEGAL, "TIMER_DELIVER_MS"),
])
def test_refusals_store_nothing(parts, req, code, words):
    got_code, remark = refusal(service(parts), req)
    assert got_code == code and words in remark, remark
    assert not parts.store.puts and not parts.puts


def test_a_body_over_the_limit_is_refused(parts):
    parts.config = dataclasses.replace(parts.config, store=dataclasses.replace(parts.config.store,
                                                                               max_message_size=4))
    assert refusal(service(parts), request()) == (
        ResponseCode.MESSAGE_ILLEGAL, "message body is 5 bytes, larger than the broker's maximum 4")


def test_a_read_only_broker_or_topic_refuses_sends(parts):
    parts.topic("ReadOnly", perm=4)
    svc = service(parts)
    assert refusal(svc, request("ReadOnly"))[1] == "the topic[ReadOnly] sending message is forbidden"
    parts.config = dataclasses.replace(parts.config, broker_permission=4)  # read settings per request
    assert refusal(svc, request()) == (ResponseCode.NO_PERMISSION,
                                       "the broker[broker-a] sending message is forbidden")


def test_a_queue_at_or_above_write_queue_nums_takes_no_send(parts):
    """A shrink lowers writeQueueNums first and keeps the queues above readable until consumers
    drained them: a producer with a stale route must not add to them (issue 18). RocketMQ 4.x
    accepted any queue below max(read, write)."""
    parts.topics.put(TopicConfig("Shrinking", 8, 2, 6))  # read 8, write 2
    svc = service(parts)
    assert svc.send(request("Shrinking", queue_id=1)).queue_id == 1
    code, remark = refusal(svc, request("Shrinking", queue_id=2))
    assert code == ResponseCode.NO_PERMISSION  # in the client's ROUTE_FAULT_CODES: it re-reads the route
    assert remark == ("queue 2 of topic[Shrinking] on broker[broker-a] takes no new messages: writeQueueNums is 2, "
                      "readQueueNums 8 (queues 2-7 are only read, as while a shrink drains them); refresh the "
                      "topic's route and send to a queue below 2")
    assert refusal(svc, request("Shrinking", queue_id=7))[0] == ResponseCode.NO_PERMISSION
    assert refusal(svc, request("Shrinking", queue_id=8))[0] == ResponseCode.SYSTEM_ERROR  # no such queue
    batch = encode_batch([(0, b"x", encode_properties({"UNIQ_KEY": "K"}))])
    assert refusal(svc, request("Shrinking", queue_id=5, body=batch, batch=True))[0] == ResponseCode.NO_PERMISSION
    assert [p.queue_id for p in parts.store.puts] == [1]
    assert {svc.send(request("Shrinking", queue_id=-1)).queue_id for _ in range(40)} == {0, 1}


def test_a_store_refusal_is_answered_with_its_code(parts):
    parts.store.refuse = PutStatus.SERVICE_NOT_AVAILABLE
    assert refusal(service(parts), request()) == (ResponseCode.SERVICE_NOT_AVAILABLE, "refused: SERVICE_NOT_AVAILABLE")
    assert not parts.puts


def test_a_first_send_creates_the_topic_from_the_default_topic(parts):
    parts.config = dataclasses.replace(parts.config, auto_create_topic=True)
    parts.topic("TBW102", queues=8, perm=7)
    result = service(parts).send(request("Fresh", queue_id=-1, default_topic="TBW102", default_topic_queue_nums=3))
    assert parts.topics.get("Fresh").write_queue_nums == 3 and result.queue_id in range(3)
    assert parts.quota.created["topic"] == 1 and parts.changed == 1


def test_a_retry_send_past_the_groups_retries_goes_to_the_dlq_without_its_delay(parts):
    svc = service(parts)
    props = {"TAGS": "a", Prop.DELAY: "3"}
    svc.send(request("%RETRY%g1", queue_id=0, props=props, reconsume_times=15))
    assert parts.store.puts[-1].topic == "SCHEDULE_TOPIC_XXXX"  # 15 < 16 (retryMaxTimes): delayed retry
    svc.send(request("%RETRY%g1", queue_id=0, props=props, reconsume_times=16))
    put = parts.store.puts[-1]
    assert (put.topic, put.queue_id) == ("%DLQ%g1", 0) and Prop.DELAY not in put.properties
    svc.send(request("%RETRY%g1", queue_id=0, reconsume_times=2, max_reconsume_times=2))  # the producer's limit
    assert parts.store.puts[-1].topic == "%DLQ%g1"
    assert [t for t, _, _ in parts.puts] == ["%RETRY%g1", "%DLQ%g1", "%DLQ%g1"]


def test_a_dlq_send_needs_an_existing_group(parts):
    code, remark = refusal(service(parts), request("%DLQ%nobody", queue_id=0))
    assert code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST and "nobody" in remark


def test_a_transactional_message_is_stored_as_a_half_message(parts):
    service(parts).send(request(sys_flag=int(SysFlag.TRANSACTION_PREPARED)))
    assert parts.store.puts[0].topic == "RMQ_SYS_TRANS_HALF_TOPIC"
    assert parts.puts == [(TOPIC, 1, 5)]


def batch(n: int, props: dict[str, str] | None = None) -> bytes:
    return encode_batch([(0, f"m{i}".encode(), encode_properties(props or {"UNIQ_KEY": f"K{i}"})) for i in range(n)])


def test_a_batch_is_stored_whole_with_the_headers_properties(parts):
    result = service(parts).send(request(body=batch(3), batch=True, props={"TAGS": "h"}))
    assert result.msg_id.count(",") == 2 and result.queue_offset == 0
    assert [p.body for p in parts.store.puts] == [b"m0", b"m1", b"m2"]
    assert parts.store.puts[1].properties == {"UNIQ_KEY": "K1", "TAGS": "h", Prop.CLUSTER: "DefaultCluster"}
    assert parts.puts == [(TOPIC, 3, 6)]


@pytest.mark.parametrize("body, over, words", [
    (batch(2, {Prop.DELAY: "2"}), {}, "batch messages may not use a delay level or delivery time"),
    (batch(2), {"sys_flag": int(SysFlag.TRANSACTION_PREPARED)}, "a batch cannot hold transactional messages"),
    (b"\x00\x00\x00\x07garbage", {}, "bad message body"),
])
def test_a_bad_batch_stores_nothing(parts, body, over, words):
    code, remark = refusal(service(parts), request(body=body, batch=True, **over))
    assert code == ResponseCode.MESSAGE_ILLEGAL and words in remark
    assert not parts.store.puts


def test_a_compressed_batch_is_inflated_off_the_loop_turn_and_stored_whole(parts):
    async def main():
        svc = service(parts)
        body = zlib.compress(batch(BATCH_SLICE + 5))
        pending = svc.send(request(body=body, batch=True, sys_flag=int(SysFlag.COMPRESSED)))
        assert not isinstance(pending, SendResult) and not parts.store.puts  # nothing yet
        result = await pending
        assert result.msg_id.count(",") == BATCH_SLICE + 4
        assert len(parts.store.puts) == BATCH_SLICE + 5 and parts.store.puts[0].sys_flag == 0
        bad = svc.send(request(body=b"not zlib", batch=True, sys_flag=int(SysFlag.COMPRESSED)))
        with pytest.raises(BrokerError, match="bad message body"):
            await bad

    asyncio.run(main())


def test_sync_flush_answers_when_the_group_commit_covers_the_message(parts):
    parts.sync_flush()

    async def main():
        svc = service(parts)
        loop = asyncio.get_running_loop()
        parts.store.flush = loop.create_future()
        answer = svc.send(request())
        assert isinstance(answer, PendingSend) and answer.result is None
        parts.store.flush.set_result(True)
        assert (await answer).code == ResponseCode.SUCCESS
        parts.store.flush = loop.create_future()
        late = svc.send(request())
        parts.store.flush.set_result(False)
        result = await late
        assert (result.code, result.remark) == (ResponseCode.FLUSH_DISK_TIMEOUT,
                                                "flush to disk timed out; the message is stored")
        parts.store.flush = loop.create_future()  # a producer that does not wait is answered at once
        assert svc.send(request(props={Prop.WAIT: "false"})).__class__ is SendResult

    asyncio.run(main())


def test_stored_records_read_back(parts):
    service(parts).send(request())
    msg = decode_record(parts.store.log[0])
    assert (msg.topic, msg.body, msg.queue_id) == (TOPIC, b"hello", 1)


def test_a_replicated_send_is_answered_by_the_gate_as_it_calls_back(parts):
    """The replication gate (ha/replica.py when_replicated) answers at once (acknowledged
    already, or refused: SLAVE_NOT_AVAILABLE) or calls back later; the send's answer is set in
    that call, with no loop turn, and a producer that does not wait is not gated at all."""
    asks: list[tuple[int, object]] = []
    answer_now: list[int | None] = []

    def gate(end: int, callback) -> int | None:
        asks.append((end, callback))
        return answer_now.pop(0)

    svc = service(parts)
    svc._replicated = gate
    answer_now.append(ResponseCode.SUCCESS)
    assert svc.send(request()) == SendResult("00000000000000000000000000000000", 1, 0)
    answer_now.append(ResponseCode.SLAVE_NOT_AVAILABLE)
    refused = svc.send(request())
    assert isinstance(refused, SendResult) and refused.code == ResponseCode.SLAVE_NOT_AVAILABLE
    assert "fewer replicas than minInSync" in refused.remark
    answer_now.append(None)
    waiting = svc.send(request())
    assert isinstance(waiting, PendingSend) and waiting.result is None
    answered: list[SendResult] = []
    waiting.then(answered.append)
    asks[-1][1](ResponseCode.FLUSH_SLAVE_TIMEOUT)  # the gate's call back: answered within it
    assert [r.code for r in answered] == [ResponseCode.FLUSH_SLAVE_TIMEOUT]
    assert waiting.result is answered[0]
    before = len(asks)
    assert svc.send(request(props={Prop.WAIT: "false"})).__class__ is SendResult
    assert len(asks) == before
    assert [e for e, _ in asks] == sorted(e for e, _ in asks) and asks[0][0] > 0
