"""The metadata record codec (issue 17): what a replicated broker group keeps besides messages
(topics, subscription groups, consumer offsets, delay/timer and transaction-checker progress),
as records of the system topic :data:`METADATA_TOPIC` in the replicated CommitLog.

A record's body is one JSON object ``{"version": 1, "kind": "...", ...}`` holding one change;
its TAGS property repeats the kind for people reading the log with tools. The codec is pure
(bytes in, values out, no files or clocks) and raises only :class:`MetadataCodecError`: a body
of an unknown version or kind is refused with a sentence, never guessed at.

Invariants:
- Every change is a *value to set*, not a delta: applying a record twice, or applying a run of
  records again from an earlier point, ends in the same state (followers and recovery rely on it).
- A body is at most :data:`MAX_BODY_BYTES`, checked before parsing; an offset batch longer than
  :data:`MAX_OFFSETS_PER_RECORD` entries is split by the writer (:func:`split_offsets`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.topics import METADATA_TOPIC, TopicConfig
from tidemq.errors import CodecError

__all__ = ["METADATA_TOPIC"]  # defined with the other system topics; re-exported here

METADATA_QUEUE = 0  # the metadata topic's one queue
VERSION = 1
MAX_BODY_BYTES = 1 << 20  # checked before parsing; a split offset batch stays well below it
# Group names are at most 255 and topics 127 ASCII characters: 2048 entries stay below the limit.
MAX_OFFSETS_PER_RECORD = 2048
MAX_INT64 = 2**63 - 1


class MetadataCodecError(CodecError):
    """Bytes that are not a metadata record this broker understands."""


@dataclass(frozen=True, slots=True)
class TopicSet:
    """A topic created or its configuration replaced."""

    config: TopicConfig


@dataclass(frozen=True, slots=True)
class TopicDeleted:
    """A topic deleted (its consume queues are dropped with it)."""

    name: str


@dataclass(frozen=True, slots=True)
class GroupSet:
    """A subscription group created or its settings replaced."""

    config: SubscriptionGroupConfig


@dataclass(frozen=True, slots=True)
class GroupDeleted:
    name: str


@dataclass(frozen=True, slots=True)
class OffsetEntry:
    """A group's next offset to consume on one queue."""

    group: str
    topic: str
    queue_id: int
    offset: int


@dataclass(frozen=True, slots=True)
class OffsetsCommitted:
    """The offsets committed since the previous batch (the latest value per queue)."""

    entries: tuple[OffsetEntry, ...]


@dataclass(frozen=True, slots=True)
class OffsetsDropped:
    """Every committed offset of a topic (``group`` None), of a group (``topic`` None), or of
    one group on one topic, removed."""

    topic: str | None
    group: str | None


@dataclass(frozen=True, slots=True)
class DelayProgress:
    """The delay service's progress: the next SCHEDULE_TOPIC_XXXX queue offset per level
    (``(level, offset)`` pairs) and the delivery timer's lowest undelivered offset."""

    levels: tuple[tuple[int, int], ...]
    timer: int


@dataclass(frozen=True, slots=True)
class TransactionProgress:
    """The transaction checker's progress in the half and op queues."""

    half: int
    op: int


Change = (TopicSet | TopicDeleted | GroupSet | GroupDeleted | OffsetsCommitted | OffsetsDropped
          | DelayProgress | TransactionProgress)


def kind_of(change: Change) -> str:
    return _KINDS[type(change)]


def encode(change: Change) -> bytes:
    """The record body of ``change``."""
    body: dict[str, Any] = {"version": VERSION, "kind": kind_of(change)}
    if isinstance(change, TopicSet):
        body["config"] = change.config.to_json()
    elif isinstance(change, GroupSet):
        body["config"] = change.config.to_json()
    elif isinstance(change, (TopicDeleted, GroupDeleted)):
        body["name"] = change.name
    elif isinstance(change, OffsetsCommitted):
        body["offsets"] = [[e.group, e.topic, e.queue_id, e.offset] for e in change.entries]
    elif isinstance(change, OffsetsDropped):
        body["topic"] = change.topic
        body["group"] = change.group
    elif isinstance(change, DelayProgress):
        body["levels"] = [list(p) for p in change.levels]
        body["timer"] = change.timer
    else:
        body["half"] = change.half
        body["op"] = change.op
    return orjson.dumps(body)


def decode(data: bytes) -> Change:
    """The change a record body holds. Raises MetadataCodecError for anything else."""
    if len(data) > MAX_BODY_BYTES:
        raise MetadataCodecError(f"a metadata record of {len(data)} bytes is longer than the "
                                 f"{MAX_BODY_BYTES} allowed")
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise MetadataCodecError(f"a metadata record is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise MetadataCodecError("a metadata record is not a JSON object")
    version = body.get("version")
    if version != VERSION:
        raise MetadataCodecError(f"metadata record version {version!r} is not understood by this broker "
                                 f"(it reads version {VERSION}): upgrade every replica of the group to the "
                                 "same TideMQ version")
    kind = body.get("kind")
    parse = _PARSERS.get(kind) if isinstance(kind, str) else None
    if parse is None:
        raise MetadataCodecError(f"metadata record kind {kind!r} is unknown")
    try:
        return parse(body)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise MetadataCodecError(f"metadata record of kind {kind} is malformed: {exc!r}") from None


def split_offsets(entries: Sequence[OffsetEntry]) -> Iterator[OffsetsCommitted]:
    """``entries`` as batches of at most MAX_OFFSETS_PER_RECORD (none for no entries)."""
    for i in range(0, len(entries), MAX_OFFSETS_PER_RECORD):
        yield OffsetsCommitted(tuple(entries[i : i + MAX_OFFSETS_PER_RECORD]))


def _str(v: object, what: str) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError(f"{what} must be a non-empty string, not {v!r}")
    return v


def _opt_str(v: object, what: str) -> str | None:
    return None if v is None else _str(v, what)


def _int(v: object, what: str, low: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_INT64:
        raise ValueError(f"{what} must be an integer in [{low}, 2^63), not {v!r}")
    return v


def _dict(v: object, what: str) -> dict:
    if not isinstance(v, dict):
        raise ValueError(f"{what} must be a JSON object")
    return v


def _list(v: object, what: str) -> list:
    if not isinstance(v, list):
        raise ValueError(f"{what} must be a JSON array")
    return v


def _topic(b: dict) -> TopicSet:
    d = _dict(b["config"], "config")
    _str(d.get("topicName"), "topicName")
    tc = TopicConfig.from_json(d)
    for what, n in (("readQueueNums", tc.read_queue_nums), ("writeQueueNums", tc.write_queue_nums),
                    ("perm", tc.perm), ("topicSysFlag", tc.topic_sys_flag)):
        _int(n, what)
    return TopicSet(tc)


def _group(b: dict) -> GroupSet:
    d = _dict(b["config"], "config")
    _str(d.get("groupName"), "groupName")
    return GroupSet(SubscriptionGroupConfig.from_json(d))


def _offsets(b: dict) -> OffsetsCommitted:
    rows = _list(b["offsets"], "offsets")
    if len(rows) > MAX_OFFSETS_PER_RECORD:
        raise ValueError(f"{len(rows)} offsets in one record, at most {MAX_OFFSETS_PER_RECORD}")
    out = []
    for row in rows:
        g, t, q, o = _list(row, "an offset entry")
        out.append(OffsetEntry(_str(g, "group"), _str(t, "topic"), _int(q, "queue id"), _int(o, "offset")))
    return OffsetsCommitted(tuple(out))


def _dropped(b: dict) -> OffsetsDropped:
    topic, group = _opt_str(b.get("topic"), "topic"), _opt_str(b.get("group"), "group")
    if topic is None and group is None:
        raise ValueError("an offsets drop names neither a topic nor a group")
    return OffsetsDropped(topic, group)


def _delay(b: dict) -> DelayProgress:
    levels = []
    for pair in _list(b["levels"], "levels"):
        level, offset = _list(pair, "a level entry")
        levels.append((_int(level, "level", 1), _int(offset, "level offset")))
    return DelayProgress(tuple(levels), _int(b["timer"], "timer"))


_KINDS: dict[type, str] = {
    TopicSet: "topic.set", TopicDeleted: "topic.deleted", GroupSet: "group.set", GroupDeleted: "group.deleted",
    OffsetsCommitted: "offsets.committed", OffsetsDropped: "offsets.dropped", DelayProgress: "delay.progress",
    TransactionProgress: "transaction.progress",
}
_PARSERS: dict[str, Any] = {
    "topic.set": _topic,
    "topic.deleted": lambda b: TopicDeleted(_str(b["name"], "name")),
    "group.set": _group,
    "group.deleted": lambda b: GroupDeleted(_str(b["name"], "name")),
    "offsets.committed": _offsets,
    "offsets.dropped": _dropped,
    "delay.progress": _delay,
    "transaction.progress": lambda b: TransactionProgress(_int(b["half"], "half"), _int(b["op"], "op")),
}
