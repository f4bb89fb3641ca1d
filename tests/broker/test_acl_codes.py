"""Issue 14, item 8: every request code the broker serves has an ACL rule (tidemq.broker.acl
REQUEST_ACCESS): checked resources, admin, or deliberately open with a reason. A new processor
that forgets its rule fails here."""

from __future__ import annotations

import orjson
import pytest

from tidemq.broker.acl import ADMIN_CODES, REQUEST_ACCESS, Perm, needed_resources, stored_message_topics
from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.broker.store.config import StoreConfig
from tidemq.remoting import RemotingCommand, RequestCode


def test_every_served_request_code_has_an_access_rule(tmp_path):
    broker = Broker(BrokerConfig(store=StoreConfig(root=tmp_path)))
    served = set(broker.handlers)
    missing = sorted(RequestCode(c).name for c in served - set(REQUEST_ACCESS))
    assert not missing, f"request codes without an ACL rule in REQUEST_ACCESS: {missing}"
    stale = sorted(RequestCode(c).name for c in set(REQUEST_ACCESS) - served)
    assert not stale, f"REQUEST_ACCESS lists codes the broker does not serve: {stale}"
    for code, rule in REQUEST_ACCESS.items():
        assert rule in ("resources", "admin", "stored") or (rule.startswith("open: ") and len(rule) > 12), rule
        assert (rule == "admin") == (code in ADMIN_CODES), RequestCode(code).name


def test_resource_rules_name_a_resource_for_each_request():
    """Each "resources" code yields at least one resource from a typical request."""
    header = {"topic": "T", "b": "T", "consumerGroup": "G", "group": "G"}
    body = orjson.dumps({"consumerGroup": "G", "mqSet": [{"topic": "T", "brokerName": "b", "queueId": 0}],
                         "consumerDataSet": [{"groupName": "G", "subscriptionDataSet": [{"topic": "T"}]}]})
    for code, rule in REQUEST_ACCESS.items():
        if rule != "resources":
            continue
        need = needed_resources(RemotingCommand.request(code, header, body))
        assert need, f"{RequestCode(code).name} names no resource"


def test_a_send_without_a_topic_is_refused_by_the_acl():
    for fields in ({"a": "g"}, {"b": "", "a": "g"}):
        with pytest.raises(ValueError, match="names no topic"):
            needed_resources(RemotingCommand.request(RequestCode.SEND_REPLY_MESSAGE_V2, fields))


def test_a_retry_topic_send_checks_the_topics_group_not_the_header():
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"b": "%RETRY%victim", "a": "mine"})
    assert needed_resources(cmd) == {"%RETRY%victim": Perm.SUB}
    anonymous = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"b": "%RETRY%victim"})
    assert needed_resources(anonymous) == {"%RETRY%victim": Perm.SUB}
    reply = RemotingCommand.request(RequestCode.SEND_REPLY_MESSAGE, {"topic": "T"})
    assert needed_resources(reply) == {"T": Perm.PUB}


def test_a_stored_message_belongs_to_its_real_and_retry_topics():
    assert stored_message_topics("SCHEDULE_TOPIC_XXXX", {"REAL_TOPIC": "T"}) == ["T"]
    assert stored_message_topics("rmq_sys_wheel_timer", {"REAL_TOPIC": "T"}) == ["T"]
    assert stored_message_topics("SCHEDULE_TOPIC_XXXX", {"REAL_TOPIC": "%RETRY%g", "RETRY_TOPIC": "T"}) == [
        "%RETRY%g", "T"]
    assert stored_message_topics("T", {"REAL_TOPIC": "X"}) == ["T"]  # only holding topics defer to it
    assert stored_message_topics("%RETRY%g", {"RETRY_TOPIC": "T"}) == ["%RETRY%g", "T"]
    assert stored_message_topics("T", {}) == ["T"]
