"""asyncio plumbing for RocketMQ remoting: one protocol class for both ends of a connection.

Invariants: a connection decodes frames in arrival order and hands each request to its handler
synchronously, so requests a peer sends in order are processed in order (a oneway offset commit
that precedes an unregister is applied first). A handler may return a response, ``None`` (no
answer, e.g. oneway) or an awaitable that resolves to one (long polling, SYNC_FLUSH waits); only
those run as tasks. A broken frame closes that one connection and is logged once.

Requests sent with ``invoke`` time out through one timer per connection, armed for the earliest
deadline (re-armed when it fires), not a timer per request. A request sent while no other is in
flight is written at once; others are coalesced into one write per loop iteration.

A server enforces :class:`tidemq.remoting.limits.ServerLimits`: all-idle connections are aborted
after ``idle_timeout``, a connection whose frame has not arrived whole ``frame_read_timeout`` after
its first byte is aborted, connections past ``max_connections`` are closed at once, bytes of
incomplete frames share one budget (a connection over it stops being read), and a request with too
many extFields is answered SYSTEM_ERROR without reaching the handler.

The frame deadline costs no timer per frame: a connection notes when the incomplete frame at the
head of its buffer began (one clock read per read that leaves a frame incomplete, none for frames
that arrive whole), checks it on each read, and one sweep per server catches the peers that went
silent mid-frame.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import itertools
import logging
import os
import ssl
from collections.abc import Awaitable, Callable
from typing import Protocol, cast

from tidemq.errors import ConnectError, FrameError, RemotingError, RemotingTimeoutError
from tidemq.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.frame import DEFAULT_MAX_FRAME, encode_frame_parts, iter_frames
from tidemq.remoting.limits import BufferBudget, RateLimitedLog, ServerLimits, connection_cap
from tidemq.remoting.reply import Reply
from tidemq.remoting.tls import ServerTls, ServerTlsConfig, SniffingServer, TlsMode, register_after_handshake

log = logging.getLogger(__name__)
_bad_peer_log = RateLimitedLog(log)  # frame errors, refusals: hostile peers must not flood the log

HandlerResult = RemotingCommand | Awaitable[RemotingCommand | None] | None


class RequestHandler(Protocol):
    def handle(self, conn: "Connection", cmd: RemotingCommand) -> HandlerResult: ...

    def connection_lost(self, conn: "Connection") -> None: ...


_opaque_counter = itertools.count(1)
# Answers produced while one read is served are coalesced into one write, except that once the
# requests served carried this many body bytes (the work of a send grows with them) the answers
# so far are written at once: a read holding several merged sends (SEND_BATCH_MESSAGEs of 32 x 1 KiB)
# would otherwise answer all of them together and leave the client idle meanwhile, each side then
# waiting for the other (bench/compare.py row 2).
EARLY_FLUSH_BYTES = 16 * 1024
_NEVER = float("inf")

# Said when a peer's behaviour points at a TLS mismatch; the edges (CLI, broker) look for these
# words to add how to turn TLS on or off there.
TLS_MAYBE_REQUIRED = "the server may require TLS (this connection is plaintext)"
TLS_MAYBE_NOT_SERVED = "the server may not serve TLS on this port (this connection uses TLS)"


class ListenError(ConnectError):
    """A server cannot bind its address. ``errno`` tells why (in use, not permitted, not local);
    the message says what to change, and a front-end can name its own option for it."""

    def __init__(self, host: str, port: int, exc: OSError) -> None:
        self.host, self.port, self.errno = host, port, exc.errno
        self.reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))
        super().__init__(f"cannot listen on {host}:{port}: {self.reason}; {self.advice()}")

    def advice(self, option: str | None = None) -> str:
        """What to change, naming ``option`` (the flag that sets this address) when given."""
        where = f" with {option}" if option else ""
        if self.errno == errno.EACCES:
            return f"ports below 1024 need privileges: pick a port above 1023{where}"
        if self.errno == errno.EADDRNOTAVAIL:
            return f"{self.host} is not an address of this machine: listen on one of its addresses or 0.0.0.0{where}"
        return f"another process holds the port: pick a free port{where}"


def next_opaque() -> int:
    return next(_opaque_counter) & 0x7FFFFFFF


class Connection(asyncio.Protocol):
    """One remoting connection. Serves requests (via ``handler``) and matches responses by opaque."""

    def __init__(self, handler: RequestHandler | None, max_frame: int = DEFAULT_MAX_FRAME,
                 budget: BufferBudget | None = None, max_ext_fields: int = 0,
                 frame_read_timeout: float = 0.0) -> None:
        self.handler = handler
        self.max_frame = max_frame
        # Server side (tidemq.remoting.limits): bytes of an incomplete frame beyond a free allowance
        # are charged to the server's budget; a connection over it stops being read for a while.
        self._budget = budget
        self._charged = 0
        self._paused_by_budget = False
        self._paused_by_peer = False
        self.max_ext_fields = max_ext_fields
        # Server side: an incomplete frame must be complete frame_read_timeout s after its first
        # byte arrived (loop time in _partial_since; None while the buffer holds no partial frame).
        self.frame_read_timeout = frame_read_timeout
        self._partial_since: float | None = None
        self._budget_paused_at = 0.0
        self.frame_timed_out = False
        self.activity = 0  # bumped by every read and write; the idle sweep compares snapshots
        self.transport: asyncio.Transport | None = None
        self.peer: str = "?"
        self._loop = asyncio.get_running_loop()
        self.closed = self._loop.create_future()
        self._buf = bytearray()
        # Outgoing frames are coalesced: everything sent while a read is processed, or within one
        # loop iteration, leaves in one writev (bench/produce_consume.py, pipelined sends).
        self._out: list[bytes | memoryview] = []
        self._in_read = False
        self._flush_scheduled = False
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        # Request timeouts: opaque -> (deadline in loop time, timeout, request code), checked by
        # one timer per connection set for the earliest deadline, instead of a timer per request
        # (hot path: bench/produce_consume.py; a timer per request costs a heap push and pop).
        self._deadlines: dict[int, tuple[float, float, int]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = _NEVER
        self._tasks: set[asyncio.Future[RemotingCommand | None] | Reply] = set()
        self.attrs: dict[str, object] = {}
        self._answered = False  # any byte arrived: a close before that may be a TLS mismatch
        self._tls = False

    # asyncio.Protocol -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        self._tls = transport.get_extra_info("ssl_object") is not None

    def data_received(self, data: bytes) -> None:
        self.activity += 1
        self._answered = True
        self._in_read = True
        try:
            self._read(data)
        finally:
            self._in_read = False
            self._flush()

    def _read(self, data: bytes) -> None:
        buf = self._buf
        had = len(buf)
        buf += data
        carried = 0  # request body bytes served since the answers were last written
        try:
            for cmd in iter_frames(buf, self.max_frame):
                if cmd.flag & FLAG_RESPONSE:  # hot path (bench/hot_path.py): no property call
                    fut = self._pending.pop(cmd.opaque, None)
                    if fut is not None and not fut.done():
                        fut.set_result(cmd)
                else:
                    self._dispatch(cmd)
                    body = cmd.body
                    if body is not None:
                        carried += len(body)
                        if carried >= EARLY_FLUSH_BYTES and self._out:
                            # The answers so far leave now, so the peer works on them while the
                            # rest of this read is served (bench/compare.py row 2: 256 in flight).
                            carried = 0
                            self._flush()
        except FrameError as exc:
            _bad_peer_log.log(logging.WARNING, "closing connection from %s: %s", self.peer, exc)
            self._buf = bytearray()
            self.close()
        left = len(self._buf)
        if left:
            if self.frame_read_timeout:
                self._track_partial(had + len(data) - left)
        elif self._partial_since is not None:
            self._partial_since = None
        budget = self._budget
        if budget is not None and (self._charged or len(self._buf) > budget.free):
            self._charged, pause = budget.charge(self, self._charged, len(self._buf))
            if pause and not self._paused_by_budget and self.transport is not None:
                self._paused_by_budget = True
                self._budget_paused_at = self._loop.time()
                if not self._paused_by_peer:
                    self.transport.pause_reading()

    def _track_partial(self, consumed: int) -> None:
        """The buffer ends with an incomplete frame: note when it began, or close the connection
        if it began more than frame_read_timeout s ago. ``consumed``: bytes of whole frames taken
        from the buffer in this read (any means the incomplete frame began in this read)."""
        now = self._loop.time()
        if consumed or self._partial_since is None:
            self._partial_since = now
        else:
            self.check_frame_deadline(now)

    def check_frame_deadline(self, now: float) -> bool:
        """Abort the connection if its incomplete frame began more than frame_read_timeout s
        before ``now`` (loop time), not counting time paused by the server's buffer budget.
        Returns whether it did."""
        since = self._partial_since
        if since is None or self._paused_by_budget or now - since <= self.frame_read_timeout:
            return False
        buf = self._buf
        if len(buf) >= 4:
            whole = str(4 + int.from_bytes(buf[:4], "big", signed=True))
        else:
            whole = "an unknown number of"  # not even the length prefix arrived
        _bad_peer_log.log(
            logging.WARNING, "closing connection from %s: %d of %s bytes of a frame arrived in %.1f s "
            "(frame read timeout %g s)", self.peer, len(buf), whole, now - since, self.frame_read_timeout)
        self.frame_timed_out = True
        self._partial_since = None
        if self.transport is not None:
            self.transport.abort()
        return True

    def _budget_resume(self) -> None:
        """The server's buffer budget has room again (called by BufferBudget)."""
        if self._paused_by_budget:
            self._paused_by_budget = False
            if self._partial_since is not None:  # the frame's deadline stood still while paused
                self._partial_since += self._loop.time() - self._budget_paused_at
            t = self.transport
            if not self._paused_by_peer and t is not None and not t.is_closing():
                t.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._budget is not None:
            charged, self._charged = self._charged, 0
            self._budget.release(self, charged)
        if self._pending and not self._answered and not self._tls:
            # A TLS-only server drops a plaintext client's first frame without a byte in reply.
            err = ConnectError(f"connection to {self.peer} closed before any answer: {TLS_MAYBE_REQUIRED}, "
                               "or it refused the connection")
        else:
            err = ConnectError(f"connection to {self.peer} closed")
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()
        self._deadlines.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in list(self._tasks):
            task.cancel()
        if self.handler is not None:
            try:
                self.handler.connection_lost(self)
            except Exception:  # the handler's bug must not leak into the loop
                log.exception("connection_lost handler failed for %s", self.peer)
        if not self.closed.done():
            self.closed.set_result(None)

    # serving --------------------------------------------------------------------------------
    def _dispatch(self, cmd: RemotingCommand) -> None:
        if self.handler is None:
            return
        if self.max_ext_fields and len(cmd.ext_fields) > self.max_ext_fields:
            _bad_peer_log.log(logging.WARNING, "request code %s from %s has %d extFields (at most %d)",
                              cmd.code, self.peer, len(cmd.ext_fields), self.max_ext_fields)
            if not cmd.is_oneway:
                self.send(cmd.response(ResponseCode.SYSTEM_ERROR,
                                       f"request header has {len(cmd.ext_fields)} extFields, "
                                       f"more than the {self.max_ext_fields} allowed"))
            return
        try:
            result = self.handler.handle(self, cmd)
        except Exception:
            log.exception("request code %s from %s failed", cmd.code, self.peer)
            result = cmd.response(
                ResponseCode.SYSTEM_ERROR, f"internal error handling request code {cmd.code}; see the server log"
            )
        if result is None:
            return
        if isinstance(result, RemotingCommand):  # hot path (bench/hot_path.py): answered now
            if not cmd.flag & FLAG_ONEWAY:
                self.send(result)
            return
        # A Reply (a send waiting for its replicas, its flush) calls back as it is set: no task,
        # no loop turn; anything else awaitable runs as a task.
        task = result if isinstance(result, Reply) else asyncio.ensure_future(result)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._finish, cmd=cmd))

    def _finish(self, task: asyncio.Future[RemotingCommand | None] | Reply, cmd: RemotingCommand) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("request code %s from %s failed: %r", cmd.code, self.peer, exc)
            resp: RemotingCommand | None = cmd.response(
                ResponseCode.SYSTEM_ERROR, f"internal error handling request code {cmd.code}; see the server log"
            )
        else:
            resp = task.result()
        if resp is not None and not cmd.is_oneway:
            self.send(resp)

    # sending --------------------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def send(self, cmd: RemotingCommand) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        self._out.extend(encode_frame_parts(cmd))
        if not self._in_read and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if not out:
            return
        self._out = []
        self.activity += 1
        t = self.transport
        if t is not None and not t.is_closing():
            t.writelines(out)

    async def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        if not self.is_open:
            raise ConnectError(f"connection to {self.peer} is closed")
        loop = self._loop  # hot path: asyncio.get_running_loop() costs a getpid() syscall per call
        cmd.opaque = next_opaque()
        fut: asyncio.Future[RemotingCommand] = loop.create_future()
        pending = self._pending
        alone = not pending
        pending[cmd.opaque] = fut
        if alone and not self._out and not self._in_read:
            # Hot path (bench/produce_consume.py, one in flight): nothing to coalesce with, so
            # write now instead of one loop iteration later. Pipelined requests still coalesce.
            self.transport.writelines(encode_frame_parts(cmd))  # type: ignore[union-attr]
        else:
            self.send(cmd)
        opaque = cmd.opaque
        deadline = loop.time() + timeout
        self._deadlines[opaque] = (deadline, timeout, cmd.code)
        if deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(deadline, self._expire_due)
            self._timer_at = deadline
        try:
            return await fut
        finally:
            pending.pop(opaque, None)
            self._deadlines.pop(opaque, None)

    def _expire_due(self) -> None:
        """Fail every request past its deadline; re-arm the timer for the earliest one left."""
        self._timer = None
        self._timer_at = _NEVER
        # Timers may fire up to the clock resolution early; 1 ms of slack avoids re-arming for
        # a deadline that is due now.
        due = self._loop.time() + 0.001
        earliest = _NEVER
        for opaque, (deadline, timeout, code) in list(self._deadlines.items()):
            if deadline <= due:
                del self._deadlines[opaque]
                fut = self._pending.get(opaque)
                if fut is not None and not fut.done():
                    fut.set_exception(RemotingTimeoutError(
                        f"no answer from {self.peer} to request code {code} in {timeout:g} s"))
            elif deadline < earliest:
                earliest = deadline
        if earliest < _NEVER:
            self._timer = self._loop.call_at(earliest, self._expire_due)
            self._timer_at = earliest

    def invoke_oneway(self, cmd: RemotingCommand) -> None:
        if not self.is_open:
            raise ConnectError(f"connection to {self.peer} is closed")
        cmd.opaque = next_opaque()
        cmd.flag |= 2
        self.send(cmd)

    def close(self) -> None:
        """Close after writing what was already sent (a oneway commit before close is kept)."""
        if self.transport is not None:
            self._flush()
            self.transport.close()

    # Backpressure: a peer that does not read its responses stops being read from.
    def pause_writing(self) -> None:
        self._paused_by_peer = True
        if self.transport is not None and not self._paused_by_budget:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused_by_peer = False
        if self.transport is not None and not self.transport.is_closing() and not self._paused_by_budget:
            self.transport.resume_reading()


def parse_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address {addr!r} is not HOST:PORT")
    return host, int(port)


class RemotingServer:
    """Accepts connections and serves them with one handler (TLS per ``tls``: see tidemq.remoting.tls)."""

    def __init__(
        self, handler: RequestHandler, max_frame: int = DEFAULT_MAX_FRAME, tls: ServerTlsConfig | None = None,
        limits: ServerLimits | None = None,
    ) -> None:
        self.handler = handler
        self.max_frame = max_frame
        self.limits = limits if limits is not None else ServerLimits()
        self.budget = (BufferBudget(self.limits.max_buffered_bytes, self.limits.free_buffer_bytes)
                       if self.limits.max_buffered_bytes else None)
        self.max_connections = self.limits.max_connections  # fitted to the open-file limit at start
        self.refused = 0  # connections closed at once because max_connections were open
        self.idle_closed = 0
        self.slow_frames_closed = 0  # connections aborted by the frame read deadline
        self._sweeper: asyncio.Task[None] | None = None
        self._frame_sweeper: asyncio.Task[None] | None = None
        self.tls: ServerTls | None = ServerTls(tls) if tls is not None and tls.enabled else None
        self._server: asyncio.base_events.Server | SniffingServer | None = None
        self.connections: set[Connection] = set()

    async def start(self, host: str, port: int) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        cap, said = connection_cap(self.limits.max_connections)
        self.max_connections = cap
        (log.warning if cap != self.limits.max_connections else log.info)("%s:%d: %s", host, port, said)

        def factory() -> asyncio.Protocol:
            if cap and len(self.connections) >= cap:
                self.refused += 1
                return _Refused(cap)
            conn = Connection(self.handler, self.max_frame, self.budget, self.limits.max_ext_fields,
                              self.limits.frame_read_timeout)
            self.connections.add(conn)
            conn.closed.add_done_callback(lambda _f: self._forget(conn))
            return conn

        try:
            if self.tls is None:
                self._server = await loop.create_server(factory, host, port, reuse_address=True)
            elif self.tls.mode is TlsMode.ENFORCING:
                self._server = await loop.create_server(
                    register_after_handshake(factory, self.connections), host, port, reuse_address=True,
                    ssl=self.tls.context, ssl_handshake_timeout=self.tls.config.handshake_timeout)
            else:
                self._server = SniffingServer(register_after_handshake(factory, self.connections), self.tls)
                await self._server.start(host, port)
        except OSError as exc:
            raise ListenError(host, port, exc) from None
        if self.tls is not None:
            self.tls.start_watching()
        if self.limits.idle_timeout:
            self._sweeper = loop.create_task(self._close_idle(self.limits.idle_timeout), name="remoting-idle")
        if self.limits.frame_read_timeout:
            self._frame_sweeper = loop.create_task(
                self._close_slow_frames(self.limits.frame_read_timeout), name="remoting-frame-deadline")
        sock = self._server.sockets[0].getsockname()
        return sock[0], sock[1]

    def _forget(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if conn.frame_timed_out:
            self.slow_frames_closed += 1

    async def _close_slow_frames(self, timeout: float) -> None:
        """Every timeout/4 s: abort connections whose incomplete frame began more than ``timeout``
        s ago. Reads check the deadline themselves; this catches peers that went silent mid-frame
        (closed 1-1.25 timeouts after the frame's first byte)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.05, timeout / 4))
            now = loop.time()
            for conn in list(self.connections):
                if conn._partial_since is not None:
                    conn.check_frame_deadline(now)

    async def _close_idle(self, timeout: float) -> None:
        """Every timeout/4 s: abort connections with no read or write for ``timeout`` s and no request
        being answered (RocketMQ closes all-idle channels after serverChannelMaxIdleTimeSeconds)."""
        loop = asyncio.get_running_loop()
        seen: dict[Connection, tuple[int, float]] = {}
        while True:
            await asyncio.sleep(max(0.05, timeout / 4))
            now = loop.time()
            current: dict[Connection, tuple[int, float]] = {}
            for conn in self.connections:
                last = seen.get(conn)
                if last is None or last[0] != conn.activity or conn._tasks:
                    current[conn] = (conn.activity, now)
                elif now - last[1] >= timeout and conn.transport is not None:
                    self.idle_closed += 1
                    log.debug("closing connection from %s: idle for %.1f s", conn.peer, now - last[1])
                    conn.transport.abort()
                else:
                    current[conn] = last
            seen = current

    async def stop(self) -> None:
        for task in (self._sweeper, self._frame_sweeper):
            if task is not None:
                task.cancel()
        self._sweeper = self._frame_sweeper = None
        if self.tls is not None:
            await self.tls.stop()
        if self._server is not None:
            self._server.close()
            for conn in list(self.connections):
                conn.close()
            await self._server.wait_closed()
            self._server = None


class _Refused(asyncio.Protocol):
    """A connection beyond the server's max_connections: closed as soon as it is accepted."""

    def __init__(self, cap: int) -> None:
        self.cap = cap

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _bad_peer_log.log(logging.WARNING, "refusing connection from %s: %d connections are open (the maximum)",
                          transport.get_extra_info("peername"), self.cap)
        cast(asyncio.Transport, transport).abort()  # a stream server's protocol gets a Transport


class RemotingClient:
    """A pool of outgoing connections, one per address, reused."""

    def __init__(
        self,
        handler: RequestHandler | None = None,
        connect_timeout: float = 3.0,
        max_frame: int = DEFAULT_MAX_FRAME,
        rpc_hook: Callable[[RemotingCommand], None] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        server_name: str | None = None,
    ) -> None:
        self.handler = handler
        # TLS (tidemq.remoting.tls.client_context): the certificate must name ``server_name``, or
        # the dialled host when None.
        self.ssl_context = ssl_context
        self.server_name = server_name
        self.connect_timeout = connect_timeout
        self.max_frame = max_frame
        self.rpc_hook = rpc_hook  # runs on every request before it is sent (e.g. ACL signing)
        self._conns: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Future[Connection]] = {}

    async def connection(self, addr: str) -> Connection:
        conn = self._conns.get(addr)
        if conn is not None and conn.is_open:
            return conn
        pending = self._connecting.get(addr)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._connecting[addr] = fut
        try:
            conn = await self._open(addr)
            self._conns[addr] = conn
            fut.set_result(conn)
            return conn
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise
        finally:
            self._connecting.pop(addr, None)

    async def _open(self, addr: str) -> Connection:
        try:
            host, port = parse_addr(addr)
        except ValueError as exc:
            raise ConnectError(str(exc)) from None
        loop = asyncio.get_running_loop()
        try:
            _t, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: Connection(self.handler, self.max_frame), host, port, ssl=self.ssl_context,
                    server_hostname=(self.server_name or host) if self.ssl_context is not None else None,
                ),
                self.connect_timeout,
            )
        except ssl.SSLCertVerificationError as exc:
            raise ConnectError(f"TLS certificate of {addr} not accepted: {exc.verify_message or exc}") from None
        except (ssl.SSLError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as exc:
            if self.ssl_context is None:
                raise ConnectError(f"cannot connect to {addr}: {str(exc) or type(exc).__name__}") from None
            # A plaintext server closes on the ClientHello (it reads it as a frame length).
            raise ConnectError(f"TLS handshake with {addr} failed ({str(exc) or 'the server closed the connection'}): "
                               f"{TLS_MAYBE_NOT_SERVED}") from None
        except (OSError, asyncio.TimeoutError) as exc:
            reason = str(exc) or (f"timed out after {self.connect_timeout:g} s"
                                  if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) else type(exc).__name__)
            raise ConnectError(f"cannot connect to {addr}: {reason}") from None
        return conn

    def invoke(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0) -> Awaitable[RemotingCommand]:
        """Send ``cmd`` to ``addr`` and return an awaitable of the answer.

        A plain function (hot path: bench/produce_consume.py): with the connection open it hands
        back the connection's own coroutine, one coroutine frame fewer per request."""
        conn = self._conns.get(addr)
        if conn is not None and conn.is_open:
            if self.rpc_hook is not None:
                self.rpc_hook(cmd)
            return conn.invoke(cmd, timeout)
        return self._connect_and_invoke(addr, cmd, timeout)

    async def _connect_and_invoke(self, addr: str, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        conn = await self.connection(addr)
        if self.rpc_hook is not None:
            self.rpc_hook(cmd)
        return await conn.invoke(cmd, timeout)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        conn = await self.connection(addr)
        if self.rpc_hook is not None:
            self.rpc_hook(cmd)
        conn.invoke_oneway(cmd)

    def close_connection(self, addr: str) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn.close()

    async def close(self) -> None:
        conns = list(self._conns.values())
        self._conns.clear()
        for conn in conns:
            conn.close()
        for conn in conns:
            try:
                await asyncio.wait_for(asyncio.shield(conn.closed), 1.0)
            except (asyncio.TimeoutError, RemotingError):
                pass
