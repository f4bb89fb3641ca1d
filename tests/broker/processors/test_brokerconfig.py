"""BrokerConfigProcessor against a fake BrokerConfigService: the properties text both ways."""

from __future__ import annotations

from types import SimpleNamespace

from tidemq.broker.messaging.context import refused
from tidemq.broker.processors.brokerconfig import BrokerConfigProcessor, parse_properties
from tidemq.broker.processors.common import Callers
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode
from tests.broker.processors import Dispatched

CONN = SimpleNamespace(peer="10.0.0.5:6000")


class FakeService:
    def __init__(self) -> None:
        self.updates: list[tuple] = []

    def update(self, caller, items):
        if items[0][0] == "rocketmqHome":
            raise refused(ResponseCode.NO_PERMISSION, "broker config key 'rocketmqHome' cannot be changed remotely")
        self.updates.append((caller, items))

    def current(self):
        return [("autoCreateTopicEnable", "true"), ("brokerName", "broker-a")]


def test_properties_lines_skip_comments_and_blanks_and_take_colons():
    assert parse_properties("# c\n! c\n\n a = 1 \nb:2\nc") == [("a", "1"), ("b", "2"), ("c", "")]


def test_update_reads_the_body_and_answers_the_services_verdict():
    service = FakeService()
    p = Dispatched(BrokerConfigProcessor(service, callers=Callers(False)))
    ok = p.update(CONN, RemotingCommand.request(RequestCode.UPDATE_BROKER_CONFIG, None, b"brokerPermission=4\n"))
    assert ok.code == ResponseCode.SUCCESS and service.updates[0][1] == [("brokerPermission", "4")]
    assert service.updates[0][0].peer == CONN.peer
    no = p.update(CONN, RemotingCommand.request(RequestCode.UPDATE_BROKER_CONFIG, None, b"rocketmqHome=/tmp"))
    assert no.code == ResponseCode.NO_PERMISSION
    for body, remark in [(b"\xff", "UPDATE_BROKER_CONFIG: the body is not UTF-8 text"),
                         (b"# nothing\n", "UPDATE_BROKER_CONFIG: no key=value in the body")]:
        resp = p.update(CONN, RemotingCommand.request(RequestCode.UPDATE_BROKER_CONFIG, None, body))
        assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, remark)


def test_get_answers_properties_text():
    p = Dispatched(BrokerConfigProcessor(FakeService(), callers=Callers(False)))
    resp = p.get(CONN, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG))
    assert resp.body == b"autoCreateTopicEnable=true\nbrokerName=broker-a\n"
