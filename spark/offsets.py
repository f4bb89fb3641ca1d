"""Offset maps of the Spark source: resolving starts and ends, rate limits and partition plans.

Pure functions over ``{(topic, broker, queueId): offset}`` maps; offsets are *next* offsets (an
exclusive end), so a queue holding messages 0..9 has the range [0, 10). In Spark's checkpoint an
offset map is JSON ``{"topic": {"broker": {"queueId": offset}}}`` with every key sorted: the JVM
keeps offsets as JSON text, so the same map must always serialise to the same string.

Invariants: a plan covers every message in [start, end) of every queue exactly once; a rate limit
never moves a queue backwards nor past its latest offset, and the total it admits equals
``min(limit, backlog)``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import NamedTuple

from tidemq.spark.options import EARLIEST, LATEST, OffsetSpec, SparkOptionError


class QueueKey(NamedTuple):
    topic: str
    broker: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.broker}/{self.queue_id}"


Offsets = dict[QueueKey, int]


@dataclass(frozen=True, slots=True)
class QueueRange:
    """What a queue holds now: offsets [min_offset, max_offset)."""

    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class Slice:
    """One Spark partition: messages [start, end) of one queue."""

    topic: str
    broker: str
    queue_id: int
    start: int
    end: int

    @property
    def key(self) -> QueueKey:
        return QueueKey(self.topic, self.broker, self.queue_id)


def to_json(offsets: Offsets) -> dict[str, dict[str, dict[str, int]]]:
    """The checkpoint form: nested dicts with sorted keys (queue ids as decimal strings)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for key in sorted(offsets):
        out.setdefault(key.topic, {}).setdefault(key.broker, {})[str(key.queue_id)] = offsets[key]
    return out


def from_json(obj: object) -> Offsets:
    """Parse the checkpoint form (a dict, or its JSON text)."""
    if isinstance(obj, (str, bytes)):
        obj = json.loads(obj)
    if not isinstance(obj, dict):
        raise SparkOptionError(f"offsets must be a JSON object, got {type(obj).__name__}")
    out: Offsets = {}
    try:
        for topic, brokers in obj.items():
            for broker, queues in brokers.items():
                for qid, off in queues.items():
                    out[QueueKey(topic, broker, int(qid))] = int(off)
    except (AttributeError, TypeError, ValueError):
        raise SparkOptionError(f"offsets {json.dumps(obj)[:200]} are not of the form "
                               '{"topic": {"broker": {"queueId": offset}}}; is the checkpoint '
                               "from another source?") from None
    return out


def resolve(spec: str | OffsetSpec, ranges: dict[QueueKey, QueueRange], what: str,
            missing: str) -> Offsets:
    """Concrete offsets for every queue of ``ranges``: ``earliest``/``latest`` or per-queue JSON
    (``-2``/``-1`` mean earliest/latest). Queues the JSON does not name get ``missing``
    (``"earliest"`` or ``"latest"``); a queue the JSON names that does not exist is an error."""
    def pick(word_or_off: str | int, r: QueueRange) -> int:
        if word_or_off in ("earliest", EARLIEST):
            return r.min_offset
        if word_or_off in ("latest", LATEST):
            return r.max_offset
        return int(word_or_off)

    if isinstance(spec, str):
        return {k: pick(spec, r) for k, r in ranges.items()}
    named = {QueueKey(t, b, q): off for t, brokers in spec.items()
             for b, queues in brokers.items() for q, off in queues.items()}
    unknown = sorted(str(k) for k in named if k not in ranges)
    if unknown:
        have = ", ".join(sorted(str(k) for k in ranges)[:8]) or "none"
        raise SparkOptionError(f"option {what} names queues that are not part of this read: "
                               f"{', '.join(unknown)} (queues here: {have})")
    return {k: pick(named.get(k, missing), r) for k, r in ranges.items()}


def data_loss(start: Offsets, ranges: dict[QueueKey, QueueRange]) -> dict[QueueKey, int]:
    """Queues whose next offset retention has already removed: ``{queue: first offset left}``."""
    return {k: ranges[k].min_offset for k, off in start.items()
            if k in ranges and off < ranges[k].min_offset}


def data_loss_message(lost: dict[QueueKey, int], start: Offsets) -> str:
    items = ", ".join(f"{k} wanted {start[k]} but the oldest left is {first}"
                      for k, first in sorted(lost.items())[:5])
    more = f" (and {len(lost) - 5} more queues)" if len(lost) > 5 else ""
    return (f"Some data may have been lost because messages are no longer available on the broker "
            f"(retention removed them): {items}{more}. If you want your query to skip them and "
            "carry on, set the source option failOnDataLoss to false.")


def past_end(offsets: Offsets, ranges: dict[QueueKey, QueueRange]) -> Offsets:
    """Queues whose offset in ``offsets`` lies beyond the queue's end (its next offset)."""
    return {k: off for k, off in offsets.items() if k in ranges and off > ranges[k].max_offset}


def past_end_message(past: Offsets, ranges: dict[QueueKey, QueueRange], what: str) -> str:
    items = "; ".join(f"offset {off} of {k}, which ends at {ranges[k].max_offset}"
                      for k, off in sorted(past.items())[:5])
    more = f" (and {len(past) - 5} more queues)" if len(past) > 5 else ""
    if what == "endingOffsets":
        how = ('to read to the end of every queue, set endingOffsets "latest" (the default) or '
               "leave it out, or name offsets no larger than those ends (-1 is latest)")
    else:
        how = ('a read starts at most at a queue\'s end: set startingOffsets "earliest", or name '
               "offsets no larger than those ends (-2 is earliest)")
    return (f"{what} asks for {items}{more} (a queue ends at the offset its next message will "
            f"get); {how}.")


def limit_rows(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """The end offsets that admit at most ``max_rows`` messages, shared across queues in
    proportion to their backlog (Kafka's rule) with the remainder going to the largest
    fractional shares, so the total admitted is exactly ``min(max_rows, backlog)``."""
    backlog = {k: max(0, latest[k] - start.get(k, 0)) for k in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    # exact integer shares: float division can round a share up past an integer for big offsets
    grant = {k: max_rows * b // total for k, b in backlog.items()}
    frac = {k: max_rows * b % total for k, b in backlog.items()}
    left = max_rows - sum(grant.values())
    for k in sorted(frac, key=lambda k: (-frac[k], k))[:left]:
        grant[k] += 1
    return {k: start.get(k, 0) + grant[k] for k in latest}


def plan(start: Offsets, end: Offsets, min_partitions: int | None = None,
         max_records: int | None = None) -> list[Slice]:
    """Slices covering [start, end) of every queue: one per queue, split so that none holds more
    than ``max_records`` messages and that there are at least ``min_partitions`` slices when the
    data allows (the biggest queues are split first, Kafka's rule)."""
    ranges = [(k, start.get(k, 0), e) for k, e in sorted(end.items()) if e > start.get(k, 0)]
    pieces: dict[QueueKey, int] = {k: 1 for k, _, _ in ranges}
    if max_records:
        for k, s, e in ranges:
            pieces[k] = max(1, math.ceil((e - s) / max_records))
    total = sum(e - s for _, s, e in ranges)
    if min_partitions and sum(pieces.values()) < min_partitions and total:
        for k, s, e in ranges:
            pieces[k] = max(pieces[k], min(e - s, math.ceil((e - s) / total * min_partitions)))
    out: list[Slice] = []
    for k, s, e in ranges:
        n = pieces[k]
        step, extra = divmod(e - s, n)
        pos = s
        for i in range(n):
            nxt = pos + step + (1 if i < extra else 0)
            out.append(Slice(k.topic, k.broker, k.queue_id, pos, nxt))
            pos = nxt
    return out
