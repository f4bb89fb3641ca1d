"""The store's one dispatcher: what an appended CommitLog record feeds (RocketMQ's CommitLogDispatcher
list: build consume queue, build index, then the arriving-message listeners).

The store appends first and dispatches second. A live put and recovery's replay hand the same
dispatcher a run of records (one topic and queue, back to back in the CommitLog, consecutive
queue offsets) and the same rules apply to both:

- a record enters its consume queue, at the queue offset it carries, unless it is a PREPARED or
  ROLLBACK transactional half message (those wait in their own topic until committed);
- it enters the index (its KEYS and UNIQ_KEY) unless it is a ROLLBACK half message;
- listeners (long-poll wake-ups, timers, the metadata applier) hear of live puts, once per run and
  tags code with the highest queue offset stored with it ("something at or past offset N with this
  tag" is all they act on), and of a follower's replicated appends (``replicating()``) the same
  way; at recovery's replay nothing can be waiting yet, so they hear nothing.

Invariants of building a consume queue: dispatching a record twice is harmless (a unit already
holding the same pointer is left alone); a torn unit, or one the checkpoint never vouched for
that points at no record claiming its offset, is rewritten from the record (the CommitLog is the
truth); two valid records claiming one queue offset, or a record leaving a gap, refuse the start
(StoreCorruptError). A live put always lands at the end of its queue, so it takes the direct path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, Protocol

from tidemq.errors import StoreCorruptError
from tidemq.message import TRANSACTION_MASK, SysFlag

from tidemq.broker.store.consume_queue import ConsumeQueue
from tidemq.broker.store.index import IndexService

log = logging.getLogger(__name__)

_PREPARED = int(SysFlag.TRANSACTION_PREPARED)  # plain ints: IntFlag arithmetic is slow on the hot path
_ROLLBACK = int(SysFlag.TRANSACTION_ROLLBACK)
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# Topics whose units carry a delivery time as tags code (set by the delay / timer services), which
# replay cannot recompute from TAGS: a unit pointing at the right record with the right size is whole.
OWN_CODES = frozenset({SCHEDULE_TOPIC, "rmq_sys_wheel_timer"})

DispatchListener = Callable[[str, int, int, int], None]  # (topic, queue id, queue offset, tags code)
# (topic, queue id, queue offset, size) of the valid record whose header is at a CommitLog offset.
ClaimReader = Callable[[int], "tuple[str, int, int, int] | None"]


def enters_consume_queue(sys_flag: int) -> bool:
    tx = sys_flag & TRANSACTION_MASK
    return tx != _PREPARED and tx != _ROLLBACK


def enters_index(sys_flag: int) -> bool:
    return sys_flag & TRANSACTION_MASK != _ROLLBACK


class Record(Protocol):
    """What the dispatcher reads of each record of a run (the writer's Pending has these)."""

    @property
    def total(self) -> int: ...
    @property
    def tags_code(self) -> int: ...
    @property
    def keys(self) -> str | None: ...
    @property
    def uniq(self) -> str | None: ...


class Replayed(NamedTuple):
    """A record found in the CommitLog by recovery, as the dispatcher reads it (a NamedTuple, not
    a frozen dataclass: one is made per replayed record, and a start may replay millions)."""

    total: int
    tags_code: int
    keys: str | None
    uniq: str | None


class Run(NamedTuple):
    """A run of records as :meth:`Dispatcher.replay` takes it (tidemq.broker.store.scan makes them)."""

    topic: str
    queue_id: int
    sys_flag: int  # the first record's
    queue_offset: int  # the first record's
    phys: int  # CommitLog offset of the first record
    store_timestamp: int
    records: list[Replayed]


class ConsumeQueueBuilder:
    """Puts a run's units into its consume queue (RocketMQ's CommitLogDispatcherBuildConsumeQueue)."""

    def __init__(self, queue_for: Callable[[str, int], ConsumeQueue], claim_at: ClaimReader | None = None,
                 store_root: object = "the store") -> None:
        self.queue_for = queue_for
        self.claim_at = claim_at
        self.store_root = store_root  # for error messages
        self.units_written = 0
        self.units_replaced = 0

    # Hot path (bench/hot_path.py): a live put lands at the end of its queue.
    def build(self, topic: str, queue_id: int, q: int, phys: int, records: Sequence[Record]) -> None:
        cq = self.queue_for(topic, queue_id)
        if q == cq.max_offset:
            cq.put_run(q, phys, records)
            self.units_written += len(records)
            return
        for r in records:
            self._place(cq, topic, queue_id, q, phys, r.total, r.tags_code)
            q += 1
            phys += r.total

    def _place(self, cq: ConsumeQueue, topic: str, queue_id: int, q: int, phys: int, size: int,
               code: int) -> None:
        """Put one unit that does not simply extend the queue: replay over existing units."""
        if q < 0:
            log.warning("record at %d has negative queue offset %d; not dispatched", phys, q)
            return
        if q < cq.max_offset:
            u = cq.unit(q)
            if (u is not None and u[0] == phys and u[1] == size
                    and (u[2] == code or topic in OWN_CODES)):  # their codes are times, set elsewhere
                return
            if q < cq.min_offset:
                return  # before the queue's known start: nothing to repair
            if u is not None and (u[0] == phys or (u[1] <= 0 and self.claim_at is None)):
                # A torn unit: it straddles a page boundary (20-byte units, 4 KiB pages) and only
                # one of its pages reached the disk, or it was never completed. The record is
                # here and claims the offset: write the unit whole.
                log.warning("consume queue %s/%d: unit %d was torn %s; rewritten from the record at %d",
                            topic, queue_id, q, u, phys)
                cq.put(q, phys, size, code)
                self.units_replaced += 1
                return
            claim = self.claim_at(u[0]) if self.claim_at is not None and u is not None else ()
            if u is not None and (claim is None or (claim and claim[:3] != (topic, queue_id, q))):
                # The unit points at no record claiming this queue offset: it is a unit the
                # checkpoint never vouched for (replay starts past its mark), left by a put that
                # a crash or power cut lost, whose queue offset a later put reused. The CommitLog
                # is the truth: point the unit at the record that carries the offset.
                log.warning("consume queue %s/%d: unit %d pointed to commitlog offset %d, which holds no "
                            "record with that queue offset; re-pointed to the record at %d",
                            topic, queue_id, q, u[0], phys)
                cq.put(q, phys, size, code)
                self.units_replaced += 1
                return
            # Two valid records claim this queue offset (or one of them is damaged, and the
            # record's header, not covered by the body CRC, is the likelier one). Never guess.
            raise StoreCorruptError(
                f"commitlog record at offset {phys} says it is {topic}/{queue_id} queue offset {q}, "
                f"but that consume queue unit points elsewhere: the commitlog or consume queue under "
                f"{self.store_root} is damaged; restore it from a backup or replica"
            )
        if q > cq.max_offset and cq.max_offset > cq.min_offset:
            raise StoreCorruptError(
                f"commitlog record at offset {phys} says it is {topic}/{queue_id} queue offset {q}, "
                f"but that queue ends at {cq.max_offset}: the commitlog under {self.store_root} is "
                f"damaged; restore it from a backup or replica"
            )
        cq.put(q, phys, size, code)
        self.units_written += 1


class IndexBuilder:
    """Adds a run's keys and unique keys to the index (RocketMQ's CommitLogDispatcherBuildIndex).

    ``on_error(phys, error)``, when given, takes an OSError of one record (an index file that
    cannot be created) and the run goes on: the message is stored and queued, only key lookup
    misses it. Without it the error propagates."""

    def __init__(self, index: IndexService) -> None:
        self.index = index
        self.indexed = 0

    def build(self, topic: str, phys: int, store_timestamp: int, records: Sequence[Record],
              on_error: Callable[[int, OSError], None] | None = None) -> None:
        index = self.index
        i, n = 0, len(records)
        while i < n:
            # Hot path (bench/hot_path.py batch, bench/follower_apply.py): whole records that fit
            # the active file in one call; the record that does not (or the first one, before any
            # file exists) through add, which creates the next file and may fail.
            done, phys = index.put_run(topic, records, i, phys, store_timestamp)
            i += done
            if i >= n:
                break
            r = records[i]
            try:
                index.add(topic, r.keys, r.uniq, phys, store_timestamp)
            except OSError as exc:
                if on_error is None:
                    raise
                on_error(phys, exc)
            phys += r.total
            i += 1
        self.indexed += n


class Dispatcher:
    """The consume-queue builder, the index builder and the listeners, in that order.

    ``dispatch`` serves live puts (an index error is handed to ``on_index_error``; listeners are
    told); ``replay`` serves recovery, which says which of the two builders a record still needs
    (its checkpoint covers the rest); an index error fails the load there."""

    def __init__(self, queues: ConsumeQueueBuilder, index: IndexBuilder,
                 on_index_error: Callable[[int, OSError], None] | None = None) -> None:
        self.queues = queues
        self.index = index
        self.on_index_error = on_index_error
        self.listeners: list[DispatchListener] = []

    # Hot path (bench/hot_path.py): once per put or batch; plain arguments, no object per run.
    def dispatch(self, topic: str, queue_id: int, sys_flag: int, queue_offset: int, phys: int,
                 store_timestamp: int, records: Sequence[Record]) -> None:
        """A run just appended: ``records`` of one topic and queue, back to back from CommitLog
        offset ``phys``, at queue offsets from ``queue_offset`` on, all with the transactional
        state of ``sys_flag``."""
        tx = sys_flag & TRANSACTION_MASK  # enters_consume_queue and enters_index, inlined
        queued = tx != _PREPARED and tx != _ROLLBACK
        if queued:
            self.queues.build(topic, queue_id, queue_offset, phys, records)
        if tx != _ROLLBACK:
            self.index.build(topic, phys, store_timestamp, records, self.on_index_error)
        if queued and self.listeners:
            self._tell(topic, queue_id, queue_offset, records)

    def _tell(self, topic: str, queue_id: int, queue_offset: int, records: Sequence[Record]) -> None:
        """The listeners hear of a queued run once per tags code, with its highest queue offset."""
        if len(records) == 1:
            wake: Iterable[tuple[int, int]] = ((records[0].tags_code, queue_offset),)
        else:
            last: dict[int, int] = {}
            q = queue_offset
            for r in records:
                last[r.tags_code] = q
                q += 1
            wake = last.items()
        for code, offset in wake:
            for cb in self.listeners:
                try:
                    cb(topic, queue_id, offset, code)
                except Exception:
                    log.exception("dispatch listener %r failed", cb)

    def replay(self, topic: str, queue_id: int, sys_flag: int, queue_offset: int, phys: int,
               store_timestamp: int, records: Sequence[Record], to_queue: bool = True,
               to_index: bool = True) -> None:
        """A run found by recovery; ``to_queue``/``to_index``: whether the checkpoint leaves it
        to the consume-queue or index builder (both rules above still apply)."""
        if to_queue and enters_consume_queue(sys_flag):
            self.queues.build(topic, queue_id, queue_offset, phys, records)
        if to_index and enters_index(sys_flag):
            self.index.build(topic, phys, store_timestamp, records)

    def replicating(self) -> "Dispatcher":
        """The dispatcher a follower's replicated appends go through: this one's builders, and
        its listeners (the same list, so one added later is heard too) told of the records that
        entered a consume queue as a live put tells them (once per run and tags code)."""
        return _ReplicatingDispatcher(self)


class _ReplicatingDispatcher(Dispatcher):
    """Recovery's replay rules for records a master sent (they arrive checked and whole, like
    found ones), plus the listeners of live puts: a follower's long polls, timers and metadata
    hear of replicated records as a master's hear of its puts."""

    def __init__(self, live: Dispatcher) -> None:
        super().__init__(live.queues, live.index, live.on_index_error)
        self.listeners = live.listeners

    def replay(self, topic: str, queue_id: int, sys_flag: int, queue_offset: int, phys: int,
               store_timestamp: int, records: Sequence[Record], to_queue: bool = True,
               to_index: bool = True) -> None:
        super().replay(topic, queue_id, sys_flag, queue_offset, phys, store_timestamp, records, to_queue,
                       to_index)
        # Heard as a live put is (once per run and tags code): a listener told of each record
        # cost a follower 4 calls and a deferred wake-up per record (bench/compare.py
        # --replicated, row 3), for what it acts on, "something at or past offset N with this tag".
        if to_queue and enters_consume_queue(sys_flag) and self.listeners:
            self._tell(topic, queue_id, queue_offset, records)
