"""Client-made identifiers: the message UNIQ_KEY and the client id sent in heartbeats.

A UNIQ_KEY is 32 upper-case hex characters (see :func:`tidemq.message.make_uniq_id`): host IPv4,
pid, 4 random bytes chosen per generator, milliseconds since the start of the current month and a
16-bit counter. Uniqueness within one generator holds while fewer than 65 536 ids are made in one
millisecond; across generators the random bytes separate them. Time comes from an injected clock.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable

from tidemq.message import make_uniq_id


def month_start_ms(now_ms: int) -> tuple[int, int]:
    """(start of the month containing ``now_ms``, start of the next month), local time, in ms."""
    now = datetime.datetime.fromtimestamp(now_ms / 1000).astimezone()
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    nxt = (start.replace(year=start.year + 1, month=1) if start.month == 12
           else start.replace(month=start.month + 1))
    return int(start.timestamp() * 1000), int(nxt.timestamp() * 1000)


class UniqIdGenerator:
    """Makes UNIQ_KEY values. ``clock`` returns seconds since the epoch (like time.time)."""

    def __init__(self, ip: bytes, clock: Callable[[], float], pid: int | None = None,
                 start: bytes | None = None) -> None:
        self._ip = ip
        self._pid = os.getpid() if pid is None else pid
        self._start = os.urandom(4) if start is None else start
        self._clock = clock
        self._counter = 0
        self._month = (0, 0)
        # The first 10 bytes (ip, pid, start) never change: their hex is computed once (hot path).
        self._prefix = make_uniq_id(ip, self._pid, self._start, 0, 0)[:20]
        # ... and the time's hex once per millisecond (sends in flight share one: bench/compare.py row 2)
        self._ms = -1
        self._head = ""

    def next_id(self) -> str:
        now_ms = int(self._clock() * 1000)
        if now_ms != self._ms:
            begin, end = self._month
            if not begin <= now_ms < end:
                self._month = begin, end = month_start_ms(now_ms)
            self._ms = now_ms
            self._head = f"{self._prefix}{(now_ms - begin) & 0xFFFFFFFF:08X}"
        self._counter = counter = (self._counter + 1) & 0xFFFF
        # == make_uniq_id(ip, pid, start, now_ms - month start, counter), without re-encoding the prefix
        return f"{self._head}{counter:04X}"


def make_client_id(ip: str, instance_name: str, pid: int | None = None,
                   nonce: int | None = None) -> str:
    """``ip@instance`` as RocketMQ clients build it; "DEFAULT" becomes ``pid#nonce``."""
    if instance_name == "DEFAULT":
        pid = os.getpid() if pid is None else pid
        nonce = int.from_bytes(os.urandom(6), "big") if nonce is None else nonce
        instance_name = f"{pid}#{nonce}"
    return f"{ip}@{instance_name}"
