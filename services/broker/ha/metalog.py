"""Metadata replication (issue 17): everything a failover must keep rides the replicated CommitLog.

A replicated broker (``--coordination``) keeps its topics, subscription groups, consumer offsets,
delay/timer progress and transaction-checker progress in its own files, as a single broker does;
:class:`MetadataLog` also writes every change of them as a record of the system topic
``rmq_sys_TIDEMQ_METADATA`` (codec: :mod:`tidemq.broker.ha.metadata`), so the group's one
acknowledgement rule covers them; a follower applies the records it receives to its own managers
(:mod:`tidemq.broker.ha.metaapply`).

- **Master** (``may_record`` true): a topic or group created, changed or deleted (admin requests,
  implicit creation) is appended at once, from the managers' ``on_change``; an admin request (and
  an explicit UPDATE_CONSUMER_OFFSET) is answered only once ``settle`` saw ``replicated`` resolve
  SUCCESS for the log end it produced, else with the code the group's rule gave. High-frequency
  changes (offsets committed by pulls, delay/timer and checker progress) are collected and
  appended together every ``batch_interval`` (0.25 s), the changed values only.
- **Follower**: records arrive through replication and are applied (``MetadataApplier``). The
  managers persist as they always do; ``config/metadataApplied.json`` holds the queue offset up to
  which records are applied, written only after the managers they touched were persisted, and at
  start the records past it are applied again (every change is a value to set: idempotent).
- A replica that becomes master therefore holds every change the log holds; it rebuilds the
  transaction op book from the replicated op queue (``promoted``) once its readers see the log
  end it was elected with (the high-water mark), so it neither re-checks nor commits twice a
  transaction its predecessor resolved.

Invariants:
- A master's own records count as applied when appended (``applied`` moves past them).
- Nothing is appended while applying, nor by a replica that may not acknowledge: a follower's own
  changes (groups created by heartbeats) stay local, and the master's record of the same change
  overwrites them.
- Without ``--coordination`` this class is not built and nothing is written.

A replica that cuts a diverged tail (``truncate``) undoes the metadata changes of the cut records
(:mod:`tidemq.broker.ha.metarewind`): each key they named gets what the kept log gives it.

A topic deleted in the cut tail is set again and its consume queues, gone with the deletion, are
rebuilt from the CommitLog below the cut (the store's truncate, ``undeleted``).

A follower marks a replicated topic deletion in its store at the deletion's record (a master's
mark is the log's end right after appending it): a cut keeps a mark exactly when it keeps the
record, and a replay keeps a topic re-created in the same replication frame.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.ha.metaapply import PERSISTS, Managers, MetadataApplier
from tidemq.broker.ha.metadata import (
    METADATA_QUEUE,
    METADATA_TOPIC,
    Change,
    DelayProgress,
    GroupDeleted,
    GroupSet,
    OffsetEntry,
    OffsetsDropped,
    TopicDeleted,
    TopicSet,
    TransactionProgress,
    encode,
    kind_of,
    split_offsets,
)
from tidemq.broker.messaging.context import refused
from tidemq.broker.store.jsonfile import read_json, write_json_atomic
from tidemq.broker.store.results import PutRequest
from tidemq.broker.store.tasks import cancel_and_wait
from tidemq.broker.topics import TopicConfig
from tidemq.errors import StoreError
from tidemq.remoting.codes import ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.store.store import MessageStore

__all__ = ["Managers", "MetadataLog", "MetadataLogConfig"]

log = logging.getLogger(__name__)

# What the group's rule answered, as a sentence for the admin or consumer that made the change.
_NOT_REPLICATED: dict[int, str] = {
    ResponseCode.FLUSH_SLAVE_TIMEOUT: "the change is stored on the master, but the in-sync replicas did "
                                      "not acknowledge it in time; check the followers and retry",
    ResponseCode.SLAVE_NOT_AVAILABLE: "the change is stored on the master, but fewer replicas than "
                                      "--min-in-sync are in sync; bring a follower back and retry",
}


@dataclass(frozen=True, slots=True)
class MetadataLogConfig:
    batch_interval: float = 0.25  # s: collected offsets and progress are appended at most this often
    persist_interval: float = 2.0  # s: the applied position (and what it covers) written this often


class MetadataLog:
    """See the module docstring. ``may_record``: this replica is the acknowledging master;
    ``refusal``: (code, remark) why a change must be refused before it is made, or None;
    ``replicated(end)``: None when the log up to ``end`` satisfies the group's rule, else a future
    of the ResponseCode (tidemq.broker.ha.replica)."""

    def __init__(self, store: MessageStore, managers: Managers, state_path: Path, *,
                 store_host: tuple[str, int], clock: Callable[[], float],
                 may_record: Callable[[], bool],
                 refusal: Callable[[], tuple[int, str] | None],
                 replicated: Callable[[int], asyncio.Future[int] | None],
                 config: MetadataLogConfig = MetadataLogConfig()) -> None:
        self.store = store
        self.m = managers
        self.path = state_path
        self.store_host = store_host
        self.clock = clock
        self.may_record = may_record
        self.refusal = refusal
        self.replicated = replicated
        self.config = config
        self.applier = MetadataApplier(store, managers)
        self.last_end = -1  # CommitLog end of the newest record appended here
        self.recorded = 0  # records appended here
        self._written = -1  # the applied position last written
        self._error: str | None = None  # an append that failed since the last settle
        self._master = False
        self._promoting: int | None = None  # log end when this replica became master, until promoted
        self._delay: tuple[tuple[tuple[int, int], ...], int] | None = None  # last recorded
        self._checker: tuple[int, int] | None = None
        self._task: asyncio.Task[None] | None = None
        self._offsets_soon: asyncio.Future[None] | None = None  # explicit commits of this loop round
        self._persist_lock = asyncio.Lock()
        self._baselined = False  # the empty log's baseline checked (see _ensure_baseline)

    # ---------------------------------------------------------------------------- lifecycle
    def attach(self) -> None:
        """Hear every change of the managers and every record the store dispatches."""
        m = self.m
        m.topics.on_change = self._topic_changed
        m.groups.on_change = self._group_changed
        m.offsets.on_drop = self._offsets_dropped
        m.offsets.track_changes()
        self.store.add_dispatch_listener(self.applier.on_dispatch)

    def load(self) -> None:
        """Read the applied position (blocking; after the store is loaded)."""
        data = read_json(self.path, None) or {}
        applied = data.get("applied", 0) if isinstance(data, dict) else 0
        if not isinstance(applied, int) or applied < 0:
            log.warning("%s holds no usable applied position (%r); applying the metadata log from its start",
                        self.path, applied)
            applied = 0
        store = self.store
        a = self.applier
        a.applied = min(max(applied, store.min_offset(METADATA_TOPIC, METADATA_QUEUE)),
                        store.max_offset(METADATA_TOPIC, METADATA_QUEUE))
        self._written = a.applied

    async def start(self) -> None:
        """Apply what the log holds past the applied position, then run the batching loop."""
        end = self.store.max_offset(METADATA_TOPIC, METADATA_QUEUE)
        a = self.applier
        if end > a.applied:
            n = a.apply_until(end, replay=True)
            log.info("applied %d metadata record(s) up to queue offset %d at start", n, a.applied)
        self._task = asyncio.create_task(self._run(), name="metadata-log")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._master and self.may_record():
            self._record_batch()
        await self._persist()

    async def truncate(self, at: int) -> None:
        """Follower, at the handshake: undo what the metadata records past CommitLog offset ``at``
        changed (an old master's unacknowledged changes, or what it applied of them), write the
        managers and the applied position, then cut the log at ``at`` (the store's truncate).
        Raises StoreError (the follower retries the handshake) when any step fails; the log then
        keeps its tail and its changes are applied again, as before."""
        store = self.store
        store.dispatch_replicated()  # every record appended is in the metadata queue
        applier = self.applier
        first, cut = await applier.cut_changes(at)
        try:
            plan = await applier.rewind(first, cut, at)
            if not await self._persist():
                raise StoreError("the metadata undone for the cut could not be written; the log is not cut")
            try:
                await store.truncate(at, undeleted=plan.restored_topics)
            finally:  # made or not, the timer loads its queue again (always safe)
                self.m.schedule.after_cut()
        except BaseException as exc:  # the store refused the cut point, a write failed, ...
            applier.apply_until(store.max_offset(METADATA_TOPIC, METADATA_QUEUE))  # what is left
            if isinstance(exc, Exception) and not isinstance(exc, (StoreError, OSError)):
                log.exception("undoing the metadata of the cut tail failed")
                raise StoreError(f"undoing the metadata of the cut tail failed: {exc!r}") from exc
            raise

    # ---------------------------------------------------------------------------- the admin's side
    def check(self) -> None:
        """Raise the BrokerError a change must be refused with now (not master, in-sync set too
        small), before anything is changed."""
        refusal = self.refusal()
        if refusal is not None:
            raise refused(*refusal)

    async def settle(self) -> None:
        """Wait until every change appended so far satisfies the group's rule. Raises BrokerError
        with the rule's code (or SYSTEM_ERROR when an append failed)."""
        error, self._error = self._error, None
        if error is not None:
            raise refused(ResponseCode.SYSTEM_ERROR, error)
        if self.last_end < 0:
            return
        pending = self.replicated(self.last_end)
        if pending is None:
            return
        code = await pending
        if code != ResponseCode.SUCCESS:
            raise refused(code, _NOT_REPLICATED.get(code, f"the change was not replicated (code {code})"))

    async def commit_offsets(self) -> None:
        """Append the offsets committed so far (an explicit UPDATE_CONSUMER_OFFSET) and settle.

        The commits of one event-loop round share one record: a RocketMQ client persists each
        queue's offset in its own request, all at once every 5 s."""
        if self.may_record():
            if self._offsets_soon is None:
                self._offsets_soon = asyncio.get_running_loop().create_future()
                asyncio.get_running_loop().call_soon(self._offsets_now)
            await asyncio.shield(self._offsets_soon)
        await self.settle()

    def _offsets_now(self) -> None:
        soon, self._offsets_soon = self._offsets_soon, None
        try:
            if self.may_record():
                self._record_offsets()
        finally:
            if soon is not None and not soon.done():
                soon.set_result(None)

    # ---------------------------------------------------------------------------- recording
    def _topic_changed(self, name: str, tc: TopicConfig | None) -> None:
        if not self.applier.applying and self.may_record():
            self._append(TopicDeleted(name) if tc is None else TopicSet(tc))

    def _group_changed(self, name: str, g: SubscriptionGroupConfig | None) -> None:
        if not self.applier.applying and self.may_record():
            self._append(GroupDeleted(name) if g is None else GroupSet(g))

    def _offsets_dropped(self, topic: str | None, group: str | None) -> None:
        if not self.applier.applying and self.may_record():
            self._append(OffsetsDropped(topic, group))

    def _ensure_baseline(self) -> None:
        """The first master of a log that has no metadata record yet (a broker that ran before
        ``--coordination``, or a new group) writes what its managers hold first: topics (but the
        broker's own), groups and offsets, so followers learn them and the log is the whole
        history. Checked once per process, before the first record appended here (a new master's
        first batch round appends its delay progress at least)."""
        if self._baselined:
            return
        self._baselined = True
        if self.store.max_offset(METADATA_TOPIC, METADATA_QUEUE) > 0:
            return
        m = self.m
        topics = [tc for name, tc in sorted(m.topics.topics.items()) if name not in m.topics.ensured]
        groups = [g for _, g in sorted(m.groups.groups.items())]
        offsets = [OffsetEntry(group, topic, queue_id, offset)
                   for key, queues in sorted(m.offsets.table.items())
                   for topic, _, group in (key.rpartition("@"),)
                   for queue_id, offset in sorted(queues.items())]
        baseline: list[Change] = [*map(TopicSet, topics), *map(GroupSet, groups), *split_offsets(offsets)]
        for change in baseline:
            self._append(change)
        if topics or groups or offsets:
            log.info("metadata: the replicated log starts with this broker's %d topic(s), %d group(s) and "
                     "%d committed offset(s)", len(topics), len(groups), len(offsets))

    def _append(self, change: Change) -> None:
        self._ensure_baseline()
        kind = kind_of(change)
        now = int(self.clock() * 1000)
        req = PutRequest(METADATA_TOPIC, METADATA_QUEUE, encode(change), {"TAGS": kind},
                         born_timestamp=now, born_host=self.store_host, store_host=self.store_host)
        applier = self.applier
        applier.appending = True
        try:
            result = self.store.put(req)
        finally:
            applier.appending = False
        if not result.ok:
            self._error = (f"the {kind} change is made on this broker but could not be written to the "
                           f"replicated log ({result.status.name} {result.remark}); it is not on the "
                           "followers: retry once the store accepts writes")
            log.error("metadata change %s not appended: %s %s", kind, result.status.name, result.remark)
            return
        applier.applied = result.queue_offset + 1
        self.last_end = result.end_offset
        self.recorded += 1
        applier.touched.add(PERSISTS[type(change)])

    def _record_offsets(self) -> None:
        entries = [OffsetEntry(*c) for c in self.m.offsets.take_changes()]
        for batch in split_offsets(entries):
            self._append(batch)

    def _record_batch(self) -> None:
        self._record_offsets()
        delay = self.m.schedule.progress()
        if delay != self._delay:
            self._append(DelayProgress(*delay))
            self._delay = delay
        tx = self.m.transactions
        checker = (tx.half_progress, tx.op_progress)
        if checker != self._checker:
            self._append(TransactionProgress(*checker))
            self._checker = checker

    def promoted(self) -> None:
        """This replica just became the acknowledging master: what it applied as a follower is
        all it has; the transaction op book is rebuilt from the replicated op queue."""
        read = self.m.transactions.rebuild()
        log.info("metadata: acknowledging master now, after %d applied record(s) (queue offset %d); "
                 "%d op record(s) replayed into the transaction book", self.applier.applied_count,
                 self.applier.applied, read)

    async def _run(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        next_persist = loop.time() + cfg.persist_interval
        while True:
            await asyncio.sleep(cfg.batch_interval)
            try:
                master = self.may_record()
                if master and not self._master:
                    self._promoting = self.store.commitlog_max_offset
                elif not master:
                    self._promoting = None
                self._master = master
                if self._promoting is not None and self._visible_end() >= self._promoting:
                    self._promoting = None
                    self.promoted()
                if master:
                    self._record_batch()
                else:  # a follower's own commits and progress are not the group's
                    self.m.offsets.take_changes()
                    self._delay = self._checker = None
                if loop.time() >= next_persist:
                    next_persist = loop.time() + cfg.persist_interval
                    await self._persist()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("metadata batching round failed; next round in %g s", cfg.batch_interval)

    def _visible_end(self) -> int:
        """How far the store's readers see: a new master's high-water mark rises to its log end
        once the in-sync followers acked it; the op book is rebuilt from what is visible then."""
        visible = self.store.visible_end
        return visible() if visible is not None else self.store.commitlog_max_offset

    async def _persist(self) -> bool:
        """Write the applied position once the managers its records touched are written; False
        when a write failed (retried in the next round). One writer at a time: a position read
        by an earlier call must not land after a later one."""
        async with self._persist_lock:
            a = self.applier
            applied, touched = a.applied, a.touched
            if applied == self._written and not touched:
                return True
            a.touched = set()
            m = self.m
            writers = {"topics": m.persist_topics, "groups": m.persist_groups, "offsets": m.persist_offsets,
                       "delay": m.schedule.persist, "transactions": m.transactions.persist}
            try:
                for kind in sorted(touched):
                    await writers[kind]()
                await asyncio.to_thread(write_json_atomic, self.path, {"applied": applied})
            except OSError as exc:
                a.touched |= touched
                log.error("metadata applied position not written to %s (%s); retrying in %g s", self.path, exc,
                          self.config.persist_interval)
                return False
            except asyncio.CancelledError:  # stopped midway: the final round writes them
                a.touched |= touched
                raise
            self._written = applied
            return True
