"""The check-back service: every ``check_interval`` it walks the half queue from its progress
offset and asks a producer of the group about each transaction that is still open after
``timeout`` (remoting: CHECK_TRANSACTION_STATE, oneway; the front-end serving the producer's
connection provides the ``ask``).

One round (``check_once``) looks only at half records that existed when it began (copies it
appends wait for a later round). For each record (see ``book.judge``): resolved ones are passed;
the first one too young ends the round; a due one is re-appended with TRANSACTION_CHECK_TIMES + 1
(so the progress can move past it) and the copy is sent to one live producer connection of its
group. With no producer of the group online, the record is re-appended without counting a check.
A half message immune longer than the timeout (CHECK_IMMUNITY_TIME_IN_SECONDS) is re-appended
with its deadline, so it does not hold back the others.
After ``check_max`` checks it is discarded into TRANS_CHECK_MAX_TIME_TOPIC and marked resolved.

Invariant: the progress offset only passes a record once it is resolved, was re-appended, or was
discarded; a failed append stops the round at that record.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from tidemq.broker.store.store import GetStatus
from tidemq.broker.transaction.book import CheckPolicy, Verdict, judge
from tidemq.broker.transaction.half import (
    HALF_QUEUE_ID,
    HALF_TOPIC,
    check_record,
    half_info,
    root_of,
    to_copy,
    to_discarded,
)
from tidemq.broker.transaction.service import TransactionService
from tidemq.errors import CodecError, RemotingError
from tidemq.message import MessageExt, Prop, decode_record

log = logging.getLogger(__name__)

BATCH = 32
MAX_READ_BYTES = 1 << 20



class ProducerConnection(Protocol):
    """What the checker needs of a producer's connection (the front-end's own type)."""

    @property
    def peer(self) -> str: ...  # "host:port", for logs

    @property
    def is_open(self) -> bool: ...


P = TypeVar("P", bound=ProducerConnection)


@dataclass(slots=True)
class RoundStats:
    scanned: int = 0
    checked: int = 0
    renewed: int = 0
    discarded: int = 0
    no_producer: int = 0


class TransactionChecker(Generic[P]):
    def __init__(self, service: TransactionService, producers: Callable[[str], list[P]],
                 ask: Callable[[P, MessageExt, bytes], None], rng: random.Random | None = None,
                 may_write: Callable[[], bool] = lambda: True) -> None:
        self.service = service
        # Only the group's acknowledging master checks (a check appends to the log, which on a
        # follower is the master's copy: tidemq.broker.ha).
        self.may_write = may_write
        self.producers = producers  # the connections of a group's producers
        # Asks one producer about a half message (a re-appended copy, and the record to show:
        # half.check_record); raises RemotingError when that connection cannot take it, and the
        # next one is tried.
        self.ask = ask
        self.rng = rng or random.Random()
        cfg = service.config
        self.policy = CheckPolicy(
            timeout_ms=int(cfg.timeout * 1000),
            check_max=cfg.check_max,
            max_age_ms=int(cfg.max_age_hours * 3600 * 1000),
        )
        self.rounds = 0

    async def run(self) -> None:
        """Check every ``check_interval`` until cancelled."""
        while True:
            await asyncio.sleep(self.service.config.check_interval)
            if not self.may_write():
                continue
            try:
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("transaction check round failed")

    async def check_once(self) -> RoundStats:
        svc = self.service
        store = svc.store
        stats = RoundStats()
        now_ms = svc.now_ms()
        end = store.max_offset(HALF_TOPIC, HALF_QUEUE_ID)
        offset = max(svc.half_progress, store.min_offset(HALF_TOPIC, HALF_QUEUE_ID))
        while offset < end:
            res = store.get_messages(HALF_TOPIC, HALF_QUEUE_ID, offset, BATCH, None, MAX_READ_BYTES)
            if res.status is GetStatus.OFFSET_TOO_SMALL or not res.records:
                if res.next_begin_offset <= offset:
                    break
                offset = res.next_begin_offset
                continue
            stop_at = None
            for raw in res.records:
                stop_at = self._one(raw, now_ms, end, stats)
                if stop_at is not None:
                    break
            if stop_at is not None:
                offset = stop_at
                break
            offset = min(res.next_begin_offset, end)
            await asyncio.sleep(0)  # let requests in between batches
        svc.advance(offset)
        self.rounds += 1
        await svc.persist()
        if stats.checked or stats.discarded or stats.no_producer:
            log.info("transaction check round: %d half record(s) looked at, %d check(s) sent, "
                     "%d discarded, %d without a producer online; progress %d/%d", stats.scanned,
                     stats.checked, stats.discarded, stats.no_producer, offset, end)
        return stats

    def _one(self, raw: bytes, now_ms: int, end: int, stats: RoundStats) -> int | None:
        """Handle one half record; return its offset to stop the round there, else None."""
        svc = self.service
        try:
            msg = decode_record(raw)
            info = half_info(msg)
        except CodecError as exc:
            log.error("skipping an unusable half record: %s", exc)
            return None
        if msg.queue_offset >= end:
            return msg.queue_offset
        stats.scanned += 1
        v = judge(info, info.root in svc.book, now_ms, self.policy)
        if v is Verdict.RESOLVED:
            return None
        if v is Verdict.WAIT:
            return msg.queue_offset
        if v is Verdict.RENEW:
            if self._append_copy(msg, info.check_times, info.not_before_ms) is None:
                return msg.queue_offset
            svc.stats["renewed"] += 1
            stats.renewed += 1
            return None
        if v is Verdict.DISCARD:
            return self._discard(msg, info.root, info.check_times, stats)
        conns = [c for c in self.producers(info.group) if c.is_open]
        if not conns:
            if self._append_copy(msg, info.check_times, info.not_before_ms) is None:
                return msg.queue_offset
            svc.stats["no_producer"] += 1
            stats.no_producer += 1
            log.debug("no producer of group %s online to check transaction %s", info.group,
                      msg.properties.get(Prop.UNIQ_KEY))
            return None
        copy = self._append_copy(msg, info.check_times + 1, None)
        if copy is None:
            return msg.queue_offset
        self._send_check(copy, conns, info.group)
        stats.checked += 1
        return None

    def _append_copy(self, msg: MessageExt, check_times: int, not_before_ms: int | None) -> MessageExt | None:
        store = self.service.store
        result = store.put(to_copy(msg, self.service.store_host, check_times, not_before_ms))
        if not result.ok:
            log.error("re-appending half message %s failed (%s %s); checking stops here this round",
                      msg.properties.get(Prop.UNIQ_KEY), result.status.name, result.remark)
            return None
        self.service.track_copy(root_of(msg), result.queue_offset)
        raw = store.read_record(result.physical_offset)
        return decode_record(raw) if raw is not None else None

    def _discard(self, msg: MessageExt, root: int, check_times: int, stats: RoundStats) -> int | None:
        svc = self.service
        result = svc.store.put(to_discarded(msg, svc.store_host))
        if not result.ok:
            log.error("moving half message %s to the check-max topic failed (%s %s)",
                      msg.properties.get(Prop.UNIQ_KEY), result.status.name, result.remark)
            return msg.queue_offset
        svc.resolve(root, msg.queue_id)
        svc.stats["discarded"] += 1
        stats.discarded += 1
        log.warning("transaction %s of group %s (topic %s) discarded after %d check(s) without an "
                    "answer; kept in TRANS_CHECK_MAX_TIME_TOPIC", msg.properties.get(Prop.UNIQ_KEY),
                    msg.properties.get(Prop.PGROUP), msg.properties.get(Prop.REAL_TOPIC), check_times)
        return None

    def _send_check(self, copy: MessageExt, conns: list[P], group: str) -> bool:
        record = check_record(copy)
        self.rng.shuffle(conns)
        for conn in conns:
            try:
                self.ask(conn, copy, record)
            except RemotingError as exc:
                log.debug("check of %s to %s failed: %s", group, conn.peer, exc)
                continue
            self.service.stats["checks_sent"] += 1
            log.debug("asked producer %s of group %s about transaction %s", conn.peer, group,
                      copy.properties.get(Prop.UNIQ_KEY))
            return True
        log.info("no producer connection of group %s accepted the check", group)
        return False
