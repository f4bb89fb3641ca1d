"""Waiting until something becomes true, for tests that watch real processes and background loops.

`wait_until` (async; the check may be a plain function or a coroutine function) and
`wait_until_sync` (blocking; for tests that are not async, e.g. Spark's) poll a check until it
returns something truthy and return that value. Invariants: the check runs at least once, even
with a zero timeout; on timeout they raise AssertionError naming ``what`` they waited for, how
long, and the check's last value, so a failure says what never happened.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

def _timed_out(what: str, timeout: float, last: object) -> AssertionError:
    return AssertionError(f"timed out after {timeout:g} s waiting for {what} (last value: {last!r:.200})")


async def wait_until(check: Callable[[], T | Awaitable[T]], what: str, *, timeout: float = 10.0,
                     interval: float = 0.05) -> T:
    """Return ``check()``'s first truthy value (awaited if it is awaitable), polling every
    ``interval`` seconds; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout, value)
        await asyncio.sleep(interval)


def wait_until_sync(check: Callable[[], T], what: str, *, timeout: float = 10.0,
                    interval: float = 0.05) -> T:
    """Blocking `wait_until`, for tests that are not async: ``check`` is a plain function."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout, value)
        time.sleep(interval)
