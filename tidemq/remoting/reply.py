"""An answer a handler gives later, delivered the moment it is set (issue 17, hot path).

A handler that cannot answer at once returns an awaitable; the server then answers when it is
done. An ``asyncio.Future`` tells its done-callbacks one loop turn after ``set_result``
(``call_soon``), and a replicated send's answer, set as the last follower's ack is read, waited
that turn before the connection even queued it. :class:`Reply` calls its callbacks inside
``set_result`` (or ``cancel``), and has the parts of a future the server and the dispatch hooks
use (``add_done_callback``, ``done``, ``cancelled``, ``exception``, ``result``); awaiting it
works too (a test, a coroutine caller).

Invariants: set once (a later ``set_result`` or ``cancel`` does nothing); every callback is
called exactly once, in the order added, the late ones at once; a callback that raises is logged
and does not keep the others from running.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Generator
from typing import Any

from tidemq.remoting.command import RemotingCommand

log = logging.getLogger(__name__)


class Reply:
    """A request's answer, set later; see the module docstring."""

    __slots__ = ("_callbacks", "_result", "_state")

    _PENDING, _SET, _CANCELLED = 0, 1, 2

    def __init__(self) -> None:
        self._callbacks: list[Callable[[Reply], None]] = []
        self._result: RemotingCommand | None = None
        self._state = Reply._PENDING

    def done(self) -> bool:
        return self._state != Reply._PENDING

    def cancelled(self) -> bool:
        return self._state == Reply._CANCELLED

    def exception(self) -> BaseException | None:
        if self._state == Reply._CANCELLED:
            raise asyncio.CancelledError()
        return None

    def result(self) -> RemotingCommand | None:
        if self._state == Reply._CANCELLED:
            raise asyncio.CancelledError()
        if self._state == Reply._PENDING:
            raise asyncio.InvalidStateError("the reply is not set yet")
        return self._result

    def add_done_callback(self, callback: Callable[[Reply], None]) -> None:
        """Call ``callback(self)`` once set or cancelled (now, if it is)."""
        if self._state == Reply._PENDING:
            self._callbacks.append(callback)
        else:
            _call(callback, self)

    def set_result(self, response: RemotingCommand | None) -> None:
        """Set the answer and tell every callback now; nothing if already set or cancelled."""
        if self._state == Reply._PENDING:
            self._result = response
            self._settle(Reply._SET)

    def cancel(self) -> bool:
        """Give up on the answer (the connection went away); False if it was set already."""
        if self._state != Reply._PENDING:
            return False
        self._settle(Reply._CANCELLED)
        return True

    def _settle(self, state: int) -> None:
        self._state = state
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _call(callback, self)

    def __await__(self) -> Generator[Any, None, RemotingCommand | None]:
        if self._state == Reply._PENDING:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def wake(_reply: Reply) -> None:
                if not fut.done():  # the awaiting task may have been cancelled
                    fut.set_result(None)

            self.add_done_callback(wake)
            yield from fut.__await__()
        return self.result()


def _call(callback: Callable[[Reply], None], reply: Reply) -> None:
    try:
        callback(reply)
    except Exception:  # as asyncio does with a failing done-callback: log it, go on
        log.exception("a callback of a deferred reply failed")
