"""MessageStore: CommitLog + consume queues + index + flushing + recovery + retention.

Threading: every public method except ``load`` is called from one asyncio event-loop thread and
does only memory work there (appends and reads are copies in and out of mapped files; a run of
records is one pwrite into the page cache the mapping shares). fdatasync,
file creation for segments, deletion and the checkpoint run on two worker threads (one only for
CommitLog flushes, so group commit never queues behind other disk work).

Invariants:
- A put is appended, assigned its queue offset and then dispatched (consume queue unit, index
  entries, listeners: dispatch.py, the same dispatcher recovery replays through) before ``put``
  returns, so it is pullable at once; the CommitLog write position only moves after a whole
  record (or batch) is in place.
- Queue offsets come from the consume queue (``max_offset`` = next offset), so they survive restarts.
- An ``abort`` file exists while the store is loaded and open; finding it at ``load`` means a crash.
- In SYNC mode a put counts as acknowledged only after ``wait_durable`` returned True; nothing
  below the flushed position is ever dropped by recovery.
- Replication (issue 17) adds three primitives off the put path: a master reads whole records
  from a CommitLog offset (``read_commitlog``); a follower appends a master's records at exactly
  the offset the master has them, each checked (magic, size, own offset, body CRC) as recovery
  checks them, and dispatches them through the one dispatcher (``append_replicated``); and
  cuts its log, with the consume-queue units pointing past the cut, at a truncation point
  (``truncate``). Index entries past a cut stay: every key lookup re-reads and re-checks the
  record an entry points at, so a stale entry finds nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import shutil
import struct
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from tidemq.errors import StoreCorruptError, StoreError
from tidemq.message import decode_record_header, encode_offset_msg_id

from tidemq.broker.store import deletions, reader
from tidemq.broker.store.commitlog import CommitLog
from tidemq.broker.store.config import FlushMode, StoreConfig
from tidemq.broker.store.consume_queue import ConsumeQueue
from tidemq.broker.store.dispatch import (
    ConsumeQueueBuilder,
    DispatchListener,
    Dispatcher,
    IndexBuilder,
    enters_consume_queue,
)
from tidemq.broker.store.flush import CommitLogFlusher, LogicsFlusher, LogicsSnapshot
from tidemq.broker.store.index import IndexService
from tidemq.broker.store.mapped_file import StoreFile, fsync_dir
from tidemq.broker.store.observer import StoreObserver
from tidemq.broker.store.queues import QueueTable, fd_fitted_limit, soft_nofile_limit
from tidemq.broker.store.recovery import recover, truncate_commitlog, walk_records
from tidemq.broker.store.replay import (
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    Replayer,
    ScheduleTagsCode,
    default_schedule_tags_code,
)
from tidemq.broker.store.results import (  # re-exported: the store's API types
    GetResult,
    GetStatus,
    PutRequest,
    PutResult,
    PutStatus,
)
from tidemq.broker.store.retention import Retention, destroy_all, filesystem_usage, usage_ratio
from tidemq.broker.store.scan import Run, scan_records
from tidemq.broker.store.tasks import cancel_and_wait
from tidemq.broker.store.writer import Pending, RecordEncoder, encode_run, illegal

__all__ = ["GetResult", "GetStatus", "MessageStore", "PutRequest", "PutResult", "PutStatus"]

log = logging.getLogger(__name__)

# Runs of this many bytes are written with pwrite from a reused buffer when the CommitLog does not
# pre-fault its pages (SYNC_FLUSH; MessageStore._write). A
# single message of ~1 KiB keeps the copy into the mapping (one syscall per message, not measured
# against its share of a page fault), and so does a run past the bound the buffer never outgrows.
_PWRITE_MIN = 16 * 1024
_PWRITE_MAX = 4 * 1024 * 1024
_DUE_TOPICS = frozenset({SCHEDULE_TOPIC, TIMER_TOPIC})  # replicated one record at a time (their tags code)
REBUILD_STEP = 4096  # records walked between loop turns by a live consume-queue rebuild



class MessageStore:
    def __init__(self, config: StoreConfig, clock: Callable[[], float] = time.time,
                 disk_usage: Callable[[str], object] = filesystem_usage,
                 schedule_tags_code: ScheduleTagsCode = default_schedule_tags_code,
                 observer: StoreObserver | None = None) -> None:  # used for testing
        """``observer`` (fault-injection tests) is handed to every file and the CommitLog flusher."""
        self.config = config
        self._clock = clock
        self._disk_usage = disk_usage
        self._schedule_tags_code = schedule_tags_code
        self._flush_exec = concurrent.futures.ThreadPoolExecutor(1, "tidemq-store-flush")
        self._io_exec = concurrent.futures.ThreadPoolExecutor(1, "tidemq-store-io")
        self._commitlog = CommitLog(config.commitlog_dir, config.commitlog_segment_size, observer)
        self._commitlog.warm = config.warm_segments
        self._commitlog.prefault = config.flush_mode is FlushMode.ASYNC  # see commitlog.py
        self._dirty: set[StoreFile] = set()
        self._new_dirs: set[Path] = set()
        self._index = IndexService(config.index_dir, config.index_hash_slots, config.index_max_entries,
                                   self._dirty, self._new_dirs, observer)
        self._queues = QueueTable(config.consume_queue_dir, config.consume_queue_units_per_file,
                                  self._dirty, self._new_dirs, config.max_mapped_queue_files, observer)
        self._encoder = RecordEncoder(config.max_message_size)
        # Appending and dispatching are two steps; this one dispatcher serves live puts and
        # recovery's replay alike (consume queues, index, listeners).
        self._dispatcher = Dispatcher(
            ConsumeQueueBuilder(self._queues.get_or_create, self._commitlog.claim_at, config.root),
            IndexBuilder(self._index), on_index_error=self._index_failed)
        # Replicated records are dispatched as recovery's replay dispatches found ones (units and
        # index from their headers; the delay topic's units get their delivery time).
        self._replicated = Replayer(self._dispatcher.replicating(), 0, 0, schedule_tags_code)
        # Called once a put is in the CommitLog, before it is dispatched: a replicated master
        # streams it to its followers there (ha/replica.py), so their work overlaps its dispatch.
        self.on_commit: Callable[[], None] | None = None
        # Called when a put cannot make a file it needs (a full or failing disk): a replicated
        # master hands mastership over to a follower that can (ha/replica.py).
        self.on_write_failed: Callable[[OSError], None] | None = None
        # Appended replicated frames whose dispatch waits (append_replicated(dispatch=False)):
        # (physical offset, records, runs) in log order.
        self._undispatched: list[tuple[int, bytes | memoryview, list[Run]]] = []
        self._flusher = CommitLogFlusher(self._commitlog, config.flush_mode, config.async_flush_interval,
                                         config.sync_flush_timeout, self._flush_exec, observer)
        self._logics = LogicsFlusher(self._snapshot, self._flusher, config.checkpoint_path,
                                     config.logics_flush_interval, self._io_exec)
        self._retention = Retention(config, self._commitlog, clock, self._probe_disk,
                                    lambda: self._flusher.flushed, self._detach_logics, self._io_exec)
        self._cleanup_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Future[None]] = set()
        self._walking = asyncio.Lock()  # held while a live consume-queue rebuild walks the CommitLog
        self._disk_ratio = 0.0
        # Replicated sync groups: consumers read records that end at or below this CommitLog
        # offset only (the high-water mark, ha/replica.py); None: everything stored.
        self.visible_end: Callable[[], int] | None = None
        self._state = "new"  # new -> loaded -> running -> closed
        self._refuse: str | None = "the store is not loaded"
        self._last_store_ts = 0
        self._scratch = bytearray(0)  # a run encoded for pwrite (_write); at most _PWRITE_MAX
        self._id_prefix: tuple[bytes, int, str] = (b"", 0, "")  # store host, port -> offset id prefix
        self._stats = {"messages_put": 0, "bytes_put": 0, "batches_put": 0, "puts_refused": 0,
                       "index_errors": 0, "recovered_messages": 0, "crash_recoveries": 0}

    # ================================================================== lifecycle
    def load(self) -> None:
        """Open the files and recover (blocking; raises StoreCorruptError)."""
        cfg = self.config
        cfg.root.mkdir(parents=True, exist_ok=True)
        crash = cfg.abort_path.exists()
        new = not crash and not cfg.checkpoint_path.exists()  # never loaded before (for the log)
        cfg.abort_path.touch()
        fsync_dir(cfg.root)
        mapped = self._queues.mapped
        mapped.limit, why = fd_fitted_limit(cfg.max_mapped_queue_files, soft_nofile_limit())
        if why:
            log.warning("%s", why)
        cl = self._commitlog
        try:
            rec = recover(cfg, crash, cl, self._queues, self._index, self._dispatcher, self._schedule_tags_code)
        except BaseException:
            self._close_files(remove_abort=False)  # the abort marker stays: the next load re-checks
            raise
        end = rec.end
        self._last_store_ts = rec.last_store_timestamp
        # Make everything recovered durable and vouch for it, so the next crash starts from here.
        for seg in cl.segments_between(max(rec.durable, cl.min_offset), end):
            seg.flush()
        self._flusher.flushed = end
        self._logics.persist(self._snapshot())
        deletions.clear_pending(cfg.pending_cut_path)  # finished by the recovery (flushed now), or stale
        self._probe_disk()
        self._stats["recovered_messages"] = rec.scanned
        self._stats["crash_recoveries"] = int(crash)
        if new and end == 0:
            log.info("store %s is new: created empty (nothing to recover)", cfg.root)
        else:
            log.info(
                "store %s loaded after a %s: commitlog [%d, %d) in %d segment(s), %d queue(s); validated %d "
                "record(s) from offset %d, replayed %d consume-queue unit(s) and %d index record(s)",
                cfg.root, "crash" if crash else "clean shutdown", cl.min_offset, end, len(cl.segments),
                len(self._queues), rec.scanned, rec.walk_from, rec.units_written, rec.indexed,
            )
        self._state = "loaded"
        self._update_refusal()

    async def start(self) -> None:
        if self._state != "loaded":
            raise RuntimeError("MessageStore.start() needs a successful load() first")
        self._commitlog.start_preallocation(self._io_exec)
        self._flusher.start()
        self._logics.start()
        self._cleanup_task = asyncio.create_task(self._cleanup_loop(), name="tidemq-store-cleanup")
        self._state = "running"
        self._update_refusal()

    async def shutdown(self) -> None:
        """Flush everything, write the checkpoint, remove the abort marker, unmap."""
        if self._state == "closed":
            return
        was_loaded = self._state in ("loaded", "running")
        self._state = "closed"
        self._refuse = "the store is shut down"
        await cancel_and_wait(self._cleanup_task)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if was_loaded:
            await self._logics.stop()
            await self._flusher.stop()
            await self._logics.checkpoint()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._io_exec, self._close_files, was_loaded)
        self._flush_exec.shutdown(wait=True)
        self._io_exec.shutdown(wait=True)
        log.info("store %s shut down cleanly at commitlog offset %d",
                 self.config.root, self._commitlog.write_pos)

    def _close_files(self, remove_abort: bool) -> None:
        self._commitlog.close()
        self._index.close()
        self._queues.close()
        if remove_abort:
            self.config.abort_path.unlink(missing_ok=True)
            fsync_dir(self.config.root)

    def close_abruptly(self) -> None:
        """Release files without flushing or checkpointing and keep the abort marker: what a
        killed process leaves behind (the page cache keeps what was written). For tests."""
        self._state = "closed"
        self._refuse = "the store is closed"
        for task in (self._cleanup_task, self._flusher._task, self._logics._task):
            if task is not None:
                task.cancel()
        self._flusher.abandon()
        self._flush_exec.shutdown(wait=True, cancel_futures=True)
        self._io_exec.shutdown(wait=True, cancel_futures=True)
        self._commitlog.close()
        for f in self._index.files:
            f.mf.close()
        self._queues.close()

    # ================================================================== writing
    def _update_refusal(self) -> None:
        cfg = self.config
        if self._state == "closed":
            self._refuse = "the store is shut down"
        elif self._state == "new":
            self._refuse = "the store is not loaded"
        elif self._flusher.error is not None:
            self._refuse = f"the store cannot write to disk ({self._flusher.error}); see the broker log"
        elif self._disk_ratio >= cfg.disk_refuse_ratio:
            self._refuse = (f"disk of {cfg.root} is {self._disk_ratio:.0%} full (writes stop at "
                            f"{cfg.disk_refuse_ratio:.0%}); free space or lower file_reserved_hours")
        else:
            self._refuse = None

    def _refused(self) -> PutResult:
        self._stats["puts_refused"] += 1
        return illegal(PutStatus.SERVICE_NOT_AVAILABLE, self._refuse or "the store is not available")

    # Hot path (bench/produce_consume.py): validate, reserve, pack_into the mapping, dispatch.
    def put(self, req: PutRequest) -> PutResult:
        if self._refuse is not None or self._flusher.error is not None:
            self._update_refusal()
            if self._refuse is not None:
                return self._refused()
        p = self._encoder.prepare(req)
        if type(p) is PutResult:
            return p
        cl = self._commitlog
        if not cl.fits_one_segment(p.total):
            return illegal(PutStatus.MESSAGE_ILLEGAL,
                           f"record of {p.total} bytes exceeds the commitlog segment size")
        return self._write([p], p.total)

    def put_batch(self, reqs: list[PutRequest]) -> PutResult:
        """Store several messages of one topic and queue in one segment, all or nothing."""
        prepared = self.prepare_batch(reqs)
        if isinstance(prepared, PutResult):
            return prepared
        return self.put_prepared(*prepared)

    def prepare_batch(self, reqs: list[PutRequest]) -> tuple[list[Pending], int] | PutResult:
        """Validate and prepare a batch (or a slice of one) without writing anything: a caller
        may prepare a big batch slice by slice, concatenate the pending lists and sum the totals,
        then store it whole with :meth:`put_prepared`."""
        return self._encoder.prepare_batch(reqs)

    def put_prepared(self, pending: list[Pending], total: int) -> PutResult:
        """Store a prepared batch in one segment, all or nothing."""
        if self._refuse is not None or self._flusher.error is not None:
            self._update_refusal()
            if self._refuse is not None:
                return self._refused()
        if not self._commitlog.fits_one_segment(total):
            return illegal(PutStatus.MESSAGE_ILLEGAL,
                           f"batch of {total} bytes does not fit one commitlog segment "
                           f"({self.config.commitlog_segment_size} bytes); send smaller batches")
        result = self._write(pending, total)
        if result.status is PutStatus.PUT_OK:
            self._stats["batches_put"] += 1
        return result

    def _write(self, pending: list[Pending], total: int) -> PutResult:
        req0 = pending[0].req
        topic, queue_id = req0.topic, req0.queue_id
        cq = self._queues.get_or_create(topic, queue_id) if enters_consume_queue(req0.sys_flag) else None
        first_q = cq.max_offset if cq is not None else 0
        cl = self._commitlog
        try:  # every file the write needs exists before the first byte goes in
            if cq is not None:
                cq.prepare(first_q, len(pending))
            seg, rel = cl.reserve(total)
        except OSError as exc:
            log.error("cannot create a store file for %s/%d: %s", topic, queue_id, exc)
            if self.on_write_failed is not None:
                self.on_write_failed(exc)
            return illegal(PutStatus.SERVICE_NOT_AVAILABLE, f"cannot create a store file: {exc}")
        base = seg.start + rel
        now = int(self._clock() * 1000)
        mm = seg.mm
        step = 1 if cq is not None else 0
        if not cl.prefault and _PWRITE_MIN <= total <= _PWRITE_MAX:
            # Hot path (bench/compare.py row 3 under SYNC_FLUSH): a run is encoded into a reused
            # buffer and written with one pwrite. Under ASYNC_FLUSH the CommitLog's prefault thread
            # has made the pages ahead writable already, and a copy into the mapping is cheapest;
            # without it, written through the mapping, each fresh page of the preallocated segment
            # faulted and was zeroed by the kernel first
            # (readahead over unwritten extents): 0.2-1.9 us per KiB as the machine's free memory
            # goes, against a steady ~0.25 through pwrite, measured on ext4 (docs/benchmarks.md, "The broker's CPU per batched message").
            scratch = self._scratch
            if not scratch:
                # Made once at the bound (4 MiB resident): a buffer this big is mapped apart from
                # malloc's heap. A ~77 KiB one sat in the heap, which then shrank and regrew around
                # it every batch: fresh zeroed pages each time (perf: 4 % of the in-process batch
                # in do_anonymous_page).
                scratch = self._scratch = bytearray(_PWRITE_MAX)
            try:
                encode_run(scratch, 0, pending, first_q, step, base, now)
            except (struct.error, OverflowError, TypeError, ValueError) as exc:  # a header int out of range
                return illegal(PutStatus.MESSAGE_ILLEGAL, f"a header value is out of range: {exc}")
            try:
                seg.pwrite(rel, memoryview(scratch)[:total])
            except OSError as exc:  # pwrite zeroed what a cut write put in, and only that
                log.error("cannot write %d bytes to %s: %s", total, seg.path, exc)
                if self.on_write_failed is not None:
                    self.on_write_failed(exc)
                return illegal(PutStatus.SERVICE_NOT_AVAILABLE, f"cannot write to the commitlog: {exc}")
        else:
            try:
                encode_run(mm, rel, pending, first_q, step, base, now)
            except (struct.error, OverflowError, TypeError, ValueError) as exc:  # a header int out of range
                end = min(rel + total, seg.size)
                mm[rel:end] = bytes(end - rel)  # no valid record may remain past the write position
                return illegal(PutStatus.MESSAGE_ILLEGAL, f"a header value is out of range: {exc}")
        cl.commit(total)
        self._last_store_ts = now
        if self.on_commit is not None:
            self.on_commit()
        self._dispatcher.dispatch(topic, queue_id, req0.sys_flag, first_q, base, now, pending)
        msg_ids = []
        id_store, id_port, id_prefix = self._id_prefix  # a broker stores under one host: kept across puts
        phys = base
        for p in pending:
            if p.store is not id_store or p.store_port != id_port:
                id_store, id_port = p.store, p.store_port
                id_prefix = encode_offset_msg_id(id_store, id_port, 0)[:-16]
                self._id_prefix = (id_store, id_port, id_prefix)
            msg_ids.append(f"{id_prefix}{phys:016X}")
            phys += p.total
        stats = self._stats
        stats["messages_put"] += len(pending)
        stats["bytes_put"] += total
        return PutResult(PutStatus.PUT_OK, base, first_q, msg_ids, len(pending), base + total)

    # ================================================================== replication
    def read_commitlog(self, offset: int, max_bytes: int) -> tuple[int, bytes]:
        """Master: whole records of one segment from record boundary ``offset`` (a filler there
        is stepped over), at most ``max_bytes`` but at least one record; (their offset, bytes)."""
        return self._commitlog.read_from(offset, max_bytes)

    def is_record_boundary(self, offset: int) -> bool:
        """Whether ``offset`` is the CommitLog's end or where a record (or filler) starts."""
        return self._commitlog.is_boundary(offset)

    def append_replicated(self, offset: int, records: bytes | memoryview, *, dispatch: bool = True) -> int:
        """Follower: append a master's whole ``records`` at exactly CommitLog ``offset`` (this
        log's end, or the next segment's start after the master's filler), check each as recovery
        does and dispatch them; returns the new end. Raises StoreError and keeps nothing of the
        frame when it does not continue this log or a record fails its check.

        With ``dispatch=False`` the records are appended and their dispatch (consume queue units,
        index entries, listeners) waits for ``dispatch_replicated``, which the caller must run
        before it next yields to the event loop: a follower acks what it appended first, so the
        master's wait does not include this replica's dispatch (recovery redoes a dispatch a
        crash cut, from the CommitLog, as for any put)."""
        if self._state not in ("loaded", "running"):
            raise StoreError(f"cannot append replicated records: {self._refuse or 'the store is not open'}")
        cl = self._commitlog
        n = len(records)
        seg, rel = cl.place(offset, n)
        phys = seg.start + rel
        try:  # every record is checked before any byte goes in: a refused frame leaves nothing
            runs = scan_records(records, phys, True)
        except StoreCorruptError as exc:
            raise StoreError(f"replicated {exc}; the connection to the master is dropped and "
                             f"re-established") from None
        seg.mm[rel : rel + n] = records
        cl.commit(n)
        if runs:
            self._undispatched.append((phys, records, runs))
        if dispatch:
            self.dispatch_replicated()
        return cl.write_pos

    def dispatch_replicated(self) -> None:
        """Follower: dispatch what ``append_replicated(..., dispatch=False)`` appended, in order."""
        pending = self._undispatched
        if not pending:
            return
        self._undispatched = []
        # Hot path (bench/follower_apply.py): one dispatch per run of a topic and queue, as a
        # master's batch put does, not one per record.
        replay = self._replicated.dispatcher.replay
        for phys, records, runs in pending:
            for run in runs:
                if run.topic in _DUE_TOPICS:  # units carry a delivery time, from the record's properties
                    at = run.phys
                    for r in run.records:
                        self._replicated(at, decode_record_header(records, at - phys))
                        at += r.total
                    continue
                replay(run.topic, run.queue_id, run.sys_flag, run.queue_offset, run.phys, run.store_timestamp,
                       run.records)
            self._last_store_ts = runs[-1].store_timestamp

    async def truncate(self, offset: int, undeleted: Iterable[str] = ()) -> None:
        """Follower: cut the CommitLog at record boundary ``offset`` (what diverged from the
        master), drop consume-queue units pointing past it, and write the checkpoint, so neither
        a load nor a flush ever vouches for the cut records again. For a follower before it
        streams: nothing may put or read meanwhile (segments past the cut are deleted).

        ``undeleted``: topics whose deletion was in the cut tail (the metadata undo set them
        again): their consume queues, gone with that deletion, are rebuilt from the CommitLog
        below the cut, and their deletion marks past it forgotten (other marks past it move to
        it). ``pendingCut.json`` is written before the cut and removed once that is done
        (deletions.py); a failure raises (the handshake is retried: the next session's
        :meth:`finish_cut`, or the next load, finishes it before anything streams)."""
        self.dispatch_replicated()  # a unit past the cut is then dropped with the rest
        await self.finish_cut()
        cl = self._commitlog
        if offset == cl.write_pos:
            return
        if not cl.is_boundary(offset):
            raise StoreError(f"cannot truncate the commitlog at {offset}: no record starts there")
        loop = asyncio.get_running_loop()
        cut_from = cl.write_pos
        marks = deletions.load(self.config.deleted_topics_path)
        undeleted = sorted(t for t in set(undeleted) if any(m > offset for m in marks.get(t, ())))
        pending = any(m > offset for ms in marks.values() for m in ms)
        if pending:
            await loop.run_in_executor(self._io_exec, deletions.save_pending, self.config.pending_cut_path,
                                       offset, undeleted, False)
        async with self._flusher.paused():  # no flush round may report a position past the cut
            # The checkpoint stops vouching for the bytes to be cut first: a crash in the middle
            # of the cut then loads like a torn tail, not like damaged acknowledged data.
            self._flusher.cut(offset)
            await self._logics.checkpoint()
            await loop.run_in_executor(self._io_exec, truncate_commitlog, cl, offset,
                                       f"diverged from the master's log (it ended at {cut_from})")
            cl.rewound(offset)
        if pending:
            await loop.run_in_executor(self._io_exec, deletions.save_pending, self.config.pending_cut_path,
                                       offset, undeleted, True)
        gone = self._queues.truncate_past(offset)
        self._dirty.difference_update(gone)
        await loop.run_in_executor(self._io_exec, destroy_all, gone)
        await self._logics.checkpoint()
        await self.finish_cut()

    async def finish_cut(self) -> None:
        """A replica before it streams or takes writes as master: move the deletion marks of a
        cut recorded in ``pendingCut.json`` and rebuild the consume queues of its undeleted
        topics, then forget it. A record of a cut never made (a crash came first: the log still
        ends past it) is stale and forgotten."""
        path = self.config.pending_cut_path
        pending = deletions.load_pending(path)
        if pending is None:
            return
        loop = asyncio.get_running_loop()
        cut_at, topics, _ = pending
        if deletions.owed(pending, self._commitlog.write_pos):
            marks = deletions.load(self.config.deleted_topics_path)
            fixed = deletions.cut(marks, cut_at, topics)
            if fixed != marks:
                await loop.run_in_executor(self._io_exec, deletions.save, self.config.deleted_topics_path, fixed)
            if topics:
                await self._rebuild_topics(topics, deletions.latest(fixed))
        await loop.run_in_executor(self._io_exec, deletions.clear_pending, path)

    async def _rebuild_topics(self, topics: list[str], marks: dict[str, int]) -> None:
        """Empty the consume queues of ``topics`` and dispatch their records in the CommitLog
        again (those below a topic's deletion mark stay skipped), yielding to the loop every
        REBUILD_STEP records, retention held off meanwhile; then flush them."""
        loop = asyncio.get_running_loop()
        gone = [f for topic in topics for f in self._queues.reset_topic(topic)]
        await loop.run_in_executor(self._io_exec, destroy_all, gone)
        wanted = set(topics)
        replay = Replayer(self._dispatcher, 0, 1 << 62, self._schedule_tags_code, marks)
        cl = self._commitlog
        found = walked = 0
        async with self._walking:
            start, end = max(min(marks.get(t, 0) for t in topics), cl.min_offset), cl.write_pos
            log.warning("rebuilding the consume queues of topic(s) %s from the commitlog [%d, %d): their "
                        "deletion was cut", ", ".join(topics), start, end)
            for phys, h in walk_records(cl, start, end):
                walked += 1
                if h.topic in wanted:
                    replay(phys, h)
                    found += 1
                if walked % REBUILD_STEP == 0:
                    await asyncio.sleep(0)
        await self._logics.checkpoint()
        log.warning("consume queues of topic(s) %s rebuilt: %d message(s) of %d record(s) walked",
                    ", ".join(topics), found, walked)

    async def flush_commitlog(self) -> int:
        """Flush the CommitLog now; returns the flushed (durable) offset."""
        await self._flusher.flush()
        return self._flusher.flushed

    async def flush(self) -> None:
        """Flush the CommitLog, consume queues and index now, then write the checkpoint."""
        await self._flusher.flush()
        await self._logics.checkpoint()

    async def wait_durable(self, end_offset: int) -> bool:
        """SYNC: True once the CommitLog is flushed past ``end_offset`` (group commit), False after
        ``sync_flush_timeout``. ASYNC: True at once."""
        return await self._flusher.wait_durable(end_offset)

    def when_durable(self, end_offset: int, callback: Callable[[bool], None]) -> bool:
        """``wait_durable`` as a callback (hot path: SYNC_FLUSH sends): False when durable already
        (or ASYNC), else True, and ``callback`` is called on the loop thread with True (flushed) or
        False (timeout, failure) the moment that is known."""
        return self._flusher.when_durable(end_offset, callback)

    def add_dispatch_listener(self, cb: DispatchListener) -> None:
        """``cb(topic, queue id, queue offset, tags code)`` hears of live puts that entered a
        consume queue (long-poll wake-ups, timers); never of recovery's replay."""
        self._dispatcher.listeners.append(cb)

    def _index_failed(self, phys: int, exc: OSError) -> None:
        self._stats["index_errors"] += 1
        log.error("indexing the message at commitlog offset %d failed: %s", phys, exc)

    # ================================================================== reading
    def get_messages(self, topic: str, queue_id: int, offset: int, max_msgs: int,
                     tag_codes: frozenset[int] | None, max_bytes: int = 256 * 1024,
                     everything: bool = False) -> GetResult:
        """Messages of a queue from ``offset``, below ``visible_end`` unless ``everything`` (the
        broker's own readers that must see what is stored, e.g. a follower applying metadata)."""
        cq = self._queues.get(topic, queue_id)
        visible = None if everything else self.visible_end
        return reader.get_messages(cq, self._commitlog, offset, max_msgs, tag_codes, max_bytes,
                                   visible() if visible is not None else None)

    def _cq(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._queues.get(topic, queue_id)

    def readable(self, topic: str, queue_id: int, offset: int) -> bool:
        """Whether a pull from ``offset`` finds a record now: one is there, and below
        ``visible_end`` (a long poll waits otherwise)."""
        cq = self._cq(topic, queue_id)
        if cq is None or cq.max_offset <= offset:
            return False
        visible = self.visible_end
        if visible is None:
            return True
        unit = cq.unit(offset)
        return unit is None or unit[0] + unit[1] <= visible()

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cq(topic, queue_id)
        return cq.max_offset if cq is not None else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cq(topic, queue_id)
        return cq.min_offset if cq is not None else 0

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return reader.offset_by_time(self._cq(topic, queue_id), self._commitlog, timestamp_ms)

    def earliest_store_time(self, topic: str, queue_id: int) -> int:
        cq = self._cq(topic, queue_id)
        return reader.store_time_at(cq, self._commitlog, cq.min_offset) if cq is not None else 0

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int:
        return reader.store_time_at(self._cq(topic, queue_id), self._commitlog, offset)

    def read_record(self, physical_offset: int) -> bytes | None:
        return self._commitlog.read_record(physical_offset)

    def query_by_key(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> list[bytes]:
        return reader.query_by_key(self._index, self._commitlog, topic, key, max_num, begin_ms, end_ms)

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(self._queues.by_topic.get(topic, {}))

    def topics(self) -> list[str]:
        return sorted(self._queues.by_topic)

    # ================================================================== admin
    def delete_topic(self, topic: str, at: int | None = None) -> None:
        """Drop the topic's consume queues now; their files are deleted by a worker thread.
        The deletion is marked at CommitLog offset ``at`` (default: the log's end): replay skips
        the topic's records before it.

        The directory is renamed to a tombstone on the loop first: a topic re-created (and
        written to) before the worker runs gets fresh files that the worker never touches.
        """
        files = self._queues.drop_topic(topic)
        if files is None:
            return
        # Durable before any new put: replay skips the topic's older records (a small admin write).
        path = self.config.deleted_topics_path
        mark = self.commitlog_max_offset if at is None else at
        deletions.save(path, deletions.deleted(deletions.load(path), topic, mark))
        topic_dir = self.config.consume_queue_dir / topic
        aside = self.config.consume_queue_dir / f".deleted-{topic}-{time.monotonic_ns()}"
        tomb: Path | None = aside
        try:
            os.rename(topic_dir, aside)
        except FileNotFoundError:
            tomb = None
        except OSError as exc:
            log.error("could not move %s aside for deletion: %s", topic_dir, exc)
            tomb = None

        def remove() -> None:
            for f in files:
                f.close()  # never unlink by path: a new file may live there now
            if tomb is not None:
                shutil.rmtree(tomb, ignore_errors=True)

        log.info("deleting consume queues of topic %s (%d file(s))", topic, len(files))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on the loop (tools, tests): just do it
            remove()
            return
        fut = loop.run_in_executor(self._io_exec, remove)
        self._background.add(fut)
        fut.add_done_callback(self._background.discard)

    async def run_retention(self, manual: bool = False) -> int:
        """One cleanup pass now (``manual``: ignore delete_when_hours, as TRIGGER_DELETE_FILES).
        Returns the number of CommitLog segments deleted."""
        try:
            async with self._walking:  # no segment goes while a rebuild walks the CommitLog
                return await self._retention.run_once(manual)
        finally:
            self._update_refusal()

    async def _cleanup_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.cleanup_interval)
            try:
                await self.run_retention()
            except OSError as exc:
                log.error("retention pass failed: %s", exc)

    def _detach_logics(self, phys_min: int) -> list[StoreFile]:
        gone: list[StoreFile] = [*self._queues.detach_below(phys_min), *self._index.detach_below(phys_min)]
        self._dirty.difference_update(gone)
        return gone

    def _probe_disk(self) -> float:
        try:
            self._disk_ratio = usage_ratio(self._disk_usage, str(self.config.root))
        except OSError as exc:
            log.warning("cannot read disk usage of %s: %s", self.config.root, exc)
        return self._disk_ratio

    def _snapshot(self) -> LogicsSnapshot:
        index_file, index_count = self._index.state()  # marks the active index file dirty
        dirty = list(self._dirty)
        self._dirty.clear()
        dirs = sorted(self._new_dirs, key=lambda p: len(p.parts), reverse=True)  # children first
        self._new_dirs.clear()
        return LogicsSnapshot(dirty, dirs, self._commitlog.write_pos, index_file, index_count,
                              self._last_store_ts)

    # ================================================================== observability
    @property
    def commitlog_min_offset(self) -> int:
        return self._commitlog.min_offset

    @property
    def commitlog_max_offset(self) -> int:
        return self._commitlog.write_pos

    @property
    def flushed_offset(self) -> int:
        return self._flusher.flushed

    @property
    def flush_mode(self) -> FlushMode:
        return self.config.flush_mode

    def disk_usage_ratio(self) -> float:
        """Used fraction of the store's disk (probed now; also refreshes put refusal)."""
        ratio = self._probe_disk()
        self._update_refusal()
        return ratio

    def stats(self) -> dict[str, int | float]:
        cl = self._commitlog
        return {
            **self._stats,
            "segments": len(cl.segments),
            "segments_created": cl.created_segments,
            "segments_created_on_loop": cl.sync_creations,
            "segments_deleted": self._retention.segments_deleted,
            "logic_files_deleted": self._retention.files_deleted,
            "commitlog_min_offset": cl.min_offset,
            "commitlog_max_offset": cl.write_pos,
            "flushed_offset": self._flusher.flushed,
            "commitlog_fsyncs": self._flusher.fsyncs,
            "flush_rounds": self._flusher.rounds,
            "flush_seconds": self._flusher.seconds,
            "checkpoints": self._logics.checkpoints,
            "queues": len(self._queues),
            # Consume-queue files mapped now / at most at once (bound: cq_files_mapped_limit).
            "cq_files_mapped": len(self._queues.mapped),
            "cq_files_mapped_peak": self._queues.mapped.peak,
            "cq_files_mapped_limit": self._queues.mapped.limit,
            "cq_file_maps": self._queues.mapped.maps,
            "cq_file_unmaps": self._queues.mapped.unmaps,
            "index_files": len(self._index.files),
            "index_entries": self._index.entries_added,
            "disk_usage_ratio": self._disk_ratio,
        }
