"""Resource limits of a remoting server: idle timeout, per-frame read deadline, connection cap, a
global budget for bytes of incomplete frames, the extFields count, and a rate-limited logger for
hostile-peer events.

Invariants:
- Once the first byte of a frame has arrived, the whole frame must arrive within
  ``frame_read_timeout`` or the connection is aborted (a peer dripping one byte a second is never
  idle, so the idle timeout alone would let it hold a connection and its buffer indefinitely). Time
  between frames is governed by the idle timeout only, and time a connection spends paused by the
  buffer budget (below) does not count against its frame's deadline.
- A connection's incomplete frame bytes up to ``free_buffer_bytes`` are free; bytes beyond that are
  charged to one :class:`BufferBudget` shared by every connection of a server (Kafka's
  ``queued.max.request.bytes``). When the charged total exceeds ``max_buffered_bytes``, the
  connection whose read pushed it over stops being read (the kernel's socket buffer and TCP flow
  control hold the rest) until charged bytes are released. So memory for partial frames stays
  below ``max_buffered_bytes`` plus one read (256 KiB) per paused connection, whatever peers
  announce: a frame's announced length never allocates anything.
- Small requests, which arrive whole in one read, are never charged and never paused.
- A paused connection is not read, so a peer that goes away meanwhile is noticed (and its charge
  given back) only when the idle timeout aborts it; a peer that keeps a paused connection open
  without completing its frame is closed the same way.
- :class:`RateLimitedLog` emits at most ``burst`` lines per ``interval`` and then one summary with
  the number suppressed, so 10,000 bad connections cannot flood the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tidemq.errors import ConfigError

DEFAULT_IDLE_TIMEOUT = 120.0  # RocketMQ NettyServerConfig.serverChannelMaxIdleTimeSeconds
# RocketMQ has no such deadline (Netty's decoder waits as long as bytes trickle in). 30 s lets a
# 16 MiB frame (the frame limit) through at 0.55 MiB/s and a 4 MiB message at 140 KiB/s.
DEFAULT_FRAME_READ_TIMEOUT = 30.0
DEFAULT_MAX_CONNECTIONS = 16_384
DEFAULT_MAX_BUFFERED_BYTES = 256 * 1024 * 1024
DEFAULT_FREE_BUFFER_BYTES = 64 * 1024
DEFAULT_MAX_EXT_FIELDS = 1024


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """``idle_timeout`` s without a byte read or written closes a connection (0 = never; a
    connection whose request is still being answered, e.g. a long poll, is not idle);
    ``frame_read_timeout`` s at most from a frame's first byte to its last (0 = no deadline);
    ``max_connections`` open connections at most, more are closed at once (0 = no cap);
    ``max_buffered_bytes`` for incomplete frames across all connections (0 = no budget);
    ``max_ext_fields`` per request, more are answered SYSTEM_ERROR."""

    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    free_buffer_bytes: int = DEFAULT_FREE_BUFFER_BYTES
    max_ext_fields: int = DEFAULT_MAX_EXT_FIELDS
    frame_read_timeout: float = DEFAULT_FRAME_READ_TIMEOUT

    def __post_init__(self) -> None:
        if self.idle_timeout < 0:
            raise ConfigError(f"idle_timeout must be >= 0 s, got {self.idle_timeout}")
        if self.frame_read_timeout < 0:
            raise ConfigError(f"frame_read_timeout must be >= 0 s, got {self.frame_read_timeout}")
        if self.max_connections < 0 or self.max_buffered_bytes < 0 or self.free_buffer_bytes < 0:
            raise ConfigError("max_connections, max_buffered_bytes and free_buffer_bytes must be >= 0")
        if self.max_ext_fields < 1:
            raise ConfigError(f"max_ext_fields must be >= 1, got {self.max_ext_fields}")


FD_RESERVE = 512  # descriptors kept for store files, the metrics server and outgoing connections


def raise_open_file_limit() -> int | None:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as nginx and the Go runtime do); return
    the soft limit now (-1: unlimited; None: not POSIX). Idempotent: the broker calls it before
    its store maps files, the server again when it fits its connection cap."""
    try:
        import resource  # noqa: PLC0415 (POSIX only)
    except ImportError:  # not POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass  # e.g. above fs.nr_open: keep the soft limit we have
    return -1 if soft == resource.RLIM_INFINITY else soft


def connection_cap(requested: int, reserve: int = FD_RESERVE) -> tuple[int, str]:
    """The connection cap that fits the process's open-file limit, and a line saying so.

    Raises the soft RLIMIT_NOFILE to the hard limit first (as nginx and the Go runtime do), then
    keeps ``reserve`` descriptors for everything but client connections: with more connections
    than the limit allows, accept() fails with EMFILE and the store could not open a new segment.
    ``requested`` 0 means "no cap of our own": the open-file limit still bounds it."""
    soft = raise_open_file_limit()
    if soft is None:
        return requested, f"connection cap {requested or 'none'}"
    if soft == -1:
        return requested, f"connection cap {requested or 'none'} (no open-file limit)"
    room = max(64, soft - reserve)
    if requested and requested <= room:
        return requested, f"connection cap {requested} (open-file limit {soft})"
    asked = f"--max-connections {requested}" if requested else "no connection cap"
    return room, (f"{asked} does not fit the open-file limit {soft} ({reserve} kept for store files); "
                  f"capped at {room} connections. Raise the limit (ulimit -n, LimitNOFILE, the "
                  "container runtime's nofile) to allow more")


class _Pausable(Protocol):
    def _budget_resume(self) -> None: ...


class BufferBudget:
    """Bytes of incomplete frames charged by connections, and the connections waiting for room."""

    def __init__(self, limit: int, free_per_connection: int) -> None:
        self.limit = limit
        self.free = free_per_connection
        self.used = 0
        self.peak = 0
        self.pauses = 0
        self.waiting: set[_Pausable] = set()

    def charge(self, holder: _Pausable, old: int, held: int) -> tuple[int, bool]:
        """``holder`` now holds ``held`` bytes of incomplete frames (it was charged ``old``).
        Returns (its new charge, whether it must stop reading)."""
        new = held - self.free if held > self.free else 0
        if new == old:
            return new, False
        self.used += new - old
        if new > old:
            if self.used > self.peak:
                self.peak = self.used
            if self.limit and self.used > self.limit:
                self.waiting.add(holder)
                self.pauses += 1
                return new, True
            return new, False
        self._wake()
        return new, False

    def release(self, holder: _Pausable, old: int) -> None:
        """``holder`` is gone (or dropped its buffer): give back its charge."""
        self.waiting.discard(holder)
        if old:
            self.used -= old
            self._wake()

    def _wake(self) -> None:
        if not self.waiting or (self.limit and self.used >= self.limit):
            return
        waiting, self.waiting = self.waiting, set()
        for holder in waiting:
            holder._budget_resume()


class RateLimitedLog:
    """At most ``burst`` records per ``interval`` seconds; then one line counting what was dropped."""

    def __init__(self, logger: logging.Logger, burst: int = 20, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.burst = burst
        self.interval = interval
        self.clock = clock
        self._window = -float("inf")
        self._count = 0
        self.suppressed = 0

    def log(self, level: int, msg: str, *args: object) -> None:
        now = self.clock()
        if now - self._window >= self.interval:
            if self.suppressed:
                self.logger.log(level, "%d similar messages suppressed in the last %.0f s",
                                self.suppressed, self.interval)
            self._window, self._count, self.suppressed = now, 0, 0
        if self._count < self.burst:
            self._count += 1
            self.logger.log(level, msg, *args)
        else:
            self.suppressed += 1
