"""Property tests: the client's body parsers raise only their own errors on any input."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.client.admin_protocol import parse_consume_stats, parse_string_list, parse_topic_stats
from tidemq.client.pull import parse_pull_response
from tidemq.client.route import ClusterInfo, MessageQueue, TopicRouteData
from tidemq.errors import BrokerError, CodecError
from tidemq.remoting import RemotingCommand, RequestCode

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
fragments = st.sampled_from([b"{", b"}", b"[", b"]", b":", b",", b"0", b"1", b'"a"', b'"0"', b"null",
                             b'"brokerAddrs"', b'"offsetTable"', b'"queueDatas"', b'"brokerDatas"',
                             b'{"brokerName":"b","queueId":0,"topic":"T"}', b" "])
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(orjson.dumps),
    st.lists(fragments, max_size=30).map(b"".join),
)


@settings(max_examples=400)
@given(bodies)
def test_body_parsers_raise_only_codec_error(body):
    for parse in (TopicRouteData.from_json, ClusterInfo.from_json, parse_topic_stats,
                  parse_consume_stats, lambda b: parse_string_list(b, "topicList", "t")):
        try:
            parse(body)
        except CodecError:
            pass


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_pull_parser_raises_only_broker_error(body):
    resp = RemotingCommand.request(RequestCode.PULL_MESSAGE).response(
        0, None, {"nextBeginOffset": 1, "minOffset": 0, "maxOffset": 1}, body)
    try:
        parse_pull_response(resp, MessageQueue("T", "b", 0), None)
    except BrokerError:
        pass
