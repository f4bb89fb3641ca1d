"""Delayed messages, the pure part: delay-level tables, turning a put into a scheduled put, and
turning a scheduled record back into a put for its real topic.

Two kinds of delay exist (RocketMQ 4.x levels and RocketMQ 5.x delivery timestamps):

- ``DELAY=L`` (1..N, larger values clamp to N, <= 0 means none): the message is stored under
  ``SCHEDULE_TOPIC_XXXX`` queue ``L-1`` with ``REAL_TOPIC``/``REAL_QID``; its consume-queue tags code
  is the delivery time, ``storeTimestamp + delay(L)`` in ms (the store's replay recomputes it with
  :meth:`DelayLevels.tags_code`, so both must agree).
- ``TIMER_DELIVER_MS`` / ``__STARTDELIVERTIME`` (absolute ms) or ``TIMER_DELAY_SEC`` /
  ``TIMER_DELAY_MS`` (relative): the message is stored under :data:`TIMER_TOPIC` queue 0 with
  ``REAL_TOPIC``/``REAL_QID`` and ``TIMER_OUT_MS`` = the absolute delivery time (which recovery
  reads back from the record), tags code = delivery time. A delivery time not in the future means
  no delay.

Invariants: a converted put never carries the timer input properties outside TIMER_TOPIC, and a
restored put never carries DELAY or timer input properties, so delivering (or retrying, or
forwarding) a delayed message never delays it again. Nothing here touches files, sockets or clocks
(the current time is an argument).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tidemq.broker.store.replay import SCHEDULE_TOPIC, TIMER_OUT_MS, TIMER_TOPIC  # the store replays their units
from tidemq.broker.store.results import PutRequest, put_again
from tidemq.errors import BrokerError, ConfigError
from tidemq.message import TRANSACTION_MASK, MessageExt, Prop, SysFlag
from tidemq.remoting import ResponseCode

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
MAX_DELAY_LEVELS = 64
MAX_LEVEL_DELAY_MS = 365 * 86_400_000
DEFAULT_MAX_TIMER_DELAY_MS = 3 * 86_400_000  # RocketMQ 5 timerMaxDelaySec: 3 days

TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
START_DELIVER_TIME = "__STARTDELIVERTIME"
TIMER_INPUTS = (TIMER_DELIVER_MS, START_DELIVER_TIME, TIMER_DELAY_SEC, TIMER_DELAY_MS)
_TIMER_INPUT_SET = frozenset(TIMER_INPUTS)
DELAY_PROPERTIES = frozenset({Prop.DELAY, *TIMER_INPUTS})  # a message with none of these is not delayed

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_HALF = (int(SysFlag.TRANSACTION_PREPARED), int(SysFlag.TRANSACTION_ROLLBACK))


@dataclass(frozen=True, slots=True)
class DelayLevels:
    """The delay of each level in ms; level 1 is ``delays_ms[0]``."""

    delays_ms: tuple[int, ...]

    @property
    def max_level(self) -> int:
        return len(self.delays_ms)

    def clamp(self, level: int) -> int:
        return min(max(level, 1), self.max_level)

    def delay_ms(self, level: int) -> int:
        return self.delays_ms[self.clamp(level) - 1]

    def level_of(self, value: str | None) -> int:
        """The level a DELAY property asks for: 0 for none (absent, <= 0 or not a number)."""
        if not value:
            return 0
        try:
            level = int(value.strip())
        except ValueError:
            return 0
        return 0 if level <= 0 else min(level, self.max_level)

    def tags_code(self, queue_id: int, store_timestamp: int, properties: dict[str, str]) -> int:
        """The store's ``schedule_tags_code`` hook: delivery time of a SCHEDULE_TOPIC_XXXX record
        (its level from DELAY, else from the queue id)."""
        level = self.level_of(properties.get(Prop.DELAY)) or queue_id + 1
        return store_timestamp + self.delay_ms(level)


def parse_delay_levels(text: str) -> DelayLevels:
    """Parse RocketMQ's ``messageDelayLevel`` form, e.g. ``"1s 5s 10s 30s 1m ... 2h"``
    (units ms, s, m, h, d). Raises ConfigError with a sentence naming the bad item."""
    items = (text or "").split()
    if not items:
        raise ConfigError("the delay level table is empty; give e.g. \"1s 5s 10s 30s 1m\"")
    if len(items) > MAX_DELAY_LEVELS:
        raise ConfigError(f"the delay level table has {len(items)} levels, at most {MAX_DELAY_LEVELS} allowed")
    out = []
    for i, item in enumerate(items, 1):
        m = _LEVEL.match(item.strip().lower())
        if m is None:
            raise ConfigError(f"delay level {i} ({item!r}) is not a number followed by ms, s, m, h or d")
        ms = round(float(m.group(1)) * _UNITS[m.group(2)])
        if ms <= 0 or ms > MAX_LEVEL_DELAY_MS:
            raise ConfigError(f"delay level {i} ({item!r}) must be more than 0 and at most 365 days")
        out.append(ms)
    return DelayLevels(tuple(out))


def timer_deliver_ms(props: dict[str, str], now_ms: int) -> int | None:
    """The absolute delivery time a message's timer properties ask for, or None without any.
    Raises ValueError for a value that is not a number."""
    for key in (TIMER_DELIVER_MS, START_DELIVER_TIME):
        v = props.get(key)
        if v:
            return int(v.strip())
    v = props.get(TIMER_DELAY_SEC)
    if v:
        return now_ms + int(v.strip()) * 1000
    v = props.get(TIMER_DELAY_MS)
    if v:
        return now_ms + int(v.strip())
    return None


def has_timer(props: dict[str, str]) -> bool:
    return not _TIMER_INPUT_SET.isdisjoint(props)


def wants_delay(props: dict[str, str]) -> bool:
    """Cheap pre-check for the send hot path: may this message be delayed at all?"""
    return not DELAY_PROPERTIES.isdisjoint(props)


def strip_delay(props: dict[str, str]) -> None:
    """Remove every property that would delay a message again."""
    props.pop(Prop.DELAY, None)
    for k in TIMER_INPUTS:
        props.pop(k, None)


def schedule_put(req: PutRequest, levels: DelayLevels, now_ms: int,
                 max_timer_delay_ms: int = DEFAULT_MAX_TIMER_DELAY_MS) -> PutRequest:
    """Return ``req`` redirected to the schedule or timer topic when it asks for a delay (changed
    in place), else ``req`` itself. Raises BrokerError(MESSAGE_ILLEGAL) for a bad timer property.

    Transactional half messages are left alone (their commit is scheduled instead)."""
    props = req.properties
    if req.sys_flag & TRANSACTION_MASK in _HALF:
        return req
    if has_timer(props):
        try:
            due = timer_deliver_ms(props, now_ms)
        except ValueError:
            raise BrokerError("bad timer property", ResponseCode.MESSAGE_ILLEGAL,
                              "a timer property (TIMER_DELIVER_MS, TIMER_DELAY_SEC, ...) is not a number") from None
        strip_delay(props)
        if due is None or due <= now_ms:
            return req
        if due - now_ms > max_timer_delay_ms:
            raise BrokerError("timer too far", ResponseCode.MESSAGE_ILLEGAL,
                              f"the delivery time is {(due - now_ms) // 1000} s away; at most "
                              f"{max_timer_delay_ms // 1000} s are allowed")
        props[TIMER_OUT_MS] = str(due)
        _redirect(req, TIMER_TOPIC, 0, due)
        return req
    level = levels.level_of(props.get(Prop.DELAY))
    if level <= 0:
        return req
    props[Prop.DELAY] = str(level)
    _redirect(req, SCHEDULE_TOPIC, level - 1, now_ms + levels.delay_ms(level))
    return req


def _redirect(req: PutRequest, topic: str, queue_id: int, due_ms: int) -> None:
    props = req.properties
    props[Prop.REAL_TOPIC] = req.topic
    props[Prop.REAL_QID] = str(req.queue_id)
    req.topic = topic
    req.queue_id = queue_id
    req.tags_code = due_ms


def restore_put(msg: MessageExt, store_host: tuple[str, int]) -> PutRequest:
    """The put that delivers a due scheduled record to its real topic and queue. Raises
    ValueError when the record names no usable real topic/queue."""
    props = dict(msg.properties)
    topic = props.get(Prop.REAL_TOPIC) or ""
    if not topic or topic in (SCHEDULE_TOPIC, TIMER_TOPIC):
        raise ValueError(f"the scheduled record names no usable REAL_TOPIC ({topic!r})")
    try:
        queue_id = int(props.get(Prop.REAL_QID) or "")
    except ValueError:
        raise ValueError(f"the scheduled record has no usable REAL_QID ({props.get(Prop.REAL_QID)!r})") from None
    if queue_id < 0:
        raise ValueError(f"the scheduled record has a negative REAL_QID ({queue_id})")
    strip_delay(props)
    return put_again(msg, topic, queue_id, props, store_host,
                     prepared_transaction_offset=msg.prepared_transaction_offset)
