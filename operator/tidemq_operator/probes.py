"""The operator's health endpoints: ``/healthz`` (liveness) and ``/readyz`` (readiness).

``/healthz`` answers 200 while the process's event loop serves requests: a standby replica is
alive too (kopf's own liveness endpoint exists only while kopf runs, and only the leader runs it).
``/readyz`` answers 200 while this replica leads (``ready()`` is true) and 503 with the holder's
name otherwise, so ``kubectl get pods`` shows which replica acts and a Service selecting ready
operator pods reaches only the leader.

Invariant: the server runs on the caller's event loop (aiohttp), bounded to these two paths.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web

log = logging.getLogger(__name__)


class HealthServer:
    def __init__(self, host: str, port: int, ready: Callable[[], bool],
                 standby_reason: Callable[[], str] = lambda: "not leading") -> None:
        self.host, self.port = host, port
        self.ready, self.standby_reason = ready, standby_reason
        self._runner: web.AppRunner | None = None

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, _request: web.Request) -> web.Response:
        if self.ready():
            return web.json_response({"status": "leading"})
        return web.json_response({"status": "standby", "reason": self.standby_reason()}, status=503)

    async def start(self) -> None:
        """Listen (OSError when the address is taken)."""
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except OSError:
            await self._runner.cleanup()
            self._runner = None
            raise
        log.info("operator health on http://%s:%d/healthz and /readyz", self.host, self.port)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
