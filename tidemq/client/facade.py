"""The machinery of the blocking facades (tidemq.client.sync, tidemq.client.push.blocking and
SyncTransactionProducer): an event loop in a daemon thread and the async client living in it.

Every facade method submits a coroutine to that loop and waits for its result; plain methods of
the async client that touch its state run on the loop too (its state belongs to that thread).
``close()`` closes the client and then stops and joins the loop thread. A facade is safe to call
from any thread except its own loop thread (which would deadlock and is refused).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

from tidemq.errors import ClientError

T = TypeVar("T")
P = ParamSpec("P")
_ids = itertools.count(1)
JOIN_TIMEOUT = 5.0


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed (a dependency on Linux/macOS), else asyncio's.

    The blocking facades spend most of their time in the loop's I/O; uvloop's round trips are
    about 30 % faster (bench/produce_consume.py)."""
    try:
        import uvloop  # noqa: PLC0415 (optional: not on every platform)
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        self.stopped = False
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-{next(_ids)}", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.stopped:
            coro.close()
            raise ClientError("this client is closed; create a new one")
        if threading.current_thread() is self._thread:
            coro.close()
            raise ClientError("blocking client called from its own loop thread (would deadlock)")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(JOIN_TIMEOUT)
        if not self._thread.is_alive():
            self.loop.close()


class SyncFacade:
    """A blocking facade of the async client ``_client`` (anything with ``start``/``close``)."""

    _thread_name = "tidemq-sync"

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lt = LoopThread(self._thread_name)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._lt.run(coro)

    def start(self) -> None:
        self._run(self._client.start())

    def close(self) -> None:
        """Close the client and stop its loop thread. Idempotent."""
        if self._lt.stopped:
            return
        try:
            self._run(self._client.close())
        finally:
            self._lt.stop()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Two overloads, so that a coroutine method's result type is what its twin returns (a union of
# both in one signature leaves the type checker unable to tell T).
@overload
def blocking(method: Callable[Concatenate[Any, P], Coroutine[Any, Any, T]]
             ) -> Callable[Concatenate[SyncFacade, P], T]: ...


@overload
def blocking(method: Callable[Concatenate[Any, P], T]) -> Callable[Concatenate[SyncFacade, P], T]: ...


def blocking(method: Callable[Concatenate[Any, P], Any]) -> Callable[Concatenate[SyncFacade, P], Any]:
    """The blocking twin of the async client's ``method`` (same signature and docstring): it
    runs on the facade's loop and the caller waits for its result."""
    name = method.__name__
    if inspect.iscoroutinefunction(method):
        def call(self: SyncFacade, *args: P.args, **kwargs: P.kwargs) -> Any:
            return self._run(getattr(self._client, name)(*args, **kwargs))
    else:
        def call(self: SyncFacade, *args: P.args, **kwargs: P.kwargs) -> Any:
            return self._run(_on_loop(getattr(self._client, name), *args, **kwargs))
    return functools.wraps(method)(call)


async def _on_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a plain method on the facade's loop (the client's state belongs to that thread)."""
    return fn(*args, **kwargs)
