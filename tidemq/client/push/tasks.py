"""Small helpers for the background tasks consumers own (STYLE 9: every task is kept and
cancelled on close; a failing round of a periodic job is logged, never fatal)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

log = logging.getLogger(__name__)


async def cancel_all(tasks: list[asyncio.Task]) -> None:
    """Cancel ``tasks`` and wait until they are done."""
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


async def guarded(coro: Awaitable[object], what: str, group: str) -> None:
    """Run one round of a periodic job, logging (not raising) what goes wrong."""
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s of group %s failed", what, group)
