"""A kmock KubernetesEmulator served on 127.0.0.1 from a background thread.

Tests talk to it synchronously (kubernetes client, Helm, kopf in a subprocess) while it runs its
own event loop. ``build`` makes the emulator on that loop (each test package adapts kmock 0.8 in
its own way, documented where the subclass is defined).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


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
