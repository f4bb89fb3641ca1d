"""Bookkeeping of transactional messages: which transactions are resolved, and what the checker
does with a half record. Pure: the time is passed in (milliseconds of the broker's clock).

Invariants:
- ``OpBook`` holds the roots (first half-queue offsets) of resolved transactions. An entry stays
  until the check progress has passed every copy of that root: an entry's ``keep_until`` is the
  half queue's end when it was resolved (no copy of a resolved root is appended afterwards, and
  every earlier copy lies below that end). So a half record at or after the progress offset is
  resolved exactly when its root is in the book, and the book stays bounded by the transactions
  whose copies are still ahead of the checker.
- ``op_progress`` never passes an op record whose entry is still held, so a restart that replays
  op records from the persisted op progress rebuilds every entry it needs.
- ``judge`` checks a half record at most once per ``timeout`` after it was stored (a copy's store
  time is the time of the last check), and a transaction at most ``check_max`` times. The first
  check waits for CHECK_IMMUNITY_TIME_IN_SECONDS instead when the producer set it, measured on the
  broker's clock from the first store (copies carry the deadline, so renewing never drifts).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tidemq.broker.transaction.half import HalfInfo


class OpBook:
    def __init__(self) -> None:
        self._done: dict[int, tuple[int, int]] = {}  # root -> (op queue offset, keep_until)

    def __contains__(self, root: int) -> bool:
        return root in self._done

    def __len__(self) -> int:
        return len(self._done)

    def add(self, root: int, op_offset: int, keep_until: int) -> None:
        old = self._done.get(root)
        if old is None:
            self._done[root] = (op_offset, keep_until)
        else:  # keep the earliest op record (replay safety) and the latest bound
            self._done[root] = (min(old[0], op_offset), max(old[1], keep_until))

    def prune(self, half_progress: int) -> int:
        """Forget roots whose copies all lie below ``half_progress``; return how many."""
        gone = [r for r, (_op, keep) in self._done.items() if keep <= half_progress]
        for r in gone:
            del self._done[r]
        return len(gone)

    def op_progress(self, op_end: int) -> int:
        """The op-queue offset a restart must replay from (``op_end`` when nothing is held)."""
        if not self._done:
            return op_end
        return min(min(op for op, _keep in self._done.values()), op_end)


class Verdict(enum.Enum):
    RESOLVED = "resolved"  # an op record exists: skip
    WAIT = "wait"  # too young: stop the round here
    RENEW = "renew"  # still immune (CHECK_IMMUNITY_TIME_IN_SECONDS): re-append, keep the count
    CHECK = "check"  # re-append with the count + 1 and ask a producer
    DISCARD = "discard"  # checked check_max times, or older than the store keeps files


@dataclass(frozen=True, slots=True)
class CheckPolicy:
    timeout_ms: int
    check_max: int
    max_age_ms: int


def judge(h: HalfInfo, resolved: bool, now_ms: int, policy: CheckPolicy) -> Verdict:
    if resolved:
        return Verdict.RESOLVED
    age = now_ms - h.store_timestamp
    if h.not_before_ms is not None:  # CHECK_IMMUNITY_TIME_IN_SECONDS replaces the timeout
        if now_ms < h.not_before_ms:
            # Immune longer than the timeout: move it to the end (keeping its deadline) so it
            # does not hold back the progress.
            return Verdict.RENEW if age >= policy.timeout_ms else Verdict.WAIT
    elif age < policy.timeout_ms:
        return Verdict.WAIT
    too_old = h.born_timestamp > 0 and now_ms - h.born_timestamp > policy.max_age_ms
    if h.check_times >= policy.check_max or too_old:
        return Verdict.DISCARD
    return Verdict.CHECK
