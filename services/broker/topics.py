"""Topic configurations of one broker, persisted in config/topics.json.

Invariants: names are valid RocketMQ topic names; the data version counter grows on every change,
so name servers re-read queue data only when it moves. ``on_change`` (set by a replicated broker:
tidemq.broker.ha.metalog) hears of every create, update and delete made through ``put`` and
``delete``, after the table changed; the system topics a broker ensures at load are not changes.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tidemq.broker.store.jsonfile import read_json, write_json_atomic
from tidemq.remoting.acl import loggable  # noqa: F401  (re-exported for the broker)
from tidemq.remoting.codes import Perm

log = logging.getLogger(__name__)

TOPIC_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+")  # fullmatch: "$" would allow a trailing "\n"
MAX_TOPIC_LENGTH = 127
DEFAULT_TOPIC = "TBW102"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
# Replicated metadata changes (tidemq.broker.ha.metadata); only the broker itself writes it.
METADATA_TOPIC = "rmq_sys_TIDEMQ_METADATA"
REPLY_TOPIC_SUFFIX = "_REPLY_TOPIC"  # <cluster>_REPLY_TOPIC carries request-reply replies
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
# Topics clients may not send to (RocketMQ TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET).
NOT_ALLOWED_SEND = frozenset(
    {
        SCHEDULE_TOPIC,
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        SELF_TEST_TOPIC,
        OFFSET_MOVED_EVENT,
        METADATA_TOPIC,
    }
)


_READ = int(Perm.READ)  # plain ints on the send/pull path (bench/produce_consume.py)
_WRITE = int(Perm.WRITE)


def validate_topic_name(name: str) -> str | None:
    """Return an error sentence, or None when ``name`` is a valid topic name."""
    if not name or not name.strip():
        return "the topic name is blank"
    if len(name.encode()) > MAX_TOPIC_LENGTH:
        return f"the topic name is longer than {MAX_TOPIC_LENGTH} bytes"
    if not TOPIC_PATTERN.fullmatch(name):
        return f"the topic name {name!r} contains characters other than [%|a-zA-Z0-9_-]"
    return None


MAX_GROUP_LENGTH = 255  # RocketMQ Validators.CHARACTER_MAX_LENGTH
_GROUP_PATTERN_TEXT = "^[%|a-zA-Z0-9_-]+$"  # as RocketMQ words it


def validate_group_name(name: str) -> str | None:
    """Return RocketMQ's sentence for an invalid consumer/producer group name (Validators.checkGroup:
    blank, longer than 255, characters outside ``%|a-zA-Z0-9_-``), else None. A group may not
    start with ``%RETRY%`` or ``%DLQ%``: those prefixes name a group's topics, never a group."""
    if not name or not name.strip():
        return "the specified group is blank"
    if len(name) > MAX_GROUP_LENGTH:
        return f"the specified group[{loggable(name)}] is longer than group max length {MAX_GROUP_LENGTH}."
    if not TOPIC_PATTERN.fullmatch(name):
        return (f"the specified group[{loggable(name)}] contains illegal characters, allowing only "
                f"{_GROUP_PATTERN_TEXT}")
    if name.startswith((RETRY_PREFIX, DLQ_PREFIX)):
        return (f"the specified group[{loggable(name)}] starts with {RETRY_PREFIX} or {DLQ_PREFIX}, "
                "which name a group's retry and dead-letter topics")
    return None


def group_of(topic: str) -> str | None:
    """The group a ``%RETRY%<group>`` or ``%DLQ%<group>`` topic belongs to, else None."""
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if topic.startswith(prefix):
            return topic[len(prefix):]
    return None


# Topics that hold other topics' messages until they are due or committed (delay levels, the timer,
# transactions): reading them reads those topics, so only admin accounts may (tidemq.broker.acl).
_HOLDING_TOPICS = frozenset({SCHEDULE_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                             "TRANS_CHECK_MAX_TIME_TOPIC"})


def is_holding_topic(name: str) -> bool:
    """Whether ``name`` holds messages of other topics (``REAL_TOPIC`` names theirs)."""
    return name in _HOLDING_TOPICS or name.startswith("rmq_sys_")


def is_system_topic(name: str) -> bool:
    return name in NOT_ALLOWED_SEND or name.startswith("rmq_sys_") or name == DEFAULT_TOPIC


# Topic attributes a broker accepts (RocketMQ 5's TopicAttributes), each with its allowed values.
# message.type says what a topic carries; absent, RocketMQ reads it as NORMAL.
MESSAGE_TYPE_ATTRIBUTE = "message.type"
TOPIC_ATTRIBUTES: dict[str, frozenset[str]] = {
    MESSAGE_TYPE_ATTRIBUTE: frozenset({"UNSPECIFIED", "NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED"}),
}


def alter_attributes(current: tuple[tuple[str, str], ...],
                     changes: tuple[tuple[str, str | None], ...]) -> tuple[tuple[str, str], ...]:
    """``current`` with ``changes`` applied ((key, None) removes), sorted by key; ValueError with a
    sentence for a key this broker does not know or a value outside the key's allowed set."""
    out = dict(current)
    for key, value in changes:
        allowed = TOPIC_ATTRIBUTES.get(key)
        if allowed is None:
            raise ValueError(f"unsupported topic attribute {key!r}; supported: {', '.join(sorted(TOPIC_ATTRIBUTES))}")
        if value is None:
            out.pop(key, None)
        elif value not in allowed:
            raise ValueError(f"topic attribute {key}={value!r} is invalid; use one of {', '.join(sorted(allowed))}")
        else:
            out[key] = value
    return tuple(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs: hashable, comparable

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": self.topic_filter_type,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
        }
        if self.attributes:  # written only when set, as bodies without attributes were before
            d["attributes"] = dict(self.attributes)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "TopicConfig":
        return cls(
            topic_name=str(d["topicName"]),
            read_queue_nums=int(d.get("readQueueNums", 16)),
            write_queue_nums=int(d.get("writeQueueNums", 16)),
            perm=int(d.get("perm", 6)),
            topic_filter_type=str(d.get("topicFilterType", "SINGLE_TAG")),
            topic_sys_flag=int(d.get("topicSysFlag", 0)),
            order=bool(d.get("order", False)),
            attributes=tuple(sorted((str(k), str(v)) for k, v in (d.get("attributes") or {}).items())),
        )

    @property
    def readable(self) -> bool:
        return bool(self.perm & _READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & _WRITE)

    @property
    def queue_nums(self) -> int:
        return max(self.read_queue_nums, self.write_queue_nums)


class TopicConfigManager:
    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self.topics: dict[str, TopicConfig] = {}
        self.counter = 0
        self.timestamp = int(clock() * 1000)
        # (name, config or None when deleted) after each change through put/delete.
        self.on_change: Callable[[str, TopicConfig | None], None] | None = None
        self.ensured: frozenset[str] = frozenset()  # the broker's own topics (ensure_system_topics)

    def load(self) -> None:
        data = read_json(self.path, None)
        if not data:
            return
        for name, d in (data.get("topicConfigTable") or {}).items():
            self.topics[name] = TopicConfig.from_json(d)
        dv = data.get("dataVersion") or {}
        self.counter = int(dv.get("counter", 0))
        self.timestamp = int(dv.get("timestamp", self.timestamp))
        log.info("loaded %d topic configs from %s", len(self.topics), self.path)

    def ensure_system_topics(self, cluster: str, broker: str, auto_create: bool, default_queues: int) -> None:
        wanted = [
            TopicConfig(SELF_TEST_TOPIC, 1, 1, 6),
            TopicConfig(cluster, 16, 16, 7),
            TopicConfig(broker, 1, 1, 7),
            TopicConfig(OFFSET_MOVED_EVENT, 1, 1, 6),
            TopicConfig(SCHEDULE_TOPIC, 18, 18, 6),
            TopicConfig(cluster + REPLY_TOPIC_SUFFIX, 1, 1, 6),  # request-reply
        ]
        if auto_create:
            wanted.append(TopicConfig(DEFAULT_TOPIC, default_queues, default_queues, 7))
        elif DEFAULT_TOPIC in self.topics:
            del self.topics[DEFAULT_TOPIC]
            self._bump()
        self.ensured = frozenset(tc.topic_name for tc in wanted)
        for tc in wanted:
            if tc.topic_name not in self.topics:
                self.topics[tc.topic_name] = tc
                self._bump()

    def _bump(self) -> None:
        self.counter += 1
        self.timestamp = int(self.clock() * 1000)

    def touch(self) -> None:
        """A new data version without a topic change: name servers rewrite a broker's routes only
        for a new version, so a change of what it registers (its permission) needs one (RocketMQ's
        dataVersion.nextVersion() on a brokerPermission update)."""
        self._bump()

    def get(self, name: str) -> TopicConfig | None:
        return self.topics.get(name)

    def put(self, tc: TopicConfig) -> bool:
        """Create or update; return True when something changed."""
        if self.topics.get(tc.topic_name) == tc:
            return False
        self.topics[tc.topic_name] = tc
        self._bump()
        log.info(
            "topic %s set: read=%d write=%d perm=%d", tc.topic_name, tc.read_queue_nums,
            tc.write_queue_nums, tc.perm,
        )
        if self.on_change is not None:
            self.on_change(tc.topic_name, tc)
        return True

    def create_retry_or_dlq(self, name: str) -> TopicConfig:
        tc = self.topics.get(name)
        if tc is None:
            tc = TopicConfig(name, 1, 1, 6)
            self.put(tc)
        return tc

    def create_from_default(self, name: str, default_topic: str, queue_nums: int) -> TopicConfig | None:
        tmpl = self.topics.get(default_topic)
        if tmpl is None or not tmpl.perm & Perm.INHERIT:
            return None
        q = max(1, min(queue_nums, tmpl.write_queue_nums))
        tc = TopicConfig(name, q, q, tmpl.perm & ~Perm.INHERIT, tmpl.topic_filter_type)
        self.put(tc)
        return tc

    def delete(self, name: str) -> bool:
        if self.topics.pop(name, None) is None:
            return False
        self._bump()
        log.info("topic %s deleted", name)
        if self.on_change is not None:
            self.on_change(name, None)
        return True

    def data_version(self) -> dict[str, int]:
        return {"counter": self.counter, "timestamp": self.timestamp}

    def wrapper(self) -> dict[str, object]:
        return {
            "topicConfigTable": {n: tc.to_json() for n, tc in self.topics.items()},
            "dataVersion": self.data_version(),
        }

    def persist(self) -> None:
        """Blocking: call from a thread."""
        write_json_atomic(self.path, self.wrapper())

    def snapshot(self) -> dict[str, object]:
        return self.wrapper()
