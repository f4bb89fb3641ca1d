"""A replica's epoch history, kept on its disk (issue 17): where each epoch of its CommitLog began,
and the last group record it saw.

Kafka's leader-epoch checkpoint is the model: a follower's log agrees with the master's up to the
start of the first epoch after the follower's last one (``replication.truncation_point``), so
both the master and a rejoining follower must know which epoch their records belong to after a
restart. The file is ``<store root>/replica-epochs.json``, written atomically (the previous content
kept as ``.bak``) before the change it records takes effect: a master writes its new epoch before
it acknowledges a write in it; a follower adopts the master's history before it appends the
master's records.

Invariants:
- Entries are strictly increasing in epoch and non-decreasing in start; an epoch's records are
  ``[start, next entry's start)``.
- ``epoch_at(log end)`` is the epoch of this log's last record (0 for an empty log): what the
  handshake carries. The newest epoch this replica *knows* (for fencing) is the group record's, kept apart.
- A file that is not a history raises ``EpochFileError`` with the path and what to do; the
  broker refuses to start rather than guess (a guess could keep a diverged tail).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tidemq.errors import TideMQError

from tidemq.broker.store.jsonfile import write_json_atomic

from .coordination import GroupRecord, RecordCodecError, decode_record, encode_record

log = logging.getLogger(__name__)

FILE_NAME = "replica-epochs.json"
VERSION = 1


class EpochFileError(TideMQError):
    """The epoch file cannot be read as a history."""


@dataclass(frozen=True, slots=True)
class EpochStart:
    """Epoch ``epoch`` began with the master's CommitLog at ``start``."""

    epoch: int
    start: int


def normalized(entries: Iterable[EpochStart]) -> tuple[EpochStart, ...]:
    """``entries`` sorted by epoch, checked (epochs distinct and positive, starts non-decreasing)."""
    out = tuple(sorted(entries, key=lambda e: e.epoch))
    for prev, cur in zip(out, out[1:]):
        if cur.epoch == prev.epoch or cur.start < prev.start:
            raise ValueError(f"epoch {cur.epoch} (start {cur.start}) after epoch {prev.epoch} "
                             f"(start {prev.start}) is not a history")
    if out and (out[0].epoch < 1 or out[0].start < 0):
        raise ValueError(f"epoch {out[0].epoch} starting at {out[0].start} is not a history entry")
    return out


def cut(entries: Iterable[EpochStart], end: int) -> tuple[EpochStart, ...]:
    """The history of a log cut at ``end``: epochs that began past it hold no record any more."""
    return tuple(e for e in entries if e.start <= end)


class EpochHistory:
    """The history of one replica's log, loaded from and saved to ``root / FILE_NAME``."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / FILE_NAME
        self.entries: tuple[EpochStart, ...] = ()
        self.record: GroupRecord | None = None  # the last group record seen (None: never)

    @property
    def last_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else 0

    def epoch_at(self, log_end: int) -> int:
        """The epoch of a log ending at ``log_end``: of the last entry that began at or before it
        (0: none). An adopted history may name epochs whose records this log has not got yet."""
        epoch = 0
        for e in self.entries:
            if e.start > log_end:
                break
            epoch = e.epoch
        return epoch

    def load(self, log_end: int) -> None:
        """Read the file (absent: an empty history); entries past ``log_end`` are dropped (a crash
        after a truncation was recorded in the log but before the file was rewritten)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("version") != VERSION:
                raise ValueError(f"not a version {VERSION} epoch file")
            entries = normalized(EpochStart(int(e), int(s)) for e, s in doc["epochs"])
            record = doc.get("record")
            self.record = decode_record(json.dumps(record).encode()) if record is not None else None
        except (ValueError, TypeError, KeyError, RecordCodecError) as exc:
            raise EpochFileError(f"{self.path} is not a replica epoch history ({exc}); restore it from "
                                 f"{self.path.name}.bak, or empty the store directory to copy the "
                                 "replica anew from its master") from None
        self.entries = cut(entries, log_end)

    def save(self) -> None:
        doc: dict[str, object] = {"version": VERSION, "epochs": [[e.epoch, e.start] for e in self.entries]}
        if self.record is not None:
            doc["record"] = json.loads(encode_record(self.record))
        write_json_atomic(self.path, doc)

    def begin(self, epoch: int, start: int) -> None:
        """As master of ``epoch``, from log offset ``start``: recorded before any write of it."""
        if self.entries and epoch <= self.last_epoch:
            raise ValueError(f"epoch {epoch} is not newer than this log's epoch {self.last_epoch}")
        self.entries = normalized((*cut(self.entries, start), EpochStart(epoch, start)))
        self.save()

    def adopt(self, entries: Iterable[EpochStart]) -> None:
        """As follower: the master's history, for a log that is now a prefix of the master's (after
        truncation); it keeps the epochs this log has no record of yet, as the master streams them."""
        adopted = normalized(entries)
        if adopted != self.entries:
            self.entries = adopted
            self.save()

    def remember(self, record: GroupRecord) -> None:
        """Keep the newest group record seen, so that a restarted replica still knows its epoch
        and in-sync set when the store's record has lapsed."""
        if self.record is None or record.epoch > self.record.epoch or \
                (record.epoch == self.record.epoch and record != self.record):
            self.record = record
            self.save()
