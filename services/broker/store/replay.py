"""Recovery's front to the store's dispatcher: which recovered CommitLog records still need
dispatching, and what their units carry (at load).

A record is replayed into consume queues from the checkpoint's logics offset (``cq_from``) and
into the index from its index offset (``index_from``) on; below them the checkpoint vouches for
what was dispatched. Records of a deleted topic written before its deletion are skipped, so a
re-created topic's queue offsets (which restart at 0) never collide with the old ones. The rules
of what enters a queue or the index, and the repair of units, are the dispatcher's
(tidemq.broker.store.dispatch), shared with live puts. SCHEDULE_TOPIC_XXXX units carry the
delivery time as tags code, recomputed here by the ``schedule_tags_code`` hook (default:
RocketMQ's 18 delay levels, from the DELAY property); TIMER_TOPIC units carry their record's
TIMER_OUT_MS.
"""

from __future__ import annotations

from collections.abc import Callable

from tidemq.message import Prop, RecordHeader, decode_properties, tags_code

from tidemq.broker.store.dispatch import SCHEDULE_TOPIC, Dispatcher, Replayed

__all__ = ["DEFAULT_DELAY_LEVELS_MS", "SCHEDULE_TOPIC", "TIMER_OUT_MS", "TIMER_TOPIC", "Replayer",
           "ScheduleTagsCode", "default_schedule_tags_code", "due_tags_code", "timer_tags_code"]

# Delivery-timestamp messages (RocketMQ 5's timer): queue 0 of this topic, the delivery time (ms)
# in this property, also their units' tags code (tidemq.broker.delay writes both).
TIMER_TOPIC = "rmq_sys_wheel_timer"
TIMER_OUT_MS = "TIMER_OUT_MS"

DEFAULT_DELAY_LEVELS_MS = (
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000,
    480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)
ScheduleTagsCode = Callable[[int, int, dict[str, str]], int]


def default_schedule_tags_code(queue_id: int, store_timestamp: int, properties: dict[str, str]) -> int:
    """Delivery time of a scheduled message: store time + delay of its level (DELAY property,
    else queueId + 1), clamped to RocketMQ's default 18 levels."""
    try:
        level = int(properties.get(Prop.DELAY, queue_id + 1))
    except ValueError:
        level = queue_id + 1
    level = min(max(level, 1), len(DEFAULT_DELAY_LEVELS_MS))
    return store_timestamp + DEFAULT_DELAY_LEVELS_MS[level - 1]


def timer_tags_code(store_timestamp: int, properties: dict[str, str]) -> int:
    """Delivery time of a TIMER_TOPIC record: its TIMER_OUT_MS (the store time when missing or
    not a number, as the timer reads it)."""
    try:
        return int(properties.get(TIMER_OUT_MS) or store_timestamp)
    except ValueError:
        return store_timestamp


def due_tags_code(topic: str, queue_id: int, store_timestamp: int, properties: dict[str, str],
                  schedule_tags_code: ScheduleTagsCode) -> int:
    """The tags code of a replayed record's unit: a delivery time for the schedule and timer
    topics (as their puts wrote it), else the hash of its TAGS."""
    if topic == SCHEDULE_TOPIC:
        return schedule_tags_code(queue_id, store_timestamp, properties)
    if topic == TIMER_TOPIC:
        return timer_tags_code(store_timestamp, properties)
    return tags_code(properties.get(Prop.TAGS))


class Replayer:
    """Called with each valid record the recovery walk finds, in CommitLog order."""

    def __init__(self, dispatcher: Dispatcher, cq_from: int, index_from: int,
                 schedule_tags_code: ScheduleTagsCode, deleted: dict[str, int] | None = None) -> None:
        self.dispatcher = dispatcher
        self.deleted = deleted or {}  # topic -> commitlog offset of its deletion
        self.cq_from = cq_from
        self.index_from = index_from
        self.schedule_tags_code = schedule_tags_code

    def __call__(self, phys: int, h: RecordHeader) -> None:
        if phys < self.deleted.get(h.topic, -1):
            return  # written before its topic was deleted: never comes back
        want_cq = phys >= self.cq_from
        want_index = phys >= self.index_from
        if not (want_cq or want_index):
            return
        props = decode_properties(h.properties)
        code = due_tags_code(h.topic, h.queue_id, h.store_timestamp, props, self.schedule_tags_code) if want_cq else 0
        record = Replayed(h.total_size, code, props.get(Prop.KEYS), props.get(Prop.UNIQ_KEY))
        self.dispatcher.replay(h.topic, h.queue_id, h.sys_flag, h.queue_offset, phys, h.store_timestamp,
                               (record,), want_cq, want_index)
