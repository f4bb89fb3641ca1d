"""Stopping background tasks (used by the store and the broker, which run on one event loop)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel every task given (None is skipped), then wait for each to end. A task's own error
    other than its cancellation propagates."""
    running = [t for t in tasks if t is not None]
    for t in running:
        t.cancel()
    for t in running:
        with contextlib.suppress(asyncio.CancelledError):
            await t
