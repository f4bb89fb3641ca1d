"""Producer-side validation: topics, groups, bodies, properties, batches; ClientConfig."""

from __future__ import annotations

import pytest

from tidemq.client.config import ClientConfig, make_config, parse_name_servers
from tidemq.client.validation import (
    check_batch,
    check_body,
    check_group,
    check_message,
    check_properties_size,
    check_send_topic,
    check_topic_name,
)
from tidemq.errors import ClientError, ConfigError
from tidemq.message import Message


@pytest.mark.parametrize("topic", ["TopicTest", "a", "%RETRY%g", "a|b", "x_y-z", "T" * 127])
def test_legal_topic_names_pass(topic):
    assert check_topic_name(topic) == topic


@pytest.mark.parametrize(
    "topic,fragment",
    [("", "blank"), ("   ", "blank"), (None, "blank"), ("has space", "illegal"), ("a.b", "illegal"),
     ("topic/x", "illegal"), ("中文", "illegal"), ("T" * 128, "127")],
)
def test_illegal_topic_names_say_why(topic, fragment):
    with pytest.raises(ClientError, match=fragment):
        check_topic_name(topic)


@pytest.mark.parametrize("topic", ["SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "TBW102", "OFFSET_MOVED_EVENT"])
def test_system_topics_cannot_be_sent_to(topic):
    with pytest.raises(ClientError, match="system topic"):
        check_send_topic(topic)


def test_group_names():
    assert check_group("my-group_1") == "my-group_1"
    for bad in ("", "a b", "g" * 256):
        with pytest.raises(ClientError):
            check_group(bad)


def test_body_rules():
    assert check_body(bytearray(b"x"), 10) == b"x"
    with pytest.raises(ClientError, match="empty"):
        check_body(b"", 10)
    with pytest.raises(ClientError, match="11 bytes"):
        check_body(b"x" * 11, 10)
    with pytest.raises(ClientError, match="bytes, not str"):
        check_body("text", 10)


def test_message_properties_must_not_hold_separators():
    with pytest.raises(ClientError, match="control character"):
        check_message(Message("T", b"x", properties={"a": "b\x01c"}), 100)
    with pytest.raises(ClientError, match="control character"):
        check_message(Message("T", b"x", tags="A\x02B"), 100)
    check_message(Message("T", b"x", tags="A", keys=["k1", "k2"], properties={"p": "v"}), 100)


def test_properties_size_limit():
    check_properties_size("a" * 32767)
    with pytest.raises(ClientError, match="32768 bytes"):
        check_properties_size("a" * 32768)


def test_batch_rules():
    ok = [Message("T", b"1"), Message("T", b"2")]
    assert check_batch(ok, 100) == "T"
    with pytest.raises(ClientError, match="empty"):
        check_batch([], 100)
    with pytest.raises(ClientError, match="one topic"):
        check_batch([Message("T", b"1"), Message("U", b"2")], 100)
    with pytest.raises(ClientError, match="delay"):
        check_batch([Message("T", b"1", properties={"DELAY": "3"})], 100)
    with pytest.raises(ClientError, match="retry topic"):
        check_batch([Message("%RETRY%g", b"1")], 100)


# --- config ------------------------------------------------------------------------------------

def test_name_servers_accept_semicolon_strings_and_lists():
    assert parse_name_servers("a:1;b:2") == ("a:1", "b:2")
    assert parse_name_servers(["a:1", "b:2;c:3", "a:1"]) == ("a:1", "b:2", "c:3")
    assert ClientConfig(name_servers="h:9876; h2:9877").name_servers == ("h:9876", "h2:9877")
    with pytest.raises(ConfigError):
        parse_name_servers("")
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_name_servers("localhost")


def test_config_defaults_match_rocketmq():
    c = ClientConfig()
    assert (c.request_timeout, c.route_refresh_interval, c.heartbeat_interval) == (3.0, 30.0, 30.0)
    assert (c.retry_times_when_send_failed, c.compress_threshold, c.compress_level) == (2, 4096, 5)
    assert c.max_message_size == 4 * 1024 * 1024
    hash(c)  # keys the instance registry


def test_config_rejects_nonsense():
    with pytest.raises(ConfigError):
        ClientConfig(request_timeout=0)
    with pytest.raises(ConfigError):
        ClientConfig(compress_level=10)
    with pytest.raises(ConfigError):
        ClientConfig(instance_name="a@b")


def test_make_config_lets_name_servers_override():
    base = ClientConfig(name_servers="a:1", request_timeout=5)
    c = make_config("b:2", base)
    assert c.name_servers == ("b:2",) and c.request_timeout == 5
    assert make_config(None, base) is base


def test_the_replicated_metadata_topic_is_refused_before_it_leaves_the_client() -> None:
    from tidemq.broker.topics import METADATA_TOPIC  # noqa: PLC0415 (the broker's name, checked once here)

    with pytest.raises(ClientError, match="system topic"):
        check_send_topic(METADATA_TOPIC)
