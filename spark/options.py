"""Options of the ``tidemq`` Spark data source, parsed once into typed values.

Spark hands a data source its options as a case-insensitive dict of strings. Names follow Spark's
Kafka source wherever the concept is the same (``subscribe``, ``startingOffsets``,
``maxOffsetsPerTrigger`` ...), RocketMQ's names for RocketMQ-only concepts (``nameServers``,
``tagExpression``, ``consumerGroup``), and the old rocketmq-spark connector's names are accepted as
aliases. Parsing is pure: a bad value raises :class:`~tidemq.errors.ConfigError` with a sentence that
names the option and shows a valid value, before any connection is made.

Offsets in JSON options use the shape ``{"topic": {"broker": {"queueId": offset}}}`` (the old
connector's); ``-2`` means earliest and ``-1`` latest, like Kafka.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from tidemq.client.config import parse_name_servers
from tidemq.client.validation import check_group, check_topic_name
from tidemq.errors import ConfigError, TideMQError

EARLIEST = -2
LATEST = -1

# topic -> broker -> queueId -> offset (or EARLIEST / LATEST)
OffsetSpec = dict[str, dict[str, dict[int, int]]]
# topic -> broker -> queueIds
Assignment = dict[str, dict[str, list[int]]]

_ALIASES = {
    "nameservers": ("nameservers", "nameserver", "namesrvaddr"),
    "subscribe": ("subscribe", "topic"),
    "subscribepattern": ("subscribepattern", "topicpattern"),
    "maxoffsetspertrigger": ("maxoffsetspertrigger", "maxmessagespertrigger"),
    "tagexpression": ("tagexpression", "subexpression"),
}

SOURCE_OPTIONS = frozenset({
    "nameservers", "nameserver", "namesrvaddr", "subscribe", "topic", "subscribepattern",
    "topicpattern", "assign", "startingoffsets", "startingtimestamp", "endingoffsets",
    "endingtimestamp", "maxoffsetspertrigger", "maxmessagespertrigger", "minpartitions",
    "maxrecordsperpartition", "failondataloss", "tagexpression", "subexpression",
    "includeproperties", "consumergroup", "accesskey", "secretkey", "pullbatchsize",
    "pulltimeoutms", "path",
})

SINK_OPTIONS = frozenset({
    "nameservers", "nameserver", "namesrvaddr", "topic", "producergroup", "sendbatchsize",
    "sendtimeoutms", "accesskey", "secretkey", "checkpointlocation", "path",
    "queryname",  # Spark passes a streaming query's name to its sink as an option
})

MAX_PULL_BATCH = 1024  # the broker's cap on messages per PULL_MESSAGE (RocketMQ's too)


class SparkOptionError(ConfigError):
    """An option of the ``tidemq`` data source is missing or malformed."""


@dataclass(frozen=True, slots=True)
class Credentials:
    access_key: str | None = None
    secret_key: str | None = None


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """What a read (batch or streaming) asked for. Exactly one of topics/pattern/assign is set."""

    name_servers: tuple[str, ...]
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: Assignment | None = None
    starting: str | OffsetSpec = "latest"  # "earliest" | "latest" | per-queue offsets
    starting_timestamp: int | None = None
    ending: str | OffsetSpec = "latest"
    ending_timestamp: int | None = None
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    tag_expression: str = "*"
    include_properties: bool = False
    consumer_group: str | None = None
    credentials: Credentials = Credentials()
    pull_batch_size: int = MAX_PULL_BATCH
    pull_timeout_ms: int = 10_000

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is one this read subscribes to (system topics never match a pattern)."""
        if self.assign is not None:
            return topic in self.assign
        if self.pattern is not None:
            return not _is_system_topic(topic) and re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics


@dataclass(frozen=True, slots=True)
class SinkOptions:
    name_servers: tuple[str, ...]
    topic: str | None = None
    producer_group: str = "tidemq-spark-sink"
    send_batch_size: int = 256
    send_timeout_ms: int = 10_000
    credentials: Credentials = Credentials()


def _is_system_topic(topic: str) -> bool:
    return (topic.startswith(("%RETRY%", "%DLQ%", "rmq_sys_", "RMQ_SYS_"))
            or topic in {"SCHEDULE_TOPIC_XXXX", "TBW102", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC"}
            or "_REPLY_TOPIC" in topic)


class _Opts:
    """Case-insensitive view of Spark's option strings, with aliases and unknown-name checks."""

    def __init__(self, options: Mapping[str, str], known: frozenset[str], what: str) -> None:
        self.raw = {str(k).lower(): v for k, v in options.items()}
        unknown = sorted(k for k in self.raw if k not in known and not k.startswith("spark."))
        if unknown:
            raise SparkOptionError(
                f"unknown option(s) for the tidemq {what}: {', '.join(unknown)}; known options are "
                f"{', '.join(sorted(known - {'path'}))} (names are case-insensitive)")

    def get(self, name: str) -> str | None:
        names = _ALIASES.get(name, (name,))
        given = [(n, self.raw[n]) for n in names if self.raw.get(n) not in (None, "")]
        if len({v for _, v in given}) > 1:
            raise SparkOptionError(
                f"options {' and '.join(n for n, _ in given)} are aliases but have different values")
        return given[0][1] if given else None

    def int(self, name: str, shown: str, minimum: int = 1) -> int | None:
        value = self.get(name)
        if value is None:
            return None
        try:
            n = int(str(value).strip())
        except ValueError:
            raise SparkOptionError(f"option {shown} must be an integer, got {value!r}") from None
        if n < minimum:
            raise SparkOptionError(f"option {shown} must be >= {minimum}, got {n}")
        return n

    def bool(self, name: str, shown: str, default: bool) -> bool:
        value = self.get(name)
        if value is None:
            return default
        text = str(value).strip().lower()
        if text not in ("true", "false"):
            raise SparkOptionError(f"option {shown} must be true or false, got {value!r}")
        return text == "true"

    def credentials(self) -> Credentials:
        ak, sk = self.get("accesskey"), self.get("secretkey")
        if (ak is None) != (sk is None):
            raise SparkOptionError("options accessKey and secretKey must be given together")
        return Credentials(ak, sk)

    def name_servers(self) -> tuple[str, ...]:
        value = self.get("nameservers")
        if value is None:
            raise SparkOptionError(
                "option nameServers is required, e.g. .option('nameServers', '127.0.0.1:9876')")
        try:
            return parse_name_servers(value)
        except ConfigError as exc:
            raise SparkOptionError(f"option nameServers: {exc}") from None


def _json(value: str, shown: str, example: str) -> object:
    try:
        return json.loads(value)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting too deep
        raise SparkOptionError(f"option {shown} is not valid JSON ({exc}); expected e.g. {example}") from None


_OFFSETS_EXAMPLE = '{"orders": {"broker-a": {"0": 23, "1": -2}}}'


def parse_offset_spec(value: str, shown: str, allow_latest: bool = True,
                      allow_earliest: bool = True) -> str | OffsetSpec:
    """``earliest``, ``latest`` or per-queue JSON offsets (``-2`` earliest, ``-1`` latest)."""
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        word = text.lower()
        if word == "latest" and not allow_latest:
            raise SparkOptionError(f"option {shown}: 'latest' is not allowed here")
        if word == "earliest" and not allow_earliest:
            raise SparkOptionError(f"option {shown}: 'earliest' is not allowed here")
        return word
    obj = _json(text, shown, _OFFSETS_EXAMPLE)
    out: OffsetSpec = {}
    if not isinstance(obj, dict) or not obj:
        raise SparkOptionError(f"option {shown} must be earliest, latest or JSON like {_OFFSETS_EXAMPLE}")
    for topic, brokers in obj.items():
        _topic(topic, shown)
        if not isinstance(brokers, dict):
            raise SparkOptionError(f"option {shown}: topic {topic!r} must map broker names to "
                                   f"queue offsets, e.g. {_OFFSETS_EXAMPLE}")
        for broker, queues in brokers.items():
            if not isinstance(queues, dict):
                raise SparkOptionError(f"option {shown}: broker {broker!r} of topic {topic!r} must "
                                       f"map queue ids to offsets, e.g. {_OFFSETS_EXAMPLE}")
            for qid, off in queues.items():
                q = _queue_id(qid, shown)
                if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
                    raise SparkOptionError(f"option {shown}: offset of {topic}/{broker}/{qid} must be "
                                           f">= 0, or -2 (earliest) / -1 (latest), got {off!r}")
                if off == LATEST and not allow_latest or off == EARLIEST and not allow_earliest:
                    raise SparkOptionError(f"option {shown}: offset {off} of {topic}/{broker}/{qid} "
                                           "is not allowed here")
                out.setdefault(topic, {}).setdefault(str(broker), {})[q] = off
    return out


def _queue_id(qid: object, shown: str) -> int:
    try:
        q = int(str(qid))
    except ValueError:
        raise SparkOptionError(f"option {shown}: queue id {qid!r} is not an integer") from None
    if q < 0:
        raise SparkOptionError(f"option {shown}: queue id must be >= 0, got {q}")
    return q


def _topic(topic: object, shown: str) -> str:
    if not isinstance(topic, str):
        raise SparkOptionError(f"option {shown}: topic {topic!r} is not a string")
    try:
        return check_topic_name(topic)
    except TideMQError as exc:
        raise SparkOptionError(f"option {shown}: {exc}") from None


def parse_assign(value: str) -> Assignment:
    example = '{"orders": {"broker-a": [0, 1]}}'
    obj = _json(value, "assign", example)
    if not isinstance(obj, dict) or not obj:
        raise SparkOptionError(f"option assign must be JSON like {example}")
    out: Assignment = {}
    for topic, brokers in obj.items():
        _topic(topic, "assign")
        if not isinstance(brokers, dict) or not brokers:
            raise SparkOptionError(f"option assign: topic {topic!r} must map broker names to queue "
                                   f"id lists, e.g. {example}")
        for broker, queues in brokers.items():
            if not isinstance(queues, list) or not queues:
                raise SparkOptionError(f"option assign: broker {broker!r} of topic {topic!r} must "
                                       f"list queue ids, e.g. {example}")
            out.setdefault(topic, {})[str(broker)] = sorted({_queue_id(q, "assign") for q in queues})
    return out


def _timestamp(opts: _Opts, name: str, shown: str) -> int | None:
    value = opts.int(name, shown, minimum=0)
    return value


def parse_source_options(options: Mapping[str, str], streaming: bool) -> SourceOptions:
    """Parse and check a read's options. Batch reads default to earliest..latest, streaming
    reads start at latest (like Kafka); ``endingOffsets`` is batch-only."""
    opts = _Opts(options, SOURCE_OPTIONS, "source")
    name_servers = opts.name_servers()
    subscribe, pattern, assign_text = (opts.get("subscribe"), opts.get("subscribepattern"),
                                       opts.get("assign"))
    given = [n for n, v in (("subscribe", subscribe), ("subscribePattern", pattern),
                            ("assign", assign_text)) if v is not None]
    if len(given) != 1:
        raise SparkOptionError(
            "exactly one of the options subscribe (alias topic), subscribePattern or assign is "
            f"required, got {', '.join(given) or 'none'}; e.g. .option('subscribe', 'orders')")
    topics: tuple[str, ...] = ()
    assign = None
    if subscribe is not None:
        topics = tuple(dict.fromkeys(_topic(t.strip(), "subscribe")
                                     for t in subscribe.split(",") if t.strip()))
        if not topics:
            raise SparkOptionError("option subscribe lists no topic; e.g. 'orders,payments'")
    if pattern is not None:
        try:
            re.compile(pattern)
        except (re.error, OverflowError, RecursionError) as exc:  # a{99999999999}, ((((...
            raise SparkOptionError(f"option subscribePattern is not a valid regex: {exc}") from None
    if assign_text is not None:
        assign = parse_assign(assign_text)

    starting_text = opts.get("startingoffsets")
    starting: str | OffsetSpec = "latest" if streaming else "earliest"
    if starting_text is not None:
        starting = parse_offset_spec(starting_text, "startingOffsets", allow_latest=streaming)
    ending: str | OffsetSpec = "latest"
    ending_text = opts.get("endingoffsets")
    ending_ts = _timestamp(opts, "endingtimestamp", "endingTimestamp")
    if streaming and (ending_text is not None or ending_ts is not None):
        raise SparkOptionError("options endingOffsets/endingTimestamp are for batch reads only; a "
                               "streaming query runs until stopped")
    if ending_text is not None:
        ending = parse_offset_spec(ending_text, "endingOffsets", allow_earliest=False)

    max_per_trigger = opts.int("maxoffsetspertrigger", "maxOffsetsPerTrigger")
    if max_per_trigger is not None and not streaming:
        raise SparkOptionError("option maxOffsetsPerTrigger is for streaming reads only")
    group = opts.get("consumergroup")
    if group is not None:
        try:
            check_group(group)
        except TideMQError as exc:
            raise SparkOptionError(f"option consumerGroup: {exc}") from None
    pull_batch = opts.int("pullbatchsize", "pullBatchSize") or MAX_PULL_BATCH
    if pull_batch > MAX_PULL_BATCH:
        raise SparkOptionError(f"option pullBatchSize must be <= {MAX_PULL_BATCH}, got {pull_batch}")
    return SourceOptions(
        name_servers=name_servers,
        topics=topics,
        pattern=pattern,
        assign=assign,
        starting=starting,
        starting_timestamp=_timestamp(opts, "startingtimestamp", "startingTimestamp"),
        ending=ending,
        ending_timestamp=ending_ts,
        max_offsets_per_trigger=max_per_trigger,
        min_partitions=opts.int("minpartitions", "minPartitions"),
        max_records_per_partition=opts.int("maxrecordsperpartition", "maxRecordsPerPartition"),
        fail_on_data_loss=opts.bool("failondataloss", "failOnDataLoss", True),
        tag_expression=(opts.get("tagexpression") or "*").strip() or "*",
        include_properties=opts.bool("includeproperties", "includeProperties", False),
        consumer_group=group,
        credentials=opts.credentials(),
        pull_batch_size=pull_batch,
        pull_timeout_ms=opts.int("pulltimeoutms", "pullTimeoutMs") or 10_000,
    )


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = _Opts(options, SINK_OPTIONS, "sink")
    topic = opts.get("topic")
    group = opts.get("producergroup") or "tidemq-spark-sink"
    try:
        check_group(group)
    except TideMQError as exc:
        raise SparkOptionError(f"option producerGroup: {exc}") from None
    return SinkOptions(
        name_servers=opts.name_servers(),
        topic=_topic(topic.strip(), "topic") if topic is not None else None,
        producer_group=group,
        send_batch_size=opts.int("sendbatchsize", "sendBatchSize") or 256,
        send_timeout_ms=opts.int("sendtimeoutms", "sendTimeoutMs") or 10_000,
        credentials=opts.credentials(),
    )
