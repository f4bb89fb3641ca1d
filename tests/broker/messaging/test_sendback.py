"""SendBackService against a fake store: retry and dead-letter rules, the stored-message ACL
check, and the SYNC_FLUSH wait."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.delay import DEFAULT_DELAY_LEVELS, parse_delay_levels
from tidemq.broker.messaging.context import Caller, refused
from tidemq.broker.messaging.sendback import SendBackRequest, SendBackResult, SendBackService, max_reconsume_times
from tidemq.broker.schedule import ScheduleMessageService
from tidemq.broker.store.results import PutRequest
from tidemq.errors import BrokerError
from tidemq.message import Prop
from tidemq.remoting import ResponseCode

from tests.broker.messaging.fakes import CALLER, STORE_HOST, Parts


class Access:
    """A StoredAccess that records what it was asked and refuses ``denied`` topics."""

    def __init__(self, denied: frozenset[str] = frozenset()) -> None:
        self.asked: list[tuple[Caller, dict]] = []
        self.denied = denied

    def check_stored(self, caller: Caller, need) -> None:
        self.asked.append((caller, dict(need)))
        if self.denied & set(need):
            raise refused(ResponseCode.SYSTEM_ERROR, "AclException: No default permission for topic:Orders")


def service(p: Parts, access: Access | None = None) -> SendBackService:
    schedule = ScheduleMessageService(p.store, parse_delay_levels(DEFAULT_DELAY_LEVELS), p.tmp / "d.json", STORE_HOST)
    return SendBackService(settings=p.settings, store=p.store, creation=p.creation, schedule=schedule,
                           store_host=STORE_HOST, access=access)


def stored(p: Parts, reconsume: int = 0, props: dict[str, str] | None = None) -> int:
    return p.store.put(PutRequest("Orders", 0, b"body", props or {"TAGS": "a"}, reconsume_times=reconsume)).physical_offset


def test_a_message_goes_to_the_groups_retry_topic_with_a_delay(tmp_path):
    p = Parts(tmp_path)
    offset = stored(p, reconsume=2)
    result = service(p).send_back(SendBackRequest(CALLER, "g1", offset))
    assert result == SendBackResult("%RETRY%g1", 3)
    put = p.store.puts[-1]
    assert put.topic == "SCHEDULE_TOPIC_XXXX" and put.reconsume_times == 3  # level 3 + 2 = 5
    assert put.properties["REAL_TOPIC"] == "%RETRY%g1" and put.properties[Prop.DELAY] == "5"
    assert put.properties[Prop.RETRY_TOPIC] == "Orders" and put.properties[Prop.ORIGIN_MESSAGE_ID]
    assert p.topics.get("%RETRY%g1") is not None and p.groups.get("g1") is not None


def test_retries_used_up_or_a_negative_level_go_to_the_dead_letter_queue(tmp_path):
    p = Parts(tmp_path)
    svc = service(p)
    assert svc.send_back(SendBackRequest(CALLER, "g1", stored(p, reconsume=16))).topic == "%DLQ%g1"
    assert Prop.DELAY not in p.store.puts[-1].properties
    assert svc.send_back(SendBackRequest(CALLER, "g1", stored(p), delay_level=-1)).topic == "%DLQ%g1"
    assert svc.send_back(SendBackRequest(CALLER, "g1", stored(p, reconsume=1), max_reconsume_times=1)).topic == "%DLQ%g1"


def test_the_requests_limit_wins_over_the_groups():
    g = SubscriptionGroupConfig("g", retry_max_times=5)
    assert max_reconsume_times(g, None) == 5 and max_reconsume_times(g, 2) == 2 and max_reconsume_times(None, None) == 16


def test_a_group_without_retry_queues_drops_the_message(tmp_path):
    p = Parts(tmp_path)
    p.groups.put(SubscriptionGroupConfig("g0", retry_queue_nums=0))
    before = len(p.store.puts)
    assert service(p).send_back(SendBackRequest(CALLER, "g0", stored(p))) == SendBackResult("")
    assert len(p.store.puts) == before + 1  # only the original


@pytest.mark.parametrize("req, code, words", [
    (SendBackRequest(CALLER, "", 0), ResponseCode.SYSTEM_ERROR, "names no consumer group"),
    (SendBackRequest(CALLER, "g1", 12345), ResponseCode.SYSTEM_ERROR, "look message by offset failed, 12345"),
    (SendBackRequest(CALLER, "g1", -1), ResponseCode.SYSTEM_ERROR, "look message by offset failed, -1"),
])
def test_refusals(tmp_path, req, code, words):
    p = Parts(tmp_path)
    stored(p)
    with pytest.raises(BrokerError) as e:
        service(p).send_back(req)
    assert e.value.code == code and words in e.value.remark


def test_the_caller_must_be_allowed_to_read_the_message_it_copies(tmp_path):
    p = Parts(tmp_path)
    offset = stored(p, props={"TAGS": "a", Prop.RETRY_TOPIC: "First"})
    access = Access()
    service(p, access).send_back(SendBackRequest(CALLER, "g1", offset))
    assert access.asked == [(CALLER, {"Orders": 8, "First": 8})]  # SUB on its topics
    denied = Access(frozenset({"Orders"}))
    before = len(p.store.puts)
    with pytest.raises(BrokerError, match="AclException"):
        service(p, denied).send_back(SendBackRequest(CALLER, "g1", offset))
    assert len(p.store.puts) == before


def test_a_read_only_broker_refuses(tmp_path):
    p = Parts(tmp_path)
    p.config = dataclasses.replace(p.config, broker_permission=4)
    with pytest.raises(BrokerError, match=r"the broker\[broker-a\] sending message is forbidden"):
        service(p).send_back(SendBackRequest(CALLER, "g1", stored(p)))


def test_sync_flush_waits_for_the_disk(tmp_path):
    p = Parts(tmp_path)
    p.sync_flush()

    async def main():
        svc = service(p)
        p.store.flush = asyncio.get_running_loop().create_future()
        pending = svc.send_back(SendBackRequest(CALLER, "g1", stored(p)))
        assert not isinstance(pending, SendBackResult)
        p.store.flush.set_result(False)
        with pytest.raises(BrokerError, match="FLUSH_DISK_TIMEOUT: the message is stored but not yet on disk"):
            await pending

    asyncio.run(main())
