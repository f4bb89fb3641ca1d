"""Sender alone, over a fake client instance (no network): queue choice, retries on another
broker, SYSTEM_BUSY back-off outside the retry budget, fault reports, fixed queues, routes
borrowed from TBW102, and the errors that say what to do."""

from __future__ import annotations

import pytest

from tidemq.client.config import ClientConfig
from tidemq.client.fault import FaultStrategy
from tidemq.client.route import (
    BrokerData,
    MessageQueue,
    Perm,
    QueueData,
    TopicRouteData,
)
from tidemq.client.route_cache import RouteCache
from tidemq.client.send import OutgoingMessage, SendStatus, prepare_message
from tidemq.client.sender import Sender
from tidemq.client.validation import AUTO_CREATE_TOPIC
from tidemq.errors import BrokerError, ClientError, ConnectError
from tidemq.message import Message
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode

ADDRS = {"broker-a": "10.0.0.1:10911", "broker-b": "10.0.0.2:10911"}


def route(*brokers: str, queues: int = 2, perm: Perm = Perm.READ | Perm.WRITE) -> TopicRouteData:
    return TopicRouteData(tuple(QueueData(b, queues, queues, perm) for b in brokers),
                          tuple(BrokerData("C", b, {0: ADDRS[b]}) for b in brokers))


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeInstance:
    """What a Sender uses of a ClientInstance: the route cache, route lookups and invoke.
    ``answer(addr, cmd)`` gives the response code of each request (or raises)."""

    def __init__(self, known: dict[str, TopicRouteData], answer=None) -> None:
        self.routes = RouteCache()
        self.known = known
        self.answer = answer or (lambda addr, cmd: ResponseCode.SUCCESS)
        self.sent: list[tuple[str, RemotingCommand]] = []
        self.oneway: list[tuple[str, RemotingCommand]] = []
        self.refreshed: list[str] = []
        self.offset = 0

    async def get_route(self, topic: str, refresh: bool = False) -> TopicRouteData | None:
        cached = self.routes.get(topic)
        if cached is not None and not refresh:
            return cached
        found = self.known.get(topic)
        if found is not None:
            self.routes.update(topic, found)
        return found or cached

    async def master_addr(self, topic: str, broker_name: str) -> str:
        addr = self.routes.master_addr(broker_name)
        if addr is None:
            raise ClientError(f"broker {broker_name} of topic {topic} has no master address")
        return addr

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        self.sent.append((addr, cmd))
        code = self.answer(addr, cmd)
        self.offset += 1
        return cmd.response(code, "scripted", {"msgId": f"OFF{self.offset}", "queueId": cmd.ext_fields["e"],
                                               "queueOffset": self.offset})

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        self.oneway.append((addr, cmd))

    def refresh_route_after_fault(self, topic: str) -> None:
        self.refreshed.append(topic)

    def now_ms(self) -> int:
        return 1_700_000_000_000


def make(known: dict[str, TopicRouteData], answer=None, *, retries: int = 2, fault: bool = True):
    inst = FakeInstance(known, answer)
    config = ClientConfig(retry_times_when_send_failed=retries, request_timeout=3.0)
    strategy = FaultStrategy(fault, FakeClock(), seed=3)
    return inst, Sender(inst, "pg", config, strategy)  # type: ignore[arg-type]


def out(topic: str = "T") -> OutgoingMessage:
    return prepare_message(Message(topic, b"x"), "UNIQ1", None)


def brokers_of(inst: FakeInstance) -> list[str]:
    names = {a: n for n, a in ADDRS.items()}
    return [names[a] for a, _cmd in inst.sent]


async def test_a_send_goes_to_a_publish_queue_and_reports_its_latency():
    inst, sender = make({"T": route("broker-a")})
    res = await sender.send_one(out(), 3.0)
    assert res.status is SendStatus.SEND_OK and res.msg_id == "UNIQ1" and res.offset_msg_id == "OFF1"
    assert res.message_queue.broker_name == "broker-a"
    (addr, cmd), = inst.sent
    assert addr == ADDRS["broker-a"] and cmd.code == RequestCode.SEND_MESSAGE_V2
    assert cmd.ext_fields["a"] == "pg" and cmd.ext_fields["e"] == str(res.message_queue.queue_id)
    assert sender.fault.tolerance.is_available("broker-a")


async def test_a_retryable_refusal_is_retried_on_another_broker_which_is_then_avoided():
    failing = ADDRS["broker-a"]
    inst, sender = make({"T": route("broker-a", "broker-b")},
                        lambda addr, cmd: ResponseCode.SYSTEM_ERROR if addr == failing else ResponseCode.SUCCESS)
    results = [await sender.send_one(out(), 3.0) for _ in range(4)]
    assert {r.message_queue.broker_name for r in results} == {"broker-b"}
    assert brokers_of(inst).count("broker-a") == 1  # isolated after its first failure
    assert not sender.fault.tolerance.is_available("broker-a")


async def test_retries_stop_after_the_budget_with_an_error_naming_the_attempts():
    inst, sender = make({"T": route("broker-a")}, lambda addr, cmd: ResponseCode.SERVICE_NOT_AVAILABLE,
                        retries=2)
    with pytest.raises(BrokerError, match=r"send to topic T failed after 3 attempt\(s\)") as err:
        await sender.send_one(out(), 3.0)
    assert err.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert len(inst.sent) == 3


async def test_a_non_retryable_refusal_raises_at_once():
    inst, sender = make({"T": route("broker-a", "broker-b")}, lambda addr, cmd: ResponseCode.MESSAGE_ILLEGAL)
    with pytest.raises(BrokerError) as err:
        await sender.send_one(out(), 3.0)
    assert err.value.code == ResponseCode.MESSAGE_ILLEGAL and len(inst.sent) == 1


async def test_system_busy_is_retried_without_using_up_the_retry_budget(monkeypatch):
    monkeypatch.setattr("tidemq.client.sender.busy_backoff", lambda busy: 0.0)
    answers = iter([ResponseCode.SYSTEM_BUSY] * 5 + [ResponseCode.SUCCESS])
    inst, sender = make({"T": route("broker-a")}, lambda addr, cmd: next(answers), retries=0)
    res = await sender.send_one(out(), 3.0)
    assert res.status is SendStatus.SEND_OK and len(inst.sent) == 6


async def test_a_connection_error_isolates_the_broker_and_the_send_moves_on():
    def answer(addr, cmd):
        if addr == ADDRS["broker-a"]:
            raise ConnectError(f"connect to {addr} refused")
        return ResponseCode.SUCCESS

    inst, sender = make({"T": route("broker-a", "broker-b")}, answer)
    for _ in range(3):
        assert (await sender.send_one(out(), 3.0)).message_queue.broker_name == "broker-b"
    assert brokers_of(inst).count("broker-a") <= 1
    assert not sender.fault.tolerance.is_available("broker-a")


async def test_a_fixed_queue_is_tried_once_and_reports_no_fault():
    inst, sender = make({"T": route("broker-a", "broker-b")}, lambda addr, cmd: ResponseCode.SYSTEM_ERROR)
    fixed = MessageQueue("T", "broker-a", 1)
    await sender.queues("T")
    with pytest.raises(BrokerError, match="after 1 attempt"):
        await sender.send("T", sender.single(out()), "UNIQ1", fixed, 3.0)
    assert [(a, c.ext_fields["e"]) for a, c in inst.sent] == [(ADDRS["broker-a"], "1")]
    assert sender.fault.tolerance.item("broker-a") is None


async def test_a_refused_reply_does_not_isolate_the_broker():
    inst, sender = make({"T": route("broker-a")}, lambda addr, cmd: ResponseCode.SYSTEM_ERROR, retries=0)
    with pytest.raises(BrokerError):
        await sender.send("T", sender.single(out(), reply=True), "UNIQ1", None, 3.0, reply=True)
    assert inst.sent[0][1].code == RequestCode.SEND_REPLY_MESSAGE_V2
    assert sender.fault.tolerance.is_available("broker-a")


async def test_a_merged_part_goes_as_one_batch_request():
    inst, sender = make({"T": route("broker-a")})
    outs = [prepare_message(Message("T", b"m%d" % i), f"U{i}", None) for i in range(3)]
    res = await sender.send_merged("T", outs, 3.0)
    assert res.msg_id == "" and inst.sent[0][1].code == RequestCode.SEND_BATCH_MESSAGE


async def test_fixed_queue_checks_what_the_caller_passed():
    _inst, sender = make({"T": route("broker-a")})
    msg = Message("T", b"x")
    mq = MessageQueue("T", "broker-a", 1)
    assert await sender.fixed_queue(msg, None, None, None) is None
    assert await sender.fixed_queue(msg, mq, None, None) == mq
    assert await sender.fixed_queue(msg, None, lambda qs, m, arg: qs[arg], 1) == mq
    with pytest.raises(ClientError, match="either queue or selector"):
        await sender.fixed_queue(msg, mq, lambda qs, m, arg: qs[0], None)
    with pytest.raises(ClientError, match="does not belong to topic T"):
        await sender.fixed_queue(msg, MessageQueue("U", "broker-a", 1), None, None)
    with pytest.raises(ClientError, match="selector returned 'nope'"):
        await sender.fixed_queue(msg, None, lambda qs, m, arg: "nope", None)


async def test_a_topic_without_route_says_how_to_create_it():
    _inst, sender = make({})
    with pytest.raises(ClientError, match="no route for topic T: create it with `tidemq admin updateTopic"):
        await sender.send_one(out(), 3.0)


async def test_a_topic_without_writable_queue_says_what_to_check():
    _inst, sender = make({"T": route("broker-a", perm=Perm.READ)})
    with pytest.raises(ClientError, match="no writable queue"):
        await sender.queues("T")


async def test_an_unknown_topic_borrows_the_route_of_brokers_that_create_topics():
    inst, sender = make({AUTO_CREATE_TOPIC: route("broker-a", queues=8)})
    res = await sender.send_one(out("Fresh"), 3.0)
    assert res.message_queue.topic == "Fresh"
    assert [q.queue_id for q in inst.routes.publish_queues("Fresh")] == [0, 1, 2, 3]  # at most 4 queues


async def test_oneway_picks_a_queue_and_awaits_no_answer():
    inst, sender = make({"T": route("broker-a")})
    await sender.send_oneway("T", None, sender.single(out()))
    (addr, _cmd), = inst.oneway
    assert addr == ADDRS["broker-a"] and inst.sent == []
