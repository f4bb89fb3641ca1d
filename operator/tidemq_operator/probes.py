"""The operator's health endpoints: ``/healthz`` (liveness), ``/readyz`` (readiness) and
``/leaderz`` (which replica acts).

``/healthz`` answers 200 while the process's event loop serves requests: a standby replica is
alive too (kopf's own liveness endpoint exists only while kopf runs, and only the leader runs it).
``/readyz`` answers 200 on the leader and on a standby that could take over (it reads the Lease),
503 otherwise (starting, or the API server out of reach): every healthy replica is Ready, as
client-go's managers are, so a Deployment rolls with a surge pod and ``kubectl rollout status``
or ``helm --wait`` finish. ``/leaderz`` answers 200 only while this replica leads, 503 naming
the holder on a standby.

Invariant: the server runs on the caller's event loop (aiohttp), bounded to these two paths.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web

log = logging.getLogger(__name__)


class HealthServer:
    def __init__(self, host: str, port: int, leading: Callable[[], bool],
                 standby_reason: Callable[[], str] = lambda: "not leading",
                 standing_by: Callable[[], bool] = lambda: False) -> None:
        self.host, self.port = host, port
        self.leading, self.standby_reason, self.standing_by = leading, standby_reason, standing_by
        self._runner: web.AppRunner | None = None

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, _request: web.Request) -> web.Response:
        if self.leading():
            return web.json_response({"status": "leading"})
        if self.standing_by():
            return web.json_response({"status": "standby", "reason": self.standby_reason()})
        return web.json_response({"status": "not ready", "reason": "the Lease was not read within the renew "
                                  "deadline (API server out of reach?) or the operator is starting"}, status=503)

    async def _leaderz(self, _request: web.Request) -> web.Response:
        if self.leading():
            return web.json_response({"status": "leading"})
        return web.json_response({"status": "standby", "reason": self.standby_reason()}, status=503)

    async def start(self) -> None:
        """Listen (OSError when the address is taken)."""
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/leaderz", self._leaderz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except OSError:
            await self._runner.cleanup()
            self._runner = None
            raise
        log.info("operator health on http://%s:%d/healthz, /readyz and /leaderz", self.host, self.port)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
