"""A kmock KubernetesEmulator served on 127.0.0.1 from a background thread.

Tests talk to it synchronously (kubernetes client, Helm, kopf in a subprocess) while it runs its
own event loop. ``build`` makes the emulator on that loop. Every test package builds on
:func:`status_emulator` (errors answered with their status code, as the API server does) and
adapts kmock 0.8 further in its own way, documented where its subclass is defined.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable

# The Status reason the API server gives with each code (metav1.StatusReason).
_REASONS = {404: "NotFound", 409: "AlreadyExists"}


@functools.cache
def status_emulator() -> type:
    """kmock 0.8's KubernetesEmulator answering its errors as the API server does.

    kmock raises its KubernetesError (404 Object Not Found, 409 Already Exists, ...) from the
    request handler, where nothing renders it: it reached the client as a plain 500 with a
    traceback, so a missing object looked like a server failure. Here it becomes a Status object
    with its own code and reason, and code under test can treat only 404 as "missing".
    (A class made on first use: kmock is optional and imported only by the tests that need it.)
    """
    import aiohttp.web  # noqa: PLC0415
    import kmock  # noqa: PLC0415

    class StatusEmulator(kmock.KubernetesEmulator):
        async def _handle(self, request):
            try:
                return await super()._handle(request)
            except kmock.KubernetesError as exc:
                return aiohttp.web.json_response(
                    {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                     "reason": _REASONS.get(exc.status, "InternalError"), "code": exc.status,
                     "message": exc.message or ""}, status=exc.status)

    return StatusEmulator


class ThreadedEmulator:
    def __init__(self, build: Callable[[], object], name: str = "kmock") -> None:
        self.build = build
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "ThreadedEmulator":
        self._thread.start()
        if not self._ready.wait(20) or self._error:
            raise RuntimeError(f"emulator did not start: {self._error}")
        return self

    def stop(self) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 (reported to start())
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        import kmock  # noqa: PLC0415 (optional: only the tests that need it import it)

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        emu = self.build()
        async with kmock.Server(emu) as server:
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()
