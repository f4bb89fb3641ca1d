"""The HTTP side of every TideMQ process: /metrics (Prometheus), /healthz and /readyz (aiohttp).

Each service keeps its own prometheus_client CollectorRegistry; one endpoint may serve several
(``tidemq local`` runs a name server and a broker in one process).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)


class MetricsServer:
    def __init__(self, registries: Iterable[CollectorRegistry], ready: Callable[[], bool] = lambda: True) -> None:
        self.registries = list(registries)
        self.ready = ready
        self._runner: web.AppRunner | None = None
        self.address: tuple[str, int] | None = None

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = b"".join(generate_latest(r) for r in self.registries)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _request: web.Request) -> web.Response:
        if self.ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def start(self, host: str, port: int) -> tuple[str, int]:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        sock = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
        self.address = (sock[0], sock[1])
        log.info("metrics and health endpoints on http://%s:%d", sock[0], sock[1])
        return self.address

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
