"""The HTTP side of every TideMQ process: /metrics (Prometheus), /healthz and /readyz (aiohttp).

Each service keeps its own prometheus_client CollectorRegistry; one endpoint may serve several
(``tidemq local`` runs a name server and a broker in one process). With ``tls`` (any mode but
disabled) the endpoint serves HTTPS only, with the certificate reloaded in place when its files change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from tidemq.remoting.tls import ServerTls, ServerTlsConfig

log = logging.getLogger(__name__)


class MetricsServer:
    def __init__(
        self,
        registries: Iterable[CollectorRegistry],
        ready: Callable[[], bool] = lambda: True,
        tls: ServerTlsConfig | None = None,
    ) -> None:
        self.registries = list(registries)
        self.ready = ready
        self.tls = ServerTls(tls) if tls is not None and tls.enabled else None
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
        ssl_context = self.tls.context if self.tls is not None else None
        site = web.TCPSite(self._runner, host, port, reuse_address=True, ssl_context=ssl_context)
        await site.start()
        if self.tls is not None:
            self.tls.start_watching()
        sock = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
        self.address = (sock[0], sock[1])
        scheme = "https" if self.tls is not None else "http"
        log.info("metrics and health endpoints on %s://%s:%d", scheme, sock[0], sock[1])
        return self.address

    async def stop(self) -> None:
        if self.tls is not None:
            await self.tls.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
