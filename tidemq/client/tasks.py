"""Small helpers for the background tasks clients own (STYLE 9: every task is kept and cancelled
on close; a failing round of a periodic job is logged, never fatal)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
K = TypeVar("K")


def keep(tasks: set[asyncio.Task], coro: Awaitable[T]) -> asyncio.Task[T]:
    """Start ``coro`` as a task that stays in ``tasks`` until it ends."""
    task = asyncio.ensure_future(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task


async def cancel_all(tasks: list[asyncio.Task]) -> None:
    """Cancel ``tasks`` and wait until they are done."""
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


async def pop_and_cancel(tasks: dict[K, asyncio.Task], key: K) -> None:
    """Forget the task ``tasks`` holds for ``key`` (if any), cancel it and wait until it is done."""
    task = tasks.pop(key, None)
    if task is not None:
        await cancel_all([task])


async def finish_or_cancel(tasks: Iterable[asyncio.Task], timeout: float) -> int:
    """Wait up to ``timeout`` seconds for ``tasks`` to end, then cancel the others and wait for
    them; returns how many had to be cancelled."""
    pending = set(tasks)
    if not pending:
        return 0
    _done, late = await asyncio.wait(pending, timeout=timeout)
    await cancel_all(list(late))
    return len(late)


async def guarded(coro: Awaitable[object], what: str, group: str) -> None:
    """Run one round of a periodic job, logging (not raising) what goes wrong."""
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s of group %s failed", what, group)


async def every(interval: float, job: Callable[[], Awaitable[object]], what: str, group: str,
                wake: asyncio.Event | None = None) -> None:
    """Run ``job`` every ``interval`` seconds, or as soon as ``wake`` is set, until cancelled;
    each round is :func:`guarded`."""
    while True:
        if wake is None:
            await asyncio.sleep(interval)
        else:
            try:
                await asyncio.wait_for(wake.wait(), interval)
            except asyncio.TimeoutError:
                pass
            wake.clear()
        await guarded(job(), what, group)
