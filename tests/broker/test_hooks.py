"""Dispatch with hooks around it (tidemq.broker.hooks): the order of before/deferred/settled/after,
every outcome reaching every hook once, and what the metrics hook counts."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tidemq.broker.hooks import Dispatcher, MetricsHook, Outcome
from tidemq.broker.messaging.context import refused
from tidemq.broker.metrics import BrokerMetrics
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode

CONN = SimpleNamespace(peer="10.0.0.1:5555")


class Recorder:
    def __init__(self, name: str, log: list, refuse: int | None = None) -> None:
        self.name, self.log, self.refuse = name, log, refuse

    def before(self, conn, cmd, started):
        self.log.append((self.name, "before"))
        return cmd.response(ResponseCode.NO_PERMISSION, "no") if cmd.code == self.refuse else None

    def deferred(self, cmd, started):
        self.log.append((self.name, "deferred"))

    def settled(self, cmd, outcome):
        self.log.append((self.name, "settled", outcome))

    def after(self, cmd, response, outcome, started):
        self.log.append((self.name, "after", outcome, None if response is None else response.code))


def dispatcher(handlers, refuse: int | None = None):
    log: list = []
    return Dispatcher(handlers, [Recorder("a", log, refuse), Recorder("b", log)]), log


def request(code: int = RequestCode.PULL_MESSAGE) -> RemotingCommand:
    return RemotingCommand.request(code, {})


def test_an_answer_now_runs_befores_in_order_then_every_after():
    d, log = dispatcher({11: lambda conn, cmd: cmd.response()})
    assert d.handle(CONN, request()).code == ResponseCode.SUCCESS
    assert log == [("a", "before"), ("b", "before"), ("a", "after", Outcome.ANSWERED, 0),
                   ("b", "after", Outcome.ANSWERED, 0)]


def test_a_refusal_stops_later_befores_and_the_handler():
    called = []
    d, log = dispatcher({11: lambda conn, cmd: called.append(1)}, refuse=11)
    assert d.handle(CONN, request()).code == ResponseCode.NO_PERMISSION and not called
    assert log == [("a", "before"), ("a", "after", Outcome.REFUSED, ResponseCode.NO_PERMISSION),
                   ("b", "after", Outcome.REFUSED, ResponseCode.NO_PERMISSION)]


def test_unknown_codes_bad_requests_and_failures():
    def bad(conn, cmd):
        raise ValueError("queueId is not a number")

    def broken(conn, cmd):
        raise RuntimeError("bug")

    d, log = dispatcher({11: bad, 12: broken})
    resp = d.handle(CONN, request(9999))
    assert (resp.code, resp.remark) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, " request type 9999 not supported")
    assert d.unknown_codes == 1 and log[-1] == ("b", "after", Outcome.REFUSED, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)
    resp = d.handle(CONN, request(11))
    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "bad request (code 11): queueId is not a number")
    with pytest.raises(RuntimeError):
        d.handle(CONN, request(12))
    assert log[-1] == ("b", "after", Outcome.FAILED, None)


def test_a_services_refusal_is_answered_with_its_code_and_remark():
    def refusing(conn, cmd):
        raise refused(ResponseCode.TOPIC_NOT_EXIST, "topic[t] not exist")

    d, log = dispatcher({13: refusing})
    resp = d.handle(CONN, request(13))
    assert (resp.code, resp.remark) == (ResponseCode.TOPIC_NOT_EXIST, "topic[t] not exist")
    assert log[-1] == ("b", "after", Outcome.ANSWERED, ResponseCode.TOPIC_NOT_EXIST)


async def test_a_deferred_answer_is_settled_then_aftered_once_it_comes():
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    async def later(conn, cmd):
        return cmd.response(ResponseCode.PULL_NOT_FOUND)

    d, log = dispatcher({11: lambda conn, cmd: fut, 12: later})
    assert d.handle(CONN, request(11)) is fut
    assert log[-1] == ("b", "deferred")
    fut.set_result(request().response())
    await asyncio.sleep(0)
    assert log[-4:] == [("a", "settled", Outcome.ANSWERED), ("b", "settled", Outcome.ANSWERED),
                        ("a", "after", Outcome.ANSWERED, 0), ("b", "after", Outcome.ANSWERED, 0)]
    log.clear()
    assert (await d.handle(CONN, request(12))).code == ResponseCode.PULL_NOT_FOUND
    assert [e[:2] for e in log] == [("a", "before"), ("b", "before"), ("a", "deferred"), ("b", "deferred"),
                                    ("a", "settled"), ("b", "settled"), ("a", "after"), ("b", "after")]
    log.clear()
    gone = loop.create_future()
    d2, log2 = dispatcher({11: lambda conn, cmd: gone})
    d2.handle(CONN, request(11))
    gone.cancel()
    await asyncio.sleep(0)
    assert log2[-1] == ("b", "after", Outcome.CANCELLED, None)


def test_metrics_count_codes_and_time_only_served_requests():
    m = BrokerMetrics("c", "b")
    hook = MetricsHook(m)
    send = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {})
    hook.after(send, send.response(), Outcome.ANSWERED, 0.0)
    hook.after(send, send.response(ResponseCode.SYSTEM_BUSY), Outcome.REFUSED, 0.0)
    hook.after(send, None, Outcome.FAILED, 0.0)
    hook.after(send, None, Outcome.CANCELLED, 0.0)
    assert m.error_counts == {ResponseCode.SYSTEM_BUSY: 1, ResponseCode.SYSTEM_ERROR: 1}
    assert sum(m.latency["send"][0]) == 1  # the answered one only
