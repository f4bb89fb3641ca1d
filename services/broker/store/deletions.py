"""Topic deletion marks (``deletedTopics.json``) and topics whose consume queues are to be rebuilt
(``rebuildTopics.json``), both in the store's root.

A deletion mark is the CommitLog end when the topic was deleted: records of the topic below a
topic's latest mark belong to a deleted incarnation, and replay (recovery, rebuilds) skips them.
A topic keeps its last ``MAX_KEPT`` marks, so a deletion that a replica cuts (it was in a tail
that diverged from the new master's log, ha/metalog.py) gives back the mark before it. A file
written by an older TideMQ holds one mark per topic (a number): read as a history of one.

A topic named in the rebuild file gets its consume queues emptied and rebuilt from the CommitLog
at load (recovery.py): written before a live rebuild starts and removed once it is on disk, so a
crash in between finishes it at the next start.

Invariants: both files are replaced atomically; marks are ascending; a value that is not a mark
(a hand-edited file) is refused with a StoreError naming the file, never half-read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from tidemq.errors import StoreError

from tidemq.broker.store.jsonfile import read_json, write_json_atomic

MAX_KEPT = 8  # marks kept per topic


def load(path: Path) -> dict[str, list[int]]:
    """Topic -> its deletion marks, ascending."""
    raw = read_json(path, {}, backup=False) or {}
    if not isinstance(raw, dict):
        raise StoreError(f"{path} is not a JSON object of topic -> deletion offsets")
    out: dict[str, list[int]] = {}
    for topic, value in raw.items():
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise StoreError(f"{path}: the deletion offsets of topic {topic!r} are not offsets: {value!r}")
        out[str(topic)] = sorted(values)
    return out


def latest(marks: Mapping[str, list[int]]) -> dict[str, int]:
    """Topic -> its latest mark: what replay skips below."""
    return {t: ms[-1] for t, ms in marks.items() if ms}


def save(path: Path, marks: Mapping[str, list[int]]) -> None:
    write_json_atomic(path, {t: ms for t, ms in sorted(marks.items()) if ms})


def deleted(marks: Mapping[str, list[int]], topic: str, at: int) -> dict[str, list[int]]:
    """``marks`` with ``topic`` deleted at CommitLog offset ``at``."""
    return {**marks, topic: sorted({*marks.get(topic, ()), at})[-MAX_KEPT:]}


def cut(marks: Mapping[str, list[int]], offset: int, undone: Iterable[str]) -> dict[str, list[int]]:
    """``marks`` once the CommitLog is cut at ``offset``. A deletion of an ``undone`` topic marked
    past the cut happened in the cut tail and is forgotten (its earlier marks hold again); any
    other mark past the cut moves to the cut, so it never hides records a new master writes
    there for a topic of the same name."""
    undone = set(undone)
    out: dict[str, list[int]] = {}
    for topic, ms in marks.items():
        kept = sorted({m for m in ms if m <= offset} if topic in undone else {min(m, offset) for m in ms})
        if kept:
            out[topic] = kept
    return out


def load_rebuild(path: Path) -> list[str]:
    """The topics whose consume queues a load rebuilds."""
    raw = read_json(path, [], backup=False) or []
    if not isinstance(raw, list) or not all(isinstance(t, str) for t in raw):
        raise StoreError(f"{path} is not a JSON list of topic names")
    return sorted(set(raw))


def save_rebuild(path: Path, topics: Iterable[str]) -> None:
    names = sorted(set(topics))
    if names:
        write_json_atomic(path, names)
    else:
        path.unlink(missing_ok=True)
