"""Option parsing of the tidemq Spark source and sink: pure, no Spark session, no servers.

Every malformed option must fail with a SparkOptionError (a ConfigError) whose message names the
option, before any connection is made; no input may raise anything else.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import ConfigError
from tidemq.spark.options import (
    EARLIEST,
    LATEST,
    MAX_PULL_BATCH,
    SINK_OPTIONS,
    SOURCE_OPTIONS,
    Credentials,
    SparkOptionError,
    parse_sink_options,
    parse_source_options,
)

NS = "127.0.0.1:9876"


def src(streaming: bool = False, **kw: str):
    return parse_source_options({"nameServers": NS, "subscribe": "orders", **kw}, streaming)


def src_error(streaming: bool = False, base: dict | None = None, **kw: str) -> str:
    opts = {"nameServers": NS, "subscribe": "orders"} if base is None else dict(base)
    opts.update(kw)
    with pytest.raises(SparkOptionError) as info:
        parse_source_options(opts, streaming)
    return str(info.value)


# --- every source option --------------------------------------------------------------------


def test_defaults_of_a_batch_read_are_earliest_to_latest():
    o = src()
    assert o.name_servers == (NS,)
    assert o.topics == ("orders",) and o.pattern is None and o.assign is None
    assert o.starting == "earliest" and o.ending == "latest"
    assert o.starting_timestamp is None and o.ending_timestamp is None
    assert o.max_offsets_per_trigger is None
    assert o.min_partitions is None and o.max_records_per_partition is None
    assert o.fail_on_data_loss is True
    assert o.tag_expression == "*"
    assert o.include_properties is False
    assert o.consumer_group is None
    assert o.credentials == Credentials()
    assert o.pull_batch_size == MAX_PULL_BATCH
    assert o.pull_timeout_ms == 10_000


def test_a_streaming_read_starts_at_latest_by_default():
    assert src(streaming=True).starting == "latest"


def test_every_source_option_is_parsed_into_its_field():
    o = parse_source_options({
        "nameServers": "10.0.0.1:9876;10.0.0.2:9876",
        "subscribe": "orders, payments,orders",
        "startingOffsets": "earliest",
        "startingTimestamp": "1700000000000",
        "maxOffsetsPerTrigger": "500",
        "minPartitions": "8",
        "maxRecordsPerPartition": "1000",
        "failOnDataLoss": "False",
        "tagExpression": " TagA || TagB ",
        "includeProperties": "TRUE",
        "consumerGroup": "spark-mirror",
        "accessKey": "AK",
        "secretKey": "SK",
        "pullBatchSize": "64",
        "pullTimeoutMs": "2500",
        "path": "ignored",
    }, streaming=True)
    assert o.name_servers == ("10.0.0.1:9876", "10.0.0.2:9876")
    assert o.topics == ("orders", "payments")  # stripped, duplicates dropped, order kept
    assert o.starting == "earliest"
    assert o.starting_timestamp == 1_700_000_000_000
    assert o.max_offsets_per_trigger == 500
    assert o.min_partitions == 8
    assert o.max_records_per_partition == 1000
    assert o.fail_on_data_loss is False
    assert o.tag_expression == "TagA || TagB"
    assert o.include_properties is True
    assert o.consumer_group == "spark-mirror"
    assert o.credentials == Credentials("AK", "SK")
    assert o.pull_batch_size == 64
    assert o.pull_timeout_ms == 2500


def test_batch_only_options_are_parsed():
    o = src(endingOffsets='{"orders": {"broker-a": {"0": 10, "1": -1}}}', endingTimestamp="42")
    assert o.ending == {"orders": {"broker-a": {0: 10, 1: LATEST}}}
    assert o.ending_timestamp == 42


@pytest.mark.parametrize("name", ["nameServers", "nameServer", "namesrvAddr", "NAMESRVADDR"])
def test_name_server_aliases(name):
    o = parse_source_options({name: "h1:1,h2:2", "subscribe": "t"}, False)
    assert o.name_servers == ("h1:1", "h2:2")


@pytest.mark.parametrize("name", ["subscribe", "topic", "Topic", "SUBSCRIBE"])
def test_topic_is_an_alias_of_subscribe(name):
    assert parse_source_options({"nameServers": NS, name: "a,b"}, False).topics == ("a", "b")


@pytest.mark.parametrize("name", ["subscribePattern", "topicPattern"])
def test_subscribe_pattern_aliases(name):
    o = parse_source_options({"nameServers": NS, name: "ord.*"}, False)
    assert o.pattern == "ord.*" and o.topics == ()
    assert o.matches("orders") and not o.matches("payments")
    assert not o.matches("%RETRY%orders-group")  # system topics never match a pattern


@pytest.mark.parametrize("name", ["maxOffsetsPerTrigger", "maxMessagesPerTrigger", "MAXOFFSETSPERTRIGGER"])
def test_max_messages_per_trigger_is_an_alias(name):
    assert src(streaming=True, **{name: "77"}).max_offsets_per_trigger == 77


@pytest.mark.parametrize("name", ["tagExpression", "subExpression", "SubExpression"])
def test_sub_expression_is_an_alias_of_tag_expression(name):
    assert src(**{name: "TagA"}).tag_expression == "TagA"


def test_blank_tag_expression_means_all():
    assert src(tagExpression="  ").tag_expression == "*"


def test_option_names_are_case_insensitive():
    o = parse_source_options({"NAMESERVERS": NS, "SubScribe": "orders", "INCLUDEPROPERTIES": "true",
                              "pullbatchsize": "5", "FailOnDataLoss": "false"}, False)
    assert o.topics == ("orders",)
    assert o.include_properties is True
    assert o.pull_batch_size == 5
    assert o.fail_on_data_loss is False


def test_spark_prefixed_options_are_ignored():
    assert src(**{"spark.sql.foo": "bar"}).topics == ("orders",)


def test_every_known_source_option_is_accepted():
    values = {
        "nameservers": NS, "nameserver": NS, "namesrvaddr": NS, "subscribe": "orders",
        "topic": "orders", "startingoffsets": "earliest", "startingtimestamp": "1",
        "endingoffsets": "latest", "endingtimestamp": "2", "minpartitions": "2",
        "maxrecordsperpartition": "3", "failondataloss": "true", "tagexpression": "A",
        "subexpression": "A", "includeproperties": "false", "consumergroup": "g",
        "accesskey": "a", "secretkey": "s", "pullbatchsize": "10", "pulltimeoutms": "10",
        "path": "x",
    }
    streaming_only = {"maxoffsetspertrigger", "maxmessagespertrigger"}
    alternatives = {"subscribepattern", "topicpattern", "assign"}
    assert set(values) | streaming_only | alternatives == SOURCE_OPTIONS
    o = parse_source_options(values, streaming=False)
    assert o.min_partitions == 2 and o.max_records_per_partition == 3 and o.tag_expression == "A"


# --- subscribe / subscribePattern / assign ---------------------------------------------------


def test_assign_is_parsed_with_sorted_unique_queue_ids():
    o = parse_source_options({"nameServers": NS,
                              "assign": '{"orders": {"broker-a": [3, 1, 1], "broker-b": [0]}}'}, False)
    assert o.assign == {"orders": {"broker-a": [1, 3], "broker-b": [0]}}
    assert o.topics == () and o.pattern is None
    assert o.matches("orders") and not o.matches("other")


@pytest.mark.parametrize("opts, named", [
    ({}, "none"),
    ({"subscribe": "a", "subscribePattern": "a.*"}, "subscribe, subscribePattern"),
    ({"subscribe": "a", "assign": '{"a": {"b": [0]}}'}, "subscribe, assign"),
    ({"topicPattern": "a.*", "assign": '{"a": {"b": [0]}}'}, "subscribePattern, assign"),
    ({"topic": "a", "subscribePattern": "x", "assign": '{"a": {"b": [0]}}'},
     "subscribe, subscribePattern, assign"),
])
def test_exactly_one_of_subscribe_pattern_assign(opts, named):
    msg = src_error(base={"nameServers": NS, **opts})
    assert "exactly one of" in msg and f"got {named}" in msg


def test_empty_subscribe_list_is_refused():
    assert "lists no topic" in src_error(subscribe=" , ,")


@pytest.mark.parametrize("topic", ["bad topic", "a/b", "x" * 128, "t\u00e9", "a.b"])
def test_invalid_topic_names_are_refused(topic):
    msg = src_error(subscribe=f"ok,{topic}")
    assert "subscribe" in msg and topic[:40] in msg


@pytest.mark.parametrize("option", ["startingOffsets", "endingOffsets"])
def test_invalid_topic_names_in_offset_json_are_refused(option):
    msg = src_error(**{option: '{"bad topic": {"b": {"0": 1}}}'})
    assert option in msg and "bad topic" in msg


def test_invalid_topic_names_in_assign_are_refused():
    msg = src_error(base={"nameServers": NS, "assign": '{"a/b": {"broker-a": [0]}}'})
    assert "assign" in msg and "a/b" in msg


def test_invalid_pattern_is_refused():
    assert "subscribePattern" in src_error(base={"nameServers": NS, "subscribePattern": "a("})


@pytest.mark.parametrize("pattern", ["a{99999999999}", "(" * 5000 + ")" * 5000])
def test_pathological_patterns_are_refused_with_an_option_error(pattern):
    assert "subscribePattern" in src_error(base={"nameServers": NS, "subscribePattern": pattern})


@pytest.mark.parametrize("value, named", [
    ("[0]", "must be JSON like"),
    ("{}", "must be JSON like"),
    ('{"a": []}', "must map broker names"),
    ('{"a": {}}', "must map broker names"),
    ('{"a": {"b": []}}', "must list queue ids"),
    ('{"a": {"b": 0}}', "must list queue ids"),
    ('{"a": {"b": ["x"]}}', "is not an integer"),
    ('{"a": {"b": [-1]}}', "queue id must be >= 0"),
    ("{not json", "not valid JSON"),
])
def test_malformed_assign_is_refused(value, named):
    msg = src_error(base={"nameServers": NS, "assign": value})
    assert msg.startswith("option assign") and named in msg


# --- aliases, unknown names, required options ------------------------------------------------


@pytest.mark.parametrize("a, b", [
    ("nameServers", "namesrvAddr"), ("subscribe", "topic"),
    ("maxOffsetsPerTrigger", "maxMessagesPerTrigger"), ("tagExpression", "subExpression"),
])
def test_aliases_with_different_values_are_refused(a, b):
    base = {"nameServers": NS, "subscribe": "orders"}
    base[a] = "10" if "Trigger" in a else "h1:1" if a == "nameServers" else "x1"
    base[b] = "20" if "Trigger" in b else "h2:2" if b == "namesrvAddr" else "x2"
    msg = src_error(streaming=True, base=base)
    assert "aliases" in msg and a.lower() in msg.lower() and b.lower() in msg.lower()


def test_aliases_with_the_same_value_are_accepted():
    o = parse_source_options({"nameServers": NS, "namesrvAddr": NS, "subscribe": "t", "topic": "t"},
                             False)
    assert o.name_servers == (NS,) and o.topics == ("t",)


def test_unknown_options_are_all_listed():
    msg = src_error(bogus="1", Zeta="2", subscribe="orders")
    assert "unknown option(s) for the tidemq source: bogus, zeta;" in msg
    assert "subscribe" in msg  # the known names are listed too


def test_kafka_only_options_are_unknown():
    assert "kafka.bootstrap.servers" in src_error(**{"kafka.bootstrap.servers": "h:1"})


def test_name_servers_are_required():
    msg = src_error(base={"subscribe": "orders"})
    assert "nameServers is required" in msg


@pytest.mark.parametrize("value", ["nohostport", "host:", "host:port", ";"])
def test_bad_name_server_address_is_refused(value):
    assert "nameServers" in src_error(nameServers=value)


# --- starting / ending offsets ---------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
def test_starting_offsets_earliest(streaming):
    assert src(streaming, startingOffsets=" EARLIEST ").starting == "earliest"


def test_starting_offsets_latest_for_streaming():
    assert src(True, startingOffsets="latest").starting == "latest"


def test_starting_offsets_latest_is_refused_for_batch():
    assert "startingOffsets: 'latest' is not allowed" in src_error(startingOffsets="latest")


def test_starting_offsets_json_with_earliest_and_latest_markers_for_streaming():
    o = src(True, startingOffsets='{"orders": {"broker-a": {"0": 5, "1": -2, "2": -1}}}')
    assert o.starting == {"orders": {"broker-a": {0: 5, 1: EARLIEST, 2: LATEST}}}


def test_starting_offsets_json_with_minus_one_is_refused_for_batch():
    msg = src_error(startingOffsets='{"orders": {"broker-a": {"0": -1}}}')
    assert "startingOffsets" in msg and "not allowed" in msg


def test_starting_offsets_json_with_minus_two_is_allowed_for_batch():
    assert src(startingOffsets='{"orders": {"b": {"3": -2}}}').starting == {"orders": {"b": {3: -2}}}


def test_ending_offsets_earliest_is_refused():
    assert "endingOffsets: 'earliest' is not allowed" in src_error(endingOffsets="earliest")
    msg = src_error(endingOffsets='{"orders": {"b": {"0": -2}}}')
    assert "endingOffsets" in msg and "not allowed" in msg


@pytest.mark.parametrize("opt", [{"endingOffsets": "latest"}, {"endingTimestamp": "5"}])
def test_ending_options_are_refused_for_streaming(opt):
    assert "batch reads only" in src_error(streaming=True, **opt)


def test_max_offsets_per_trigger_is_refused_for_batch():
    assert "maxOffsetsPerTrigger is for streaming reads only" in src_error(maxOffsetsPerTrigger="5")
    assert "streaming reads only" in src_error(maxMessagesPerTrigger="5")


@pytest.mark.parametrize("value, fragment", [
    ("{bad", "not valid JSON"),
    ("[" * 20000, "not valid JSON"),
    ('{"orders": ' * 20000, "not valid JSON"),
    ("[]", "must be earliest, latest or JSON"),
    ("{}", "must be earliest, latest or JSON"),
    ("5", "must be earliest, latest or JSON"),
    ('{"orders": 5}', "must map broker names"),
    ('{"orders": {"b": [1]}}', "must map queue ids"),
    ('{"orders": {"b": {"x": 1}}}', "is not an integer"),
    ('{"orders": {"b": {"-1": 1}}}', "queue id must be >= 0"),
    ('{"orders": {"b": {"0": -3}}}', "must be >= 0, or -2"),
    ('{"orders": {"b": {"0": "5"}}}', "must be >= 0, or -2"),
    ('{"orders": {"b": {"0": 1.5}}}', "must be >= 0, or -2"),
    ('{"orders": {"b": {"0": true}}}', "must be >= 0, or -2"),
    ('{"orders": {"b": {"0": null}}}', "must be >= 0, or -2"),
])
def test_malformed_starting_offsets_name_the_option(value, fragment):
    msg = src_error(True, startingOffsets=value)
    assert "startingOffsets" in msg and fragment in msg


@pytest.mark.parametrize("option, value", [
    ("minPartitions", "two"), ("minPartitions", "0"), ("maxRecordsPerPartition", "-1"),
    ("pullBatchSize", "1.5"), ("pullBatchSize", "0"), ("pullTimeoutMs", "x"),
    ("startingTimestamp", "-1"), ("startingTimestamp", "yesterday"), ("endingTimestamp", "-5"),
    ("failOnDataLoss", "yes"), ("includeProperties", "1"),
])
def test_bad_scalar_values_name_the_option(option, value):
    assert option in src_error(**{option: value})


def test_bad_max_offsets_per_trigger_names_the_option():
    assert "maxOffsetsPerTrigger must be >= 1" in src_error(True, maxOffsetsPerTrigger="0")
    assert "maxOffsetsPerTrigger must be an integer" in src_error(True, maxMessagesPerTrigger="ten")


def test_timestamp_zero_is_allowed():
    assert src(startingTimestamp="0").starting_timestamp == 0


def test_pull_batch_size_is_capped_at_the_broker_limit():
    assert src(pullBatchSize=str(MAX_PULL_BATCH)).pull_batch_size == MAX_PULL_BATCH
    msg = src_error(pullBatchSize=str(MAX_PULL_BATCH + 1))
    assert f"pullBatchSize must be <= {MAX_PULL_BATCH}" in msg


@pytest.mark.parametrize("given", [{"accessKey": "AK"}, {"secretKey": "SK"}])
def test_access_key_and_secret_key_go_together(given):
    assert "accessKey and secretKey must be given together" in src_error(**given)


@pytest.mark.parametrize("group", ["bad group", "g/1", "x" * 256])
def test_invalid_consumer_group_is_refused(group):
    assert "consumerGroup" in src_error(consumerGroup=group)


# --- sink options ----------------------------------------------------------------------------


def test_sink_defaults_and_topic_is_optional():
    o = parse_sink_options({"nameServers": NS})
    assert o.name_servers == (NS,)
    assert o.topic is None
    assert o.producer_group == "tidemq-spark-sink"
    assert o.send_batch_size == 256
    assert o.send_timeout_ms == 10_000
    assert o.credentials == Credentials()


def test_every_sink_option_is_parsed():
    o = parse_sink_options({"NAMESRVADDR": NS, "Topic": " orders ", "producerGroup": "pg-1",
                            "sendBatchSize": "32", "sendTimeoutMs": "1500", "accessKey": "a",
                            "secretKey": "s", "checkpointLocation": "/tmp/x", "path": "p"})
    assert o.topic == "orders" and o.producer_group == "pg-1"
    assert o.send_batch_size == 32 and o.send_timeout_ms == 1500
    assert o.credentials == Credentials("a", "s")
    assert {"nameservers", "topic", "producergroup", "sendbatchsize", "sendtimeoutms",
            "accesskey", "secretkey", "checkpointlocation", "path"} <= SINK_OPTIONS


@pytest.mark.parametrize("opts, fragment", [
    ({"producerGroup": "bad group"}, "producerGroup"),
    ({"topic": "a b"}, "topic"),
    ({"sendBatchSize": "0"}, "sendBatchSize must be >= 1"),
    ({"sendBatchSize": "many"}, "sendBatchSize must be an integer"),
    ({"sendTimeoutMs": "-3"}, "sendTimeoutMs"),
    ({"accessKey": "a"}, "accessKey and secretKey"),
    ({"subscribe": "orders"}, "unknown option(s) for the tidemq sink: subscribe"),
])
def test_bad_sink_options_name_the_option(opts, fragment):
    with pytest.raises(SparkOptionError) as info:
        parse_sink_options({"nameServers": NS, **opts})
    assert fragment in str(info.value)


def test_sink_needs_name_servers():
    with pytest.raises(SparkOptionError, match="nameServers is required"):
        parse_sink_options({"topic": "orders"})


def test_option_error_is_a_config_error():
    assert issubclass(SparkOptionError, ConfigError)


# --- no input raises anything but a ConfigError ----------------------------------------------

_names = st.sampled_from(sorted(SOURCE_OPTIONS | SINK_OPTIONS) + ["bogus", "Subscribe", "TOPIC"])
_json_offsets = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**70) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=6) | st.integers(-3, 9).map(str), inner, max_size=3),
    max_leaves=8,
).map(json.dumps)
_values = st.text(max_size=30) | st.integers(-3, 2**40).map(str) | _json_offsets | st.sampled_from(
    ["earliest", "latest", "true", "false", NS, "orders", ".*", "a(", "1025"])
_option_dicts = st.dictionaries(_names, _values, max_size=6)


@settings(max_examples=150, deadline=None)
@given(opts=_option_dicts, streaming=st.booleans(), base=st.booleans())
def test_arbitrary_source_options_raise_only_config_errors(opts, streaming, base):
    full = {"nameServers": NS, "subscribe": "orders", **opts} if base else opts
    try:
        o = parse_source_options(full, streaming)
    except ConfigError:
        return
    assert o.name_servers
    assert sum(x is not None and x != () for x in (o.topics or None, o.pattern, o.assign)) == 1
    assert 1 <= o.pull_batch_size <= MAX_PULL_BATCH


@settings(max_examples=100, deadline=None)
@given(opts=_option_dicts, base=st.booleans())
def test_arbitrary_sink_options_raise_only_config_errors(opts, base):
    full = {"nameServers": NS, **opts} if base else opts
    try:
        o = parse_sink_options(full)
    except ConfigError:
        return
    assert o.name_servers and o.send_batch_size >= 1
