"""Recovery's front to the store's dispatcher: which recovered CommitLog records still need
dispatching, and what their units carry (at load).

A record is replayed into consume queues from the checkpoint's logics offset (``cq_from``) and
into the index from its index offset (``index_from``) on; below them the checkpoint vouches for
what was dispatched. Records of a deleted topic written before its deletion are skipped, so a
re-created topic's queue offsets (which restart at 0) never collide with the old ones. The rules
of what enters a queue or the index, and the repair of units, are the dispatcher's
(tidemq.broker.store.dispatch), shared with live puts. SCHEDULE_TOPIC_XXXX units carry the
delivery time as tags code, recomputed here by the ``schedule_tags_code`` hook (default:
RocketMQ's 18 delay levels, from the DELAY property).
"""

from __future__ import annotations

from collections.abc import Callable

from tidemq.message import Prop, RecordHeader, decode_properties, tags_code

from tidemq.broker.store.dispatch import SCHEDULE_TOPIC, Dispatcher, Replayed

__all__ = ["DEFAULT_DELAY_LEVELS_MS", "SCHEDULE_TOPIC", "Replayer", "ScheduleTagsCode",
           "default_schedule_tags_code"]

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
        if not want_cq:
            code = 0  # no unit is written
        elif h.topic == SCHEDULE_TOPIC:
            code = self.schedule_tags_code(h.queue_id, h.store_timestamp, props)
        else:
            code = tags_code(props.get(Prop.TAGS))
        record = Replayed(h.total_size, code, props.get(Prop.KEYS), props.get(Prop.UNIQ_KEY))
        self.dispatcher.replay(h.topic, h.queue_id, h.sys_flag, h.queue_offset, phys, h.store_timestamp,
                               (record,), want_cq, want_index)
