"""The metadata record codec (issue 17): every change round-trips, anything else raises only
MetadataCodecError, unknown versions and kinds are refused with a sentence, and big offset
batches are split below the record limit."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.ha.metadata import (
    MAX_BODY_BYTES,
    MAX_INT64,
    MAX_OFFSETS_PER_RECORD,
    METADATA_TOPIC,
    DelayProgress,
    GroupDeleted,
    GroupSet,
    MetadataCodecError,
    OffsetEntry,
    OffsetsCommitted,
    OffsetsDropped,
    TopicDeleted,
    TopicSet,
    TransactionProgress,
    decode,
    encode,
    split_offsets,
)
from tidemq.broker.topics import NOT_ALLOWED_SEND, TopicConfig, is_holding_topic, is_system_topic

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
counts = st.integers(0, 2**31 - 1)
offsets = st.integers(0, MAX_INT64)
topic_configs = st.builds(TopicConfig, topic_name=names, read_queue_nums=counts, write_queue_nums=counts,
                          perm=st.integers(0, 15), topic_filter_type=st.sampled_from(["SINGLE_TAG", "MULTI_TAG"]),
                          topic_sys_flag=counts, order=st.booleans())
group_configs = st.builds(SubscriptionGroupConfig, group_name=names, consume_enable=st.booleans(),
                          consume_from_min_enable=st.booleans(), consume_broadcast_enable=st.booleans(),
                          retry_queue_nums=counts, retry_max_times=counts, broker_id=counts,
                          which_broker_when_consume_slowly=counts,
                          notify_consumer_ids_changed_enable=st.booleans())
entries = st.builds(OffsetEntry, group=names, topic=names, queue_id=counts, offset=offsets)
changes = st.one_of(
    st.builds(TopicSet, topic_configs),
    st.builds(TopicDeleted, names),
    st.builds(GroupSet, group_configs),
    st.builds(GroupDeleted, names),
    st.builds(OffsetsCommitted, st.lists(entries, max_size=20).map(tuple)),
    st.builds(OffsetsDropped, names, st.none() | names),
    st.builds(OffsetsDropped, st.none(), names),
    st.builds(DelayProgress, st.lists(st.tuples(st.integers(1, 64), offsets), max_size=18).map(tuple), offsets),
    st.builds(TransactionProgress, offsets, offsets),
)


@given(changes)
def test_every_change_round_trips(change) -> None:
    assert decode(encode(change)) == change


@given(st.binary(max_size=400))
def test_random_bytes_raise_only_the_codec_error(data: bytes) -> None:
    try:
        decode(data)
    except MetadataCodecError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=12)
kinds = st.sampled_from(["topic.set", "topic.deleted", "group.set", "group.deleted", "offsets.committed",
                         "offsets.dropped", "delay.progress", "transaction.progress"])
keys = st.sampled_from(["config", "name", "offsets", "topic", "group", "levels", "timer", "half", "op",
                        "topicName", "groupName"])


@given(kinds, st.dictionaries(keys, json_values, max_size=5))
def test_well_formed_json_with_wrong_fields_raises_only_the_codec_error(kind, fields) -> None:
    try:
        decode(orjson.dumps({"version": 1, "kind": kind, **fields}))
    except MetadataCodecError:
        pass


def test_an_unknown_version_is_refused_with_what_to_do() -> None:
    body = orjson.dumps({"version": 2, "kind": "topic.deleted", "name": "T"})
    with pytest.raises(MetadataCodecError, match="version 2 is not understood.*upgrade every replica"):
        decode(body)
    with pytest.raises(MetadataCodecError, match="version None"):
        decode(b'{"kind": "topic.deleted", "name": "T"}')


def test_an_unknown_kind_and_bad_values_are_refused() -> None:
    with pytest.raises(MetadataCodecError, match="kind 'acl.set' is unknown"):
        decode(b'{"version": 1, "kind": "acl.set"}')
    with pytest.raises(MetadataCodecError, match="offset must be an integer"):
        decode(b'{"version": 1, "kind": "offsets.committed", "offsets": [["g", "t", 0, -5]]}')
    with pytest.raises(MetadataCodecError, match="neither a topic nor a group"):
        decode(b'{"version": 1, "kind": "offsets.dropped"}')
    with pytest.raises(MetadataCodecError, match="readQueueNums"):
        decode(b'{"version": 1, "kind": "topic.set", "config": {"topicName": "T", "readQueueNums": -1}}')


def test_a_body_past_the_limit_is_refused_before_parsing() -> None:
    with pytest.raises(MetadataCodecError, match="longer than"):
        decode(b" " * (MAX_BODY_BYTES + 1))


def test_offset_batches_are_split_and_each_part_fits() -> None:
    many = [OffsetEntry("group-" + "g" * 200, "topic-" + "t" * 120, q, MAX_INT64) for q in
            range(2 * MAX_OFFSETS_PER_RECORD + 1)]
    parts = list(split_offsets(many))
    assert [len(p.entries) for p in parts] == [MAX_OFFSETS_PER_RECORD, MAX_OFFSETS_PER_RECORD, 1]
    assert [e for p in parts for e in p.entries] == many
    assert all(len(encode(p)) <= MAX_BODY_BYTES for p in parts)
    assert list(split_offsets([])) == []


def test_the_metadata_topic_is_a_system_topic_clients_cannot_send_to() -> None:
    assert METADATA_TOPIC in NOT_ALLOWED_SEND
    assert is_system_topic(METADATA_TOPIC) and is_holding_topic(METADATA_TOPIC)
