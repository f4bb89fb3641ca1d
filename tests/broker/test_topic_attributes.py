"""Topic attributes (RocketMQ 5's ``attributes`` field of UPDATE_AND_CREATE_TOPIC; the operator sends
a Topic's messageType as ``message.type``, issue 18): the codec, the merge rule, and a real broker
that stores, returns, keeps across a restart and refuses what it does not know with a sentence."""

from __future__ import annotations

import uuid

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.broker.topics import TopicConfig, alter_attributes
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.headers.admin import decode_attributes, encode_attributes


def test_attributes_decode_sets_and_removals_and_refuse_what_rocketmq_refuses():
    assert decode_attributes("") == ()
    assert decode_attributes("+message.type=FIFO,-queue.type") == (("message.type", "FIFO"), ("queue.type", None))
    for bad in ("message.type=FIFO", "+message.type", "+message.type=", "-k=v", "+a=1,+a=2", "+=x", ","):
        with pytest.raises(ValueError):
            decode_attributes(bad)
    with pytest.raises(ValueError, match="longer than"):
        decode_attributes("+k=" + "v" * 5000)


_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz.", min_size=1, max_size=12)


@given(st.dictionaries(_names, st.one_of(st.none(), st.text(alphabet="ABCDEFXYZ_", min_size=1, max_size=8)),
                       max_size=5))
def test_attributes_round_trip(changes):
    assert dict(decode_attributes(encode_attributes(changes))) == changes


@given(st.text(alphabet="+-=,ab.", max_size=40) | st.text(max_size=40))
def test_any_attributes_text_decodes_or_raises_value_error(text):
    try:
        decoded = decode_attributes(text)
    except ValueError:
        return
    assert dict(decode_attributes(encode_attributes(dict(decoded)))) == dict(decoded)


def test_changes_merge_into_the_current_attributes():
    current = (("message.type", "NORMAL"),)
    assert alter_attributes(current, ()) == current  # an update naming none keeps them
    assert alter_attributes(current, (("message.type", "FIFO"),)) == (("message.type", "FIFO"),)
    assert alter_attributes(current, (("message.type", None),)) == ()
    with pytest.raises(ValueError, match="unsupported topic attribute 'queue.type'"):
        alter_attributes(current, (("queue.type", "BatchCQ"),))
    with pytest.raises(ValueError, match="use one of"):
        alter_attributes(current, (("message.type", "LOUD"),))


def test_topic_config_json_carries_attributes_only_when_set():
    plain = TopicConfig("t", 4, 4)
    assert "attributes" not in plain.to_json()  # bodies without attributes are as before
    fifo = TopicConfig("t", 4, 4, attributes=(("message.type", "FIFO"),))
    assert fifo.to_json()["attributes"] == {"message.type": "FIFO"}
    assert TopicConfig.from_json(fifo.to_json()) == fifo


def _update(topic: str, attributes: str | None = None) -> RemotingCommand:
    fields: dict[str, object] = {"topic": topic, "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
    if attributes is not None:
        fields["attributes"] = attributes
    return RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)


async def _attributes(rc: RemotingClient, addr: str, topic: str) -> dict | None:
    r = await rc.invoke(addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG), 3)
    tc = orjson.loads(r.body_bytes())["topicConfigTable"].get(topic)
    return None if tc is None else tc.get("attributes", {})


async def test_a_broker_stores_returns_and_keeps_topic_attributes(cluster_factory):
    c = cluster_factory()
    topic = "attr_" + uuid.uuid4().hex[:6]
    rc = RemotingClient()
    try:
        addr = c.broker_addr
        assert (await rc.invoke(addr, _update(topic, "+message.type=FIFO"), 3)).code == ResponseCode.SUCCESS
        assert await _attributes(rc, addr, topic) == {"message.type": "FIFO"}
        assert (await rc.invoke(addr, _update(topic), 3)).code == ResponseCode.SUCCESS  # mqadmin 4: kept
        assert await _attributes(rc, addr, topic) == {"message.type": "FIFO"}

        bad = await rc.invoke(addr, _update(topic, "+queue.type=BatchCQ"), 3)
        assert bad.code == ResponseCode.SYSTEM_ERROR and "unsupported topic attribute" in bad.remark
        malformed = await rc.invoke(addr, _update(topic, "message.type=FIFO"), 3)
        assert malformed.code != ResponseCode.SUCCESS and "+key=value" in (malformed.remark or "")
        assert await _attributes(rc, addr, topic) == {"message.type": "FIFO"}  # refusals changed nothing
    finally:
        await rc.close()

    c.restart_broker()
    rc = RemotingClient()
    try:
        assert await _attributes(rc, c.broker_addr, topic) == {"message.type": "FIFO"}  # persisted
        assert (await rc.invoke(c.broker_addr, _update(topic, "-message.type"), 3)).code == ResponseCode.SUCCESS
        assert await _attributes(rc, c.broker_addr, topic) == {}
    finally:
        await rc.close()
