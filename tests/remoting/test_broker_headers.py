"""The header codecs of the consumer, offset, query, admin and end-transaction requests: RocketMQ's
defaults, Java int and long ranges, and arbitrary fields never raise anything but ValueError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.remoting.headers import admin, consumer, offsets, query, transaction
from tidemq.remoting.headers.consumer import CONSUME_FROM, CONSUME_TYPES, enum_name

DECODERS = [
    consumer.decode_unregister_client_header, consumer.decode_consumer_group_header,
    offsets.decode_queue_header, offsets.decode_search_offset_header,
    offsets.decode_query_consumer_offset_header, offsets.decode_update_consumer_offset_header,
    query.decode_query_message_header, query.decode_view_message_header,
    admin.decode_create_topic_header, admin.decode_topic_header, admin.decode_delete_group_header,
    admin.decode_consume_stats_header, transaction.decode_end_transaction_header,
]
NAMES = ["topic", "queueId", "consumerGroup", "producerGroup", "commitOffset", "timestamp", "key", "maxNum",
         "offset", "readQueueNums", "writeQueueNums", "perm", "topicSysFlag", "order", "removeOffset",
         "tranStateTableOffset", "commitLogOffset", "commitOrRollback", "fromTransactionCheck", "groupName",
         "_UNIQUE_KEY_QUERY", "beginTimestamp", "endTimestamp"]
VALUES = st.one_of(st.text(max_size=30), st.integers().map(str), st.sampled_from(["", "true", "1", "-0", " 7"]))


@given(st.dictionaries(st.sampled_from(NAMES), VALUES))
def test_any_fields_decode_or_raise_value_error(fields):
    for decode in DECODERS:
        try:
            decode(fields)
        except ValueError:
            pass


def test_rocketmq_defaults_and_ranges():
    h = admin.decode_create_topic_header({"topic": "t"})
    assert (h.read_queue_nums, h.write_queue_nums, h.perm, h.topic_sys_flag, h.topic_filter_type, h.order) == (
        8, 8, 6, 0, "SINGLE_TAG", False)
    q = query.decode_query_message_header({"topic": "t", "key": "k", "_UNIQUE_KEY_QUERY": "TRUE"})
    assert (q.max_num, q.unique_key, q.begin_timestamp, q.end_timestamp) == (32, True, 0, 0)
    assert offsets.decode_queue_header({"topic": "t", "queueId": str(-(1 << 31))}).queue_id == -(1 << 31)
    with pytest.raises(ValueError, match="'queueId' is out of range"):
        offsets.decode_queue_header({"topic": "t", "queueId": str(1 << 31)})
    with pytest.raises(ValueError, match="'commitOrRollback' is out of range"):
        transaction.decode_end_transaction_header({"tranStateTableOffset": "1", "commitLogOffset": "2",
                                                   "commitOrRollback": str(1 << 40)})
    assert admin.decode_delete_group_header({"groupName": "g", "removeOffset": "1"}).remove_offset


def test_heartbeat_enums_arrive_as_names_or_ordinals():
    assert enum_name(0, CONSUME_FROM, "x") == "CONSUME_FROM_LAST_OFFSET"
    assert enum_name("5", CONSUME_FROM, "x") == "CONSUME_FROM_TIMESTAMP"
    assert enum_name("CONSUME_FROM_TIMESTAMP", CONSUME_FROM, "x") == "CONSUME_FROM_TIMESTAMP"
    for odd in (99, -1, True, None, 1.0, "CONSUME_NEVER", "\u00b2", "\u0663", "9" * 5000):
        assert enum_name(odd, CONSUME_TYPES, "dflt") == "dflt"
