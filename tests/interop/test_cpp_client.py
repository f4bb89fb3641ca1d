"""The RocketMQ C++ client (PyPI wheel `rocketmq` 0.4.4) against real TideMQ processes.

Each C++ scenario runs in its own process (tests/interop/cpp_scenarios.py). Bodies are NUL-free:
the wheel's Python layer reads bodies through c_char_p and would truncate at a NUL.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tidemq.client.sync import SyncPullConsumer

from tests.interop.cppwheel import run_scenario, skip_module_without_wheel

pytestmark = pytest.mark.interop

SCENARIOS = Path(__file__).with_name("cpp_scenarios.py")


skip_module_without_wheel()


def cpp(scenario: str, timeout: float = 90, **args) -> dict:
    return run_scenario(SCENARIOS, scenario, args, timeout)


def topic_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def read_all(namesrv: str, topic: str, group: str | None = None) -> list:
    """Everything stored in a topic, read with TideMQ's own client."""
    out = []
    with SyncPullConsumer(group or f"reader_{uuid.uuid4().hex[:6]}", name_servers=[namesrv]) as c:
        for mq in c.fetch_queues(topic):
            offset = 0
            while True:
                r = c.pull(mq, offset, 32)
                out.extend(r.messages)
                if r.next_begin_offset == offset or not r.messages and r.next_begin_offset >= r.max_offset:
                    break
                offset = r.next_begin_offset
    return out


def test_send_sync_is_stored_with_tags_keys_and_unique_id(cluster):
    topic = topic_name("cpp_sync")
    cluster.create_topic(topic, queues=4)
    specs = [{"body": f"sync-{i}", "tags": "TagA", "keys": f"k{i}"} for i in range(20)]
    res = cpp("produce", namesrv=cluster.namesrv_addr, topic=topic, sync=specs)
    assert [r["status"] for r in res["sync"]] == [0] * 20  # SEND_OK
    stored = read_all(cluster.namesrv_addr, topic)
    assert sorted(m.body.decode() for m in stored) == sorted(s["body"] for s in specs)
    by_body = {m.body.decode(): m for m in stored}
    for spec, r in zip(specs, res["sync"]):
        m = by_body[spec["body"]]
        assert m.tags == "TagA" and m.keys == [spec["keys"]]
        assert m.msg_id == r["msg_id"] and len(r["msg_id"]) == 32  # UNIQ_KEY set by the C++ producer
        assert m.queue_offset == r["offset"]
    assert len({m.queue_id for m in stored}) > 1  # spread over queues


def test_push_consumer_filters_by_tag_expression(cluster):
    topic = topic_name("cpp_tags")
    cluster.create_topic(topic, queues=4)
    specs = [{"body": f"{t}-{i}", "tags": t} for i in range(6) for t in ("TagA", "TagB", "TagC")]
    cpp("produce", namesrv=cluster.namesrv_addr, topic=topic, sync=specs)
    res = cpp("push_consume", namesrv=cluster.namesrv_addr, topic=topic, group=topic_name("g"),
              expression="TagA || TagB", expect=12, linger=1.5)
    bodies = sorted(m["body"] for m in res["messages"])
    assert bodies == sorted(s["body"] for s in specs if s["tags"] != "TagC")


def test_pull_consumer_reads_every_message(cluster):
    topic = topic_name("cpp_pull")
    cluster.create_topic(topic, queues=3)
    specs = [{"body": f"p-{i}", "tags": "T"} for i in range(30)]
    cpp("produce", namesrv=cluster.namesrv_addr, topic=topic, sync=specs)
    res = cpp("pull_consume", namesrv=cluster.namesrv_addr, topic=topic, group=topic_name("pg"))
    assert sorted(m["body"] for m in res["messages"]) == sorted(s["body"] for s in specs)


def test_oneway_batch_and_large_compressed_bodies(cluster):
    topic = topic_name("cpp_mixed")
    cluster.create_topic(topic, queues=2)
    large = "large-" + "0123456789abcdef" * 20000  # 320 KiB, compressed by the C++ client
    batch = [{"body": f"batch-{i}-" + "x" * 600, "keys": f"b{i}"} for i in range(10)]  # > 4 KiB: compressed as a whole
    res = cpp(
        "produce", namesrv=cluster.namesrv_addr, topic=topic,
        oneway=[{"body": f"oneway-{i}"} for i in range(5)],
        sync=[{"body": large, "tags": "big"}],
        batch=batch,
    )
    assert res["oneway"] == 5
    assert res["batch"]["status"] == 0
    stored = read_all(cluster.namesrv_addr, topic)
    bodies = sorted(m.body.decode() for m in stored)
    expected = sorted([f"oneway-{i}" for i in range(5)] + [large] + [b["body"] for b in batch])
    assert bodies == expected  # the batch arrives as 10 messages, the large body intact
    got = cpp("push_consume", namesrv=cluster.namesrv_addr, topic=topic, group=topic_name("g"), expect=16)
    assert sorted(m["body"] for m in got["messages"]) == expected


def test_orderly_sends_are_read_back_in_order(cluster):
    topic = topic_name("cpp_order")
    cluster.create_topic(topic, queues=4)
    specs = [{"body": f"order-{k}-{i:03d}", "arg": k} for i in range(25) for k in range(3)]
    res = cpp("produce", namesrv=cluster.namesrv_addr, topic=topic, orderly=specs)
    assert all(r["status"] == 0 for r in res["orderly"])
    got = cpp("push_consume", namesrv=cluster.namesrv_addr, topic=topic, group=topic_name("og"),
              orderly=True, expect=len(specs))
    by_key: dict[str, list[str]] = {}
    queues: dict[str, set[int]] = {}
    for m in got["messages"]:
        key = m["body"].split("-")[1]
        by_key.setdefault(key, []).append(m["body"])
        queues.setdefault(key, set()).add(m["queue_id"])
    for key, bodies in by_key.items():
        assert bodies == sorted(bodies), f"key {key} consumed out of order"
        assert len(queues[key]) == 1
    assert sum(len(v) for v in by_key.values()) == len(specs)


def test_group_resumes_from_committed_offsets_after_clean_shutdown(cluster):
    topic = topic_name("cpp_resume")
    group = topic_name("rg")
    cluster.create_topic(topic, queues=2)
    first = [{"body": f"first-{i}"} for i in range(10)]
    cpp("produce", namesrv=cluster.namesrv_addr, topic=topic, sync=first)
    got1 = cpp("push_consume", namesrv=cluster.namesrv_addr, topic=topic, group=group, expect=10, linger=1)
    assert sorted(m["body"] for m in got1["messages"]) == sorted(s["body"] for s in first)
    second = [{"body": f"second-{i}"} for i in range(10)]
    cpp("produce", namesrv=cluster.namesrv_addr, topic=topic, sync=second)
    got2 = cpp("push_consume", namesrv=cluster.namesrv_addr, topic=topic, group=group, expect=10, linger=2)
    assert sorted(m["body"] for m in got2["messages"]) == sorted(s["body"] for s in second)
