"""Re-dispatching recovered CommitLog records into consume queues and the index (at load).

Invariants: a record is put in its consume queue at the queue offset stored in the record
(QUEUEOFFSET), so replaying a record twice is harmless; a unit already holding the same pointer is
left alone; a different one, or a gap, means damage and refuses the start (StoreCorruptError).
Records of a deleted topic written before its deletion are skipped, so a re-created topic's queue
offsets (which restart at 0) never collide with the old ones. PREPARED and ROLLBACK half messages never enter a consume queue; ROLLBACK ones are not
indexed. SCHEDULE_TOPIC_XXXX units carry the delivery time as tags code, recomputed here by the
``schedule_tags_code`` hook (default: RocketMQ's 18 delay levels, from the DELAY property).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tidemq.errors import StoreCorruptError
from tidemq.message import TRANSACTION_MASK, Prop, RecordHeader, SysFlag, decode_properties, tags_code

from tidemq.broker.store.consume_queue import ConsumeQueue
from tidemq.broker.store.index import IndexService
from tidemq.broker.store.mapped_file import MappedFile

log = logging.getLogger(__name__)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
DEFAULT_DELAY_LEVELS_MS = (
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000,
    480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)
ScheduleTagsCode = Callable[[int, int, dict[str, str]], int]
# Topics whose units carry a delivery time as tags code (set by the delay / timer services), which
# replay cannot recompute from TAGS: a unit pointing at the right record with the right size is whole.
_OWN_CODES = frozenset({SCHEDULE_TOPIC, "rmq_sys_wheel_timer"})


def default_schedule_tags_code(queue_id: int, store_timestamp: int, properties: dict[str, str]) -> int:
    """Delivery time of a scheduled message: store time + delay of its level (DELAY property,
    else queueId + 1), clamped to RocketMQ's default 18 levels."""
    try:
        level = int(properties.get(Prop.DELAY, queue_id + 1))
    except ValueError:
        level = queue_id + 1
    level = min(max(level, 1), len(DEFAULT_DELAY_LEVELS_MS))
    return store_timestamp + DEFAULT_DELAY_LEVELS_MS[level - 1]


class Replayer:
    def __init__(self, queue_for: Callable[[str, int], ConsumeQueue], index: IndexService,
                 cq_from: int, index_from: int, schedule_tags_code: ScheduleTagsCode,
                 store_root: object = "the store", deleted: dict[str, int] | None = None,
                 claim_at: Callable[[int], tuple[str, int, int, int] | None] | None = None) -> None:
        self.queue_for = queue_for
        # (topic, queue id, queue offset, size) of the valid record at a commitlog offset, or None.
        self.claim_at = claim_at
        self.store_root = store_root
        self.deleted = deleted or {}  # topic -> commitlog offset of its deletion
        self.index = index
        self.cq_from = cq_from
        self.index_from = index_from
        self.schedule_tags_code = schedule_tags_code
        self.units_written = 0
        self.units_replaced = 0
        self.indexed = 0
        self.dropped_files: list[MappedFile] = []

    def __call__(self, phys: int, h: RecordHeader) -> None:
        if phys < self.deleted.get(h.topic, -1):
            return  # written before its topic was deleted: never comes back
        tx = h.sys_flag & TRANSACTION_MASK
        half = tx == SysFlag.TRANSACTION_PREPARED or tx == SysFlag.TRANSACTION_ROLLBACK
        want_cq = phys >= self.cq_from and not half
        want_index = phys >= self.index_from and tx != SysFlag.TRANSACTION_ROLLBACK
        if not (want_cq or want_index):
            return
        props = decode_properties(h.properties)
        if want_cq:
            self._to_queue(phys, h, props)
        if want_index:
            self.index.add(h.topic, props.get(Prop.KEYS), props.get(Prop.UNIQ_KEY), phys, h.store_timestamp)
            self.indexed += 1

    def _to_queue(self, phys: int, h: RecordHeader, props: dict[str, str]) -> None:
        cq = self.queue_for(h.topic, h.queue_id)
        q = h.queue_offset
        if q < 0:
            log.warning("record at %d has negative queue offset %d; not dispatched", phys, q)
            return
        if h.topic == SCHEDULE_TOPIC:
            code = self.schedule_tags_code(h.queue_id, h.store_timestamp, props)
        else:
            code = tags_code(props.get(Prop.TAGS))
        if q < cq.max_offset:
            u = cq.unit(q)
            if (u is not None and u[0] == phys and u[1] == h.total_size
                    and (u[2] == code or h.topic in _OWN_CODES)):  # their codes are times, set elsewhere
                return
            if q < cq.min_offset:
                return  # before the queue's known start: nothing to repair
            if u is not None and (u[0] == phys or (u[1] <= 0 and self.claim_at is None)):
                # A torn unit: it straddles a page boundary (20-byte units, 4 KiB pages) and only
                # one of its pages reached the disk, or it was never completed. The record is
                # here and claims the offset: write the unit whole.
                log.warning("consume queue %s/%d: unit %d was torn %s; rewritten from the record at %d",
                            h.topic, h.queue_id, q, u, phys)
                cq.put(q, phys, h.total_size, code)
                self.units_replaced += 1
                return
            claim = self.claim_at(u[0]) if self.claim_at is not None and u is not None else ()
            if claim is None or (claim and claim[:3] != (h.topic, h.queue_id, q)):
                # The unit points at no record claiming this queue offset: it is a unit the
                # checkpoint never vouched for (this walk is past cq_from), left by a put that a
                # crash or power cut lost, whose queue offset a later put reused. The CommitLog
                # is the truth: point the unit at the record that carries the offset.
                log.warning("consume queue %s/%d: unit %d pointed to commitlog offset %d, which holds no "
                            "record with that queue offset; re-pointed to the record at %d",
                            h.topic, h.queue_id, q, u[0], phys)
                cq.put(q, phys, h.total_size, code)
                self.units_replaced += 1
                return
            # Two valid records claim this queue offset (or one of them is damaged, and the
            # record's header, not covered by the body CRC, is the likelier one). Never guess.
            raise StoreCorruptError(
                f"commitlog record at offset {phys} says it is {h.topic}/{h.queue_id} queue offset {q}, "
                f"but that consume queue unit points elsewhere: the commitlog or consume queue under "
                f"{self.store_root} is damaged; restore it from a backup or replica"
            )
        if q > cq.max_offset and cq.max_offset > cq.min_offset:
            raise StoreCorruptError(
                f"commitlog record at offset {phys} says it is {h.topic}/{h.queue_id} queue offset {q}, "
                f"but that queue ends at {cq.max_offset}: the commitlog under {self.store_root} is "
                f"damaged; restore it from a backup or replica"
            )
        cq.put(q, phys, h.total_size, code)
        self.units_written += 1
