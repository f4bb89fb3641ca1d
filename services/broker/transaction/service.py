"""The transactional-message service: stores half messages, resolves them on END_TRANSACTION
(commit writes the real message, both commit and rollback write an op record) and keeps the
checker's progress.

Invariants:
- A transaction (identified by its root, see ``half``) is committed at most once: an
  END_TRANSACTION for a root in the op book is answered without writing anything, so a late
  answer from the original producer after a check answer (or the reverse) cannot duplicate the
  message. Neither is one for a record the checker has passed (below the progress offset) whose
  root has no copy ahead of the checker (``open``): the checker passes a record only by finding
  it resolved, by re-appending it (its root then stays in ``open`` until resolved) or by
  discarding it, so such a root was resolved even if the book has forgotten it.
- Every put and book update of one END_TRANSACTION happens without an await in between, so the
  checker (same event loop) sees a transaction either unresolved or resolved with its op record.
- Progress (``halfOffset``, ``opOffset``) is persisted in config/transactionProgress.json after
  every check round that moved it and at shutdown; on start the op book is rebuilt from the op
  queue from ``opOffset`` on, so a restart does not check resolved halves again.
- A replicated broker's followers do not check; they take the master's progress from the
  replicated log (``apply_progress``), and a follower that becomes master rebuilds its op book from
  the replicated op queue (``rebuild``) before it checks or ends anything, so it neither checks
  resolved transactions again nor commits one twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tidemq.broker.store.jsonfile import read_json, write_json_atomic
from tidemq.broker.store.store import GetStatus, MessageStore, PutRequest, PutResult
from tidemq.broker.transaction.book import OpBook
from tidemq.broker.transaction.half import (
    HALF_QUEUE_ID,
    HALF_TOPIC,
    OP_TOPIC,
    EndType,
    op_request,
    parse_op_body,
    root_of,
    to_half,
    to_real,
)
from tidemq.errors import BrokerError, CodecError, ConfigError
from tidemq.message import MessageExt, Prop, decode_record
from tidemq.remoting.codes import ResponseCode

log = logging.getLogger(__name__)

REPLAY_BATCH = 256


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    """Times in seconds. Defaults are RocketMQ's transactionTimeOut, transactionCheckInterval and
    transactionCheckMax; ``max_age_hours`` is the store's file reserved time."""

    timeout: float = 6.0
    check_interval: float = 60.0
    check_max: int = 15
    max_age_hours: float = 72.0

    def __post_init__(self) -> None:
        if not (self.timeout >= 0 and self.check_interval > 0 and self.max_age_hours > 0):
            raise ConfigError("transaction timeout must be >= 0, check interval and max age > 0")
        if self.check_max < 0:
            raise ConfigError("transaction check max must be >= 0")


@dataclass(frozen=True, slots=True)
class Committed:
    """The real message an END_TRANSACTION COMMIT stored."""

    topic: str
    queue_id: int
    body_size: int
    put: PutResult


class TransactionService:
    def __init__(self, store: MessageStore, config: TransactionConfig, store_host: tuple[str, int],
                 progress_path: Path, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.config = config
        self.store_host = store_host
        self.progress_path = progress_path
        self.clock = clock
        self.book = OpBook()
        self.open: dict[int, int] = {}  # root -> latest copy, for checked, unresolved transactions
        self.half_progress = 0
        self.op_progress = 0
        self._saved: tuple[int, int] | None = None
        self._persist_lock = asyncio.Lock()
        self.stats = {"prepared": 0, "committed": 0, "rolled_back": 0, "duplicate_ends": 0,
                      "checks_sent": 0, "renewed": 0, "discarded": 0, "no_producer": 0}

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ---------------------------------------------------------------------------- lifecycle
    def load(self) -> None:
        """Read the persisted progress (blocking; call from a thread)."""
        data = read_json(self.progress_path, None) or {}
        if not isinstance(data, dict):
            data = {"halfOffset": "?"}
        try:
            self.half_progress = max(0, int(data.get("halfOffset", 0)))
            self.op_progress = max(0, int(data.get("opOffset", 0)))
        except (TypeError, ValueError):
            log.warning("%s is malformed; checking transactions from the start", self.progress_path)
            self.half_progress = self.op_progress = 0
        self._saved = (self.half_progress, self.op_progress)

    def rebuild(self) -> int:
        """Replay op records from the op progress into the book (after the store is loaded).
        Returns the number of op records read."""
        store = self.store
        keep_until = store.max_offset(HALF_TOPIC, HALF_QUEUE_ID)
        end = store.max_offset(OP_TOPIC, HALF_QUEUE_ID)
        # Clamped into the queues as they are (a progress file may outlive a wiped store).
        self.half_progress = min(max(self.half_progress, store.min_offset(HALF_TOPIC, HALF_QUEUE_ID)),
                                 keep_until)
        offset = min(max(self.op_progress, store.min_offset(OP_TOPIC, HALF_QUEUE_ID)), end)
        read = 0
        for raw in self._records(OP_TOPIC, offset, end):
            try:
                op = decode_record(raw)
            except CodecError as exc:
                log.error("skipping an unreadable op record: %s", exc)
                continue
            root = parse_op_body(op.body)
            if root is None:
                log.warning("op record %d has body %r, not a half-queue offset", op.queue_offset,
                            op.body[:32])
                continue
            self.book.add(root, op.queue_offset, keep_until)
            read += 1
        self.book.prune(self.half_progress)
        self._find_open_copies(keep_until)
        if read or self.half_progress < keep_until:
            log.info("transactions: %d op record(s) replayed, %d resolved transaction(s) held, "
                     "%d half record(s) ahead of the checker", read, len(self.book),
                     keep_until - self.half_progress)
        return read

    def _find_open_copies(self, end: int) -> None:
        for raw in self._records(HALF_TOPIC, self.half_progress, end):
            try:
                msg = decode_record(raw)
            except CodecError:
                continue
            root = root_of(msg)
            if root != msg.queue_offset and root not in self.book:
                self.open[root] = max(self.open.get(root, -1), msg.queue_offset)

    def _records(self, topic: str, offset: int, end: int) -> Iterator[bytes]:
        """The stored records of queue 0 of ``topic`` from ``offset`` up to (about) ``end``,
        skipping gaps; stops where the queue gives nothing more."""
        while offset < end:
            res = self.store.get_messages(topic, HALF_QUEUE_ID, offset, REPLAY_BATCH, None, 1 << 20)
            if res.status is GetStatus.OFFSET_TOO_SMALL or not res.records:
                if res.next_begin_offset <= offset:
                    break
                offset = res.next_begin_offset
                continue
            yield from res.records
            offset = res.next_begin_offset

    def track_copy(self, root: int, copy_offset: int) -> None:
        """The checker re-appended a half record of ``root`` at ``copy_offset``."""
        if root not in self.book:
            self.open[root] = copy_offset

    # ---------------------------------------------------------------------------- half messages
    def prepare(self, req: PutRequest) -> PutResult:
        """Store a transactional send as a half message."""
        result = self.store.put(to_half(req))
        if result.ok:
            self.stats["prepared"] += 1
        return result

    def read_half(self, commit_log_offset: int) -> MessageExt:
        raw = self.store.read_record(commit_log_offset)
        if raw is None:
            raise BrokerError(f"find prepared transaction message failed: nothing at commit-log "
                              f"offset {commit_log_offset}", ResponseCode.SYSTEM_ERROR)
        try:
            msg = decode_record(raw)
        except CodecError as exc:
            raise BrokerError(f"the record at commit-log offset {commit_log_offset} is unreadable: "
                              f"{exc}", ResponseCode.SYSTEM_ERROR) from None
        if msg.topic != HALF_TOPIC:
            raise BrokerError(f"the message at commit-log offset {commit_log_offset} is not a half "
                              "message", ResponseCode.SYSTEM_ERROR)
        return msg

    def end(self, group: str, tran_offset: int, commit_log_offset: int, kind: EndType,
            from_check: bool = False,
            authorize: Callable[[MessageExt], None] | None = None) -> Committed | None:
        """Commit or roll back the half message at ``commit_log_offset``.

        Returns the committed message (None for a rollback, or when the transaction was already
        resolved); raises BrokerError (SYSTEM_ERROR) when the request does not match a
        half message of ``group``.
        """
        msg = self.read_half(commit_log_offset)
        if authorize is not None:  # raises BrokerError when the requester may not end it
            authorize(msg)
        pgroup = msg.properties.get(Prop.PGROUP, "")
        if pgroup != group:
            raise BrokerError(f"The producer group wrong: the half message belongs to {pgroup!r}, "
                              f"not {group!r}", ResponseCode.SYSTEM_ERROR)
        if msg.queue_offset != tran_offset:
            raise BrokerError(f"The transaction state table offset wrong: {tran_offset}, the half "
                              f"message has {msg.queue_offset}", ResponseCode.SYSTEM_ERROR)
        root = root_of(msg)
        uniq = msg.properties.get(Prop.UNIQ_KEY, "")
        stale = msg.queue_offset < self.half_progress and root not in self.open
        if root in self.book or stale:
            self.stats["duplicate_ends"] += 1
            log.info("transaction %s (half %d) of group %s is already resolved; %s ignored", uniq,
                     root, group, kind.name)
            return None
        result = None
        if kind is EndType.COMMIT:
            real = to_real(msg, self.store_host)
            put = self.store.put(real)
            if not put.ok:
                raise BrokerError(f"storing the committed message failed: {put.status.name} "
                                  f"{put.remark}", ResponseCode.SYSTEM_ERROR)
            result = Committed(real.topic, real.queue_id, len(real.body), put)
            self.stats["committed"] += 1
        else:
            self.stats["rolled_back"] += 1
        self.resolve(root, msg.queue_id)
        log.debug("transaction %s (half %d) of group %s: %s%s", uniq, root, group, kind.name,
                  " (answer to a check)" if from_check else "")
        return result

    def resolve(self, root: int, queue_id: int = HALF_QUEUE_ID) -> None:
        """Write the op record for ``root`` and hold it in the book."""
        keep_until = self.store.max_offset(HALF_TOPIC, queue_id)
        self.open.pop(root, None)
        op = self.store.put(op_request(root, queue_id, self.store_host, self.now_ms()))
        if not op.ok:  # the book still holds it: no re-check or duplicate until a restart
            log.error("writing the op record of half %d failed (%s %s); the transaction may be "
                      "checked again after a restart", root, op.status.name, op.remark)
            op_offset = self.store.max_offset(OP_TOPIC, queue_id)
        else:
            op_offset = op.queue_offset
        self.book.add(root, op_offset, keep_until)

    # ---------------------------------------------------------------------------- progress
    def advance(self, half_progress: int) -> None:
        self.half_progress = half_progress
        self.book.prune(half_progress)
        self.op_progress = self.book.op_progress(self.store.max_offset(OP_TOPIC, HALF_QUEUE_ID))

    def apply_progress(self, half_progress: int, op_progress: int) -> None:
        """Take the master's checker progress (a follower: it does not check itself)."""
        self.half_progress = half_progress
        self.op_progress = op_progress
        self.book.prune(half_progress)

    async def persist(self) -> None:
        async with self._persist_lock:
            state = (self.half_progress, self.op_progress)
            if state == self._saved:
                return
            snap = {"halfOffset": state[0], "opOffset": state[1]}
            await asyncio.to_thread(write_json_atomic, self.progress_path, snap)
            self._saved = state
