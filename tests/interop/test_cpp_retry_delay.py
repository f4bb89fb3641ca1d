"""The RocketMQ C++ client against TideMQ: delay levels set with set_delay_time_level, and
RECONSUME_LATER sending messages back (CONSUMER_SEND_MSG_BACK to the message's store host) so
they come again through %RETRY%<group> with a growing reconsume count.

Scenarios run in their own processes (tests/interop/cpp_scenarios_retry.py).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.interop.test_cpp_client import read_all

from tests.interop.cppwheel import run_scenario, skip_module_without_wheel

pytestmark = pytest.mark.interop

SCENARIOS = Path(__file__).with_name("cpp_scenarios_retry.py")
SHORT = " ".join(["200ms"] * 18)


skip_module_without_wheel()


def cpp(scenario: str, timeout: float = 90, **args) -> dict:
    return run_scenario(SCENARIOS, scenario, args, timeout)


def name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def test_cpp_delay_level_2_is_not_consumable_before_5_s_and_is_soon_after(cluster):
    topic = name("cpp_delay")
    cluster.create_topic(topic, queues=2)
    res = cpp("delayed", namesrv=cluster.namesrv_addr, topic=topic, group=name("cg"), body="later", level=2,
              timeout=17, linger=0.3)
    assert res["sent"]["status"] == 0
    [m] = res["messages"]
    waited = m["at"] - res["sent"]["sent_at"]
    assert 4.99 <= waited <= 15.0, waited  # upper bound: slack for a loaded CI machine
    assert m["store_timestamp"] / 1000 - res["sent"]["sent_at"] >= 4.998  # stored in the topic when due
    assert m["body"] == "later" and m["topic"] == topic and m["msg_id"] == res["sent"]["msg_id"]
    [stored] = read_all(cluster.namesrv_addr, topic)
    assert stored.properties["REAL_TOPIC"] == topic and "DELAY" not in stored.properties


def test_cpp_reconsume_later_redelivers_with_growing_reconsume_times(cluster_factory):
    cl = cluster_factory(extra_broker_args=["--delay-levels", SHORT])
    topic, group = name("cpp_retry"), name("cg")
    cl.create_topic(topic, queues=1)
    # The broker creates %RETRY%<group> on the first heartbeat, after the C++ consumer's first
    # route lookup; it would then only poll the retry queue from its next rebalance (~10 s later).
    cl.create_topic(f"%RETRY%{group}", queues=1)
    res = cpp("reconsume_later", namesrv=cl.namesrv_addr, topic=topic, group=group, body="flaky",
              fail_times=2, timeout=25, linger=1.0)
    got = res["messages"]
    assert [m["reconsume_times"] for m in got] == [0, 1, 2], got
    assert {m["body"] for m in got} == {"flaky"}
    assert {m["topic"] for m in got} == {topic}  # the client maps %RETRY% back through RETRY_TOPIC
    assert {m["msg_id"] for m in got} == {res["sent"]["msg_id"]}  # UNIQ_KEY survives every hop
    for prev, nxt in zip(got, got[1:]):
        assert nxt["at"] - prev["at"] >= 0.19  # each retry waited for its (200 ms) delay level
    retried = read_all(cl.namesrv_addr, f"%RETRY%{group}")
    assert sorted(m.reconsume_times for m in retried) == [1, 2]
    assert all(m.properties["RETRY_TOPIC"] == topic for m in retried)
