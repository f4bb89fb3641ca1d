"""Long polling: pull requests parked until a matching message arrives or their deadline passes.

A parked pull on (topic, queue) at offset ``o`` wakes as soon as a message with queue offset >= o
and a matching tag code is dispatched (the store calls :meth:`PullHoldService.on_dispatch`
synchronously from put), not at a polling interval.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(slots=True)
class _Waiter:
    offset: int
    tag_codes: frozenset[int] | None
    future: asyncio.Future


class PullHoldService:
    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], list[_Waiter]] = {}

    @property
    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    async def wait(self, topic: str, queue_id: int, offset: int, tag_codes: frozenset[int] | None, timeout: float) -> bool:
        """Return True when woken by a matching message, False at the deadline."""
        loop = asyncio.get_running_loop()
        w = _Waiter(offset, tag_codes, loop.create_future())
        key = (topic, queue_id)
        self._waiters.setdefault(key, []).append(w)
        try:
            return await asyncio.wait_for(w.future, timeout)
        except asyncio.TimeoutError:
            return False
        finally:
            lst = self._waiters.get(key)
            if lst is not None:
                try:
                    lst.remove(w)
                except ValueError:
                    pass
                if not lst:
                    del self._waiters[key]

    def on_dispatch(self, topic: str, queue_id: int, queue_offset: int, tags_code: int) -> None:
        lst = self._waiters.get((topic, queue_id))
        if not lst:
            return
        for w in lst:
            if w.future.done() or queue_offset < w.offset:
                continue
            if w.tag_codes is None or tags_code in w.tag_codes:
                w.future.set_result(True)

    def wake_all(self) -> None:
        for lst in self._waiters.values():
            for w in lst:
                if not w.future.done():
                    w.future.set_result(False)
