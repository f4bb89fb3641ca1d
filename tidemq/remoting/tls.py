"""TLS for the remoting (and metrics) ports: modes, contexts, certificate reload, a sniffing listener.

Modes follow RocketMQ's ``tls.server.mode``: ``disabled`` (plaintext only), ``permissive`` (one port
serves both: the first byte of a connection decides, ``0x16`` = a TLS handshake record) and
``enforcing`` (TLS only). Unlike RocketMQ, an unknown mode is an error (RocketMQ silently falls back
to permissive) and there is no "test mode" that trusts any certificate.

Invariants:
- every context made here refuses protocol versions below TLS 1.2;
- a client context always verifies the server's certificate chain (system trust store or the given
  CA file); hostname verification is on unless explicitly turned off, and the name checked may be
  overridden (``server_name``) for peers reached by IP address (pods);
- a server certificate is reloaded when its certificate or key file changes (a changed stat
  signature, checked every ``reload_interval`` seconds off the event loop): the pair is loaded into
  a *new* context, and only if that succeeds do new handshakes switch to it (the listener's context
  hands each handshake to the newest one from its SNI callback, which OpenSSL calls for every
  ClientHello, with or without SNI). Connections already open keep their session. A pair that does
  not load (half-written, key and certificate not matching) changes nothing and is retried when
  the files change again;
- the permissive listener never reads a byte off a connection before deciding: it peeks.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from tidemq.errors import ConfigError

log = logging.getLogger(__name__)
P = TypeVar("P", bound=asyncio.Protocol)  # a server's protocol type; its registry holds that type

TLS_HANDSHAKE_RECORD = 0x16


class TlsMode(str, enum.Enum):
    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"

    @classmethod
    def parse(cls, value: "str | TlsMode") -> "TlsMode":
        if isinstance(value, TlsMode):
            return value
        text = str(value).strip().lower()
        for mode in cls:
            if mode.value == text:
                return mode
        raise ConfigError(
            f"TLS mode {value!r} is not one of disabled, permissive, enforcing"
        )


@dataclass(frozen=True, slots=True)
class ServerTlsConfig:
    """TLS of one listening port. ``cert_file``/``key_file``: PEM files (a Kubernetes TLS Secret's
    ``tls.crt``/``tls.key``); ``reload_interval``: seconds between checks for changed files (0 = never);
    ``handshake_timeout``: seconds a new connection may take to send its first byte and finish the
    handshake."""

    mode: TlsMode = TlsMode.DISABLED
    cert_file: str | None = None
    key_file: str | None = None
    reload_interval: float = 10.0
    handshake_timeout: float = 10.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", TlsMode.parse(self.mode))
        if self.mode is not TlsMode.DISABLED and not (self.cert_file and self.key_file):
            raise ConfigError(
                f"TLS mode {self.mode.value} needs a certificate file and a key file (e.g. tls.crt and tls.key)"
            )
        if self.reload_interval < 0:
            raise ConfigError(f"TLS reload_interval must be >= 0 seconds, got {self.reload_interval!r}")
        if not self.handshake_timeout > 0:
            raise ConfigError(f"TLS handshake_timeout must be positive, got {self.handshake_timeout!r}")

    @property
    def enabled(self) -> bool:
        return self.mode is not TlsMode.DISABLED


@dataclass(frozen=True, slots=True)
class ClientTlsConfig:
    """TLS of outgoing connections. ``ca_file``: PEM CA bundle (None = the system trust store);
    ``server_name``: the name the certificate must carry (None = the host of the address dialled)."""

    enabled: bool = False
    ca_file: str | None = None
    server_name: str | None = None
    verify_hostname: bool = True


def _load_pair(ctx: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except FileNotFoundError:
        missing = [p for p in (cert_file, key_file) if not os.path.exists(p)]
        raise ConfigError(f"TLS file not found: {', '.join(missing) or cert_file}") from None
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"cannot load the TLS certificate {cert_file} with key {key_file}: {exc}"
        ) from None


def _signature(paths: tuple[str, ...]) -> tuple[tuple[int, int, int], ...]:
    out = []
    for p in paths:
        try:
            st = os.stat(p)  # follows symlinks: a Kubernetes Secret update swaps a symlink
        except OSError:
            out.append((0, 0, 0))
        else:
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class ServerTls:
    """The server side of one :class:`ServerTlsConfig`. ``context`` goes to the listener; it hands
    every handshake to the newest successfully loaded context (see the module invariants)."""

    def __init__(self, config: ServerTlsConfig) -> None:
        if not config.enabled or config.cert_file is None or config.key_file is None:
            raise ConfigError("ServerTls needs a TLS mode other than disabled")
        self.config = config
        self._paths = (config.cert_file, config.key_file)
        self._sig = _signature(self._paths)
        self._bad_sig: tuple[tuple[int, int, int], ...] | None = None
        self.context = self._new_context()
        self.context.sni_callback = self._pick_context
        self._active = self.context
        self.reloads = 0
        self._task: asyncio.Task[None] | None = None

    def _new_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        _load_pair(ctx, *self._paths)
        return ctx

    def _pick_context(self, ssl_object: ssl.SSLObject, _server_name: str | None, ctx: ssl.SSLContext) -> None:
        active = self._active
        if active is not ctx:
            ssl_object.context = active

    @property
    def mode(self) -> TlsMode:
        return self.config.mode

    def _reload(self, sig: tuple[tuple[int, int, int], ...]) -> bool:
        try:
            ctx = self._new_context()
        except ConfigError as exc:  # logged once per state of the files
            self._bad_sig = sig
            log.warning("TLS certificate files changed but do not load (keeping the current ones): %s", exc)
            return False
        self._active = ctx
        self._sig, self._bad_sig = sig, None
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self._paths[0])
        return True

    def start_watching(self) -> None:
        if self.config.reload_interval > 0 and self._task is None:
            self._task = asyncio.create_task(self._watch(), name="tls-reload")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.config.reload_interval)
            try:
                sig = await asyncio.to_thread(_signature, self._paths)
                if sig != self._sig and sig != self._bad_sig:
                    self._reload(sig)  # on the loop: two small files, read once per change
            except Exception:  # a watcher bug must not end reloading silently
                log.exception("TLS certificate reload check failed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None


def client_context(config: ClientTlsConfig) -> ssl.SSLContext | None:
    """The SSLContext for outgoing connections, or None when TLS is off. Always verifies the chain."""
    if not config.enabled:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if config.ca_file:
        try:
            ctx.load_verify_locations(cafile=config.ca_file)
        except FileNotFoundError:
            raise ConfigError(f"TLS CA file not found: {config.ca_file}") from None
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"cannot load the TLS CA file {config.ca_file}: {exc}") from None
    ctx.check_hostname = config.verify_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class _AfterHandshake(asyncio.Protocol, Generic[P]):
    """Delegates to a protocol and adds it to ``registry`` only once its connection is made.

    asyncio creates a TLS connection's protocol before the handshake and, when the handshake fails,
    never calls its ``connection_made`` nor ``connection_lost``: a protocol registered at creation
    would stay registered forever (and count against a connection limit)."""

    __slots__ = ("inner", "registry")

    def __init__(self, inner: P, registry: set[P]) -> None:
        self.inner = inner
        self.registry = registry

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.registry.add(self.inner)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def register_after_handshake(
    factory: Callable[[], asyncio.Protocol], registry: set[P]
) -> Callable[[], asyncio.Protocol]:
    """Wrap a server's protocol factory (which adds each new protocol to ``registry``) so that a
    protocol joins ``registry`` only after a successful handshake (see :class:`_AfterHandshake`)."""

    def gated() -> asyncio.Protocol:
        proto = factory()
        if proto not in registry:
            return proto
        registry.discard(proto)
        return _AfterHandshake(proto, registry)

    return gated


class SniffingServer:
    """A listener for permissive mode: peeks at each connection's first byte, then serves it with
    TLS (``0x16``) or in plaintext. Quacks like ``asyncio.Server`` where RemotingServer uses it."""

    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol],
        tls: ServerTls,
    ) -> None:
        self._factory = factory
        self._tls = tls
        self.sockets: list[socket.socket] = []
        self._accept_task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, type_, proto, _c, addr = infos[0]
        sock = socket.socket(family, type_, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(1024)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.sockets = [sock]
        self._accept_task = asyncio.create_task(self._accept_loop(sock), name="tls-sniff-accept")

    async def _accept_loop(self, lsock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _addr = await loop.sock_accept(lsock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:  # EMFILE and friends: back off instead of spinning
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            task = asyncio.create_task(self._serve(sock))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        timeout = self._tls.config.handshake_timeout
        try:
            readable: asyncio.Future[None] = loop.create_future()

            def wake() -> None:
                if not readable.done():
                    readable.set_result(None)

            loop.add_reader(sock.fileno(), wake)
            try:
                await asyncio.wait_for(readable, timeout)
            finally:
                loop.remove_reader(sock.fileno())
            first = sock.recv(1, socket.MSG_PEEK)
            if not first:
                sock.close()
                return
            use_tls = first[0] == TLS_HANDSHAKE_RECORD
            await loop.connect_accepted_socket(
                self._factory,
                sock,
                ssl=self._tls.context if use_tls else None,
                ssl_handshake_timeout=timeout if use_tls else None,
            )
        except asyncio.CancelledError:
            sock.close()
            raise
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
            log.debug("connection closed before it was served: %r", exc)
            sock.close()

    def close(self) -> None:
        # The listening socket is closed once the accept task has let go of it (closing it while
        # the loop still watches its descriptor could unregister a reused descriptor later).
        socks = list(self.sockets)
        if self._accept_task is not None and not self._accept_task.done():

            def close_sockets(_task: asyncio.Task[None]) -> None:
                for s in socks:
                    s.close()

            self._accept_task.add_done_callback(close_sockets)
            self._accept_task.cancel()
        else:
            for s in socks:
                s.close()
        for task in list(self._pending):
            task.cancel()

    async def wait_closed(self) -> None:
        tasks = [t for t in (self._accept_task, *self._pending) if t is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._accept_task = None
