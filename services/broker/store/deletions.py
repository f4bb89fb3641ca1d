"""Topic deletion marks (``deletedTopics.json``) and a cut not finished yet (``pendingCut.json``),
both in the store's root.

A deletion mark is the CommitLog end when the topic was deleted: records of the topic below a
topic's latest mark belong to a deleted incarnation, and replay (recovery, rebuilds) skips them.
A topic keeps its last ``MAX_KEPT`` marks, so a deletion that a replica cuts (it was in a tail
that diverged from the new master's log, ha/metalog.py) gives back the mark before it. A file
written by an older TideMQ holds one mark per topic (a number): read as a history of one.

A follower's cut (store.truncate) writes ``pendingCut.json`` (the cut offset and the topics whose
deletion was in the cut tail, ``made`` false) before it cuts, ``made`` true once the CommitLog is
cut, and removes it once the marks are moved and those topics' consume queues are rebuilt and
flushed. The marks change only after the cut, so a crash before it leaves them as they were (the
record is then stale: not made, and the log still ends past the cut); after the cut, the next
load, handshake or promotion finishes the marks and the rebuild (store.finish_cut).

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


def load_pending(path: Path) -> tuple[int, list[str], bool] | None:
    """A cut whose marks and rebuild are not known to be done: (cut offset, undeleted topics,
    whether the CommitLog is known to be cut)."""
    raw = read_json(path, None, backup=False)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raw = {}
    cut_at, topics, made = raw.get("cut"), raw.get("undeleted"), raw.get("made", False)
    if (not isinstance(cut_at, int) or isinstance(cut_at, bool) or cut_at < 0 or not isinstance(topics, list)
            or not all(isinstance(t, str) for t in topics) or not isinstance(made, bool)):
        raise StoreError(f'{path} is not a pending cut ({{"cut": offset, "undeleted": [topics], "made": bool}})')
    return cut_at, sorted(set(topics)), made


def save_pending(path: Path, cut_at: int, undeleted: Iterable[str], made: bool) -> None:
    write_json_atomic(path, {"cut": cut_at, "undeleted": sorted(set(undeleted)), "made": made})


def owed(pending: tuple[int, list[str], bool], log_end: int) -> bool:
    """Whether a pending cut's marks and rebuild are still to be done: the cut is recorded as
    made, or the log ends at or before it (a crash came between the cut and that record). A
    log past a cut not recorded as made was never cut: the record is stale."""
    cut_at, _, made = pending
    return made or log_end <= cut_at


def clear_pending(path: Path) -> None:
    path.unlink(missing_ok=True)
