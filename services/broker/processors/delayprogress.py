"""Remoting adapter of GET_ALL_DELAY_OFFSET (RocketMQ's 45): how far the broker has delivered the
messages it holds for later (delay levels and the timer).

RocketMQ answers the content of its delayOffset.json, ``{"offsetTable": {level: next offset}}``;
this broker adds ``"timerOffset"``, the lowest offset of its timer queue (``rmq_sys_wheel_timer``
queue 0) not delivered yet. A level's queue (``SCHEDULE_TOPIC_XXXX`` queue ``level - 1``) still
holds undelivered messages while its max offset is above the level's offset; the operator's
scale-in waits for them before it deletes a broker group (tidemq.operator.scalein).
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from tidemq.broker.processors.common import Handler
from tidemq.remoting import Connection, RemotingCommand, RequestCode

# ((level, next offset to deliver) per level, the timer's lowest undelivered offset)
Progress = Callable[[], tuple[tuple[tuple[int, int], ...], int]]


class DelayProgressProcessor:
    def __init__(self, progress: Progress) -> None:
        self._progress = progress  # ScheduleMessageService.progress: read at each request

    def handlers(self) -> dict[int, Handler]:
        return {RequestCode.GET_ALL_DELAY_OFFSET: self.all_delay_offsets}

    def all_delay_offsets(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        levels, timer = self._progress()
        body = {"offsetTable": {str(level): offset for level, offset in levels}, "timerOffset": timer}
        return cmd.response(body=orjson.dumps(body))
