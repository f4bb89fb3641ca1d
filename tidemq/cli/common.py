"""Shared CLI plumbing: logging, running a service until a signal, errors as sentences."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import click

from tidemq.errors import TideMQError

if TYPE_CHECKING:
    from tidemq.client.config import ClientConfig

T = TypeVar("T")

log = logging.getLogger("tidemq.cli")


# Control characters (and Unicode line breaks) a message may carry from a client-supplied name.
_CONTROL = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match) -> str:
    # No codec lookup ("unicode_escape"): records logged while the interpreter shuts down (an
    # asyncio "Task exception was never retrieved") must still format.
    c = m.group()
    return _ESCAPES.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


class OneLineFormatter(logging.Formatter):
    """Each record's message is one line: control characters are escaped (``\\n``), so a name
    a client sends cannot forge a log line. Tracebacks keep their lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        if _CONTROL.search(record.message):
            record.message = _CONTROL.sub(_escape, record.message)
        return super().formatMessage(record)


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)-5s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def run_async(coro_fn: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on uvloop when available, else the default loop."""
    try:
        import uvloop  # noqa: PLC0415 (optional: not on Windows)
    except ImportError:
        return asyncio.run(coro_fn())  # type: ignore[arg-type]
    return uvloop.run(coro_fn())  # type: ignore[arg-type]


async def wait_for_signal() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    await stop.wait()


def parse_listen(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "0.0.0.0", value
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT", param_hint=what)
    return host or "0.0.0.0", int(port)


def _tls_hint(message: str) -> str:
    """How to turn TLS on or off for the tidemq CLI, when ``message`` suspects a mismatch."""
    from tidemq.remoting.transport import TLS_MAYBE_NOT_SERVED, TLS_MAYBE_REQUIRED  # noqa: PLC0415

    tls_on = os.environ.get("TIDEMQ_TLS", "").strip().lower() in ("1", "true", "yes")
    if TLS_MAYBE_REQUIRED in message and not tls_on:
        return " (to use TLS, set TIDEMQ_TLS=1, and TIDEMQ_TLS_CA_FILE=ca.crt when a private CA signed the servers)"
    if TLS_MAYBE_NOT_SERVED in message and tls_on:
        return " (for a plaintext server, unset TIDEMQ_TLS)"
    return ""


def user_errors(fn: Callable[..., T]) -> Callable[..., T]:
    """Turn TideMQ errors into one line on stderr and exit code 1 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> T:
        try:
            return fn(*args, **kwargs)
        except TideMQError as exc:
            raise click.ClickException(str(exc) + _tls_hint(str(exc))) from None
        except OSError as exc:
            raise click.ClickException(f"{exc.strerror or exc}: {getattr(exc, 'filename', '') or ''}".rstrip(": ")) from None

    return wrapper


async def listening(option: str, start: Awaitable[T], address: str | None = None) -> T:
    """Await a server's ``start``; an address it cannot bind becomes one line that names
    ``option``, the flag that sets it (remoting's ListenError, or the OSError of an aiohttp site
    such as /metrics, listening on ``address``)."""
    from tidemq.remoting.transport import ListenError  # noqa: PLC0415

    try:
        return await start
    except ListenError as exc:
        raise click.ClickException(f"cannot listen on {exc.host}:{exc.port} ({option}): {exc.reason}; "
                                   f"{exc.advice(option)}") from None
    except OSError as exc:
        if address is None:
            raise
        host, _, port = address.rpartition(":")
        err = ListenError(host, int(port), exc)
        raise click.ClickException(f"cannot listen on {address} ({option}): {err.reason}; "
                                   f"{err.advice(option)}") from None


def client_config() -> "ClientConfig":
    """The client settings of `tidemq admin|send|consume`: ACL credentials from
    $TIDEMQ_ACCESS_KEY / $TIDEMQ_SECRET_KEY (environment only, so secrets stay out of
    shell history and `ps`); requests are signed when both are set. TLS to name servers and
    brokers with $TIDEMQ_TLS=1 (RocketMQ's tls.enable), verified against $TIDEMQ_TLS_CA_FILE (else
    the system's CAs), $TIDEMQ_TLS_SERVER_NAME naming the certificate when servers are reached by IP."""
    from tidemq.client.config import ClientConfig  # noqa: PLC0415 (CLI start-up stays lazy)
    from tidemq.errors import ConfigError  # noqa: PLC0415

    access, secret = os.environ.get("TIDEMQ_ACCESS_KEY"), os.environ.get("TIDEMQ_SECRET_KEY")
    if bool(access) != bool(secret):
        raise click.UsageError("set both TIDEMQ_ACCESS_KEY and TIDEMQ_SECRET_KEY (ACL), or neither")
    tls = os.environ.get("TIDEMQ_TLS", "").strip().lower()
    if tls not in ("", "0", "1", "true", "false", "yes", "no"):
        raise click.UsageError(f"TIDEMQ_TLS={tls!r}: use 1 (TLS on) or 0")
    ca_file = os.environ.get("TIDEMQ_TLS_CA_FILE") or None
    if ca_file and not os.path.isfile(ca_file):
        raise click.UsageError(f"TIDEMQ_TLS_CA_FILE={ca_file}: no such file")
    try:
        return ClientConfig(access_key=access or None, secret_key=secret or None,
                            tls=tls in ("1", "true", "yes"), tls_ca_file=ca_file,
                            tls_server_name=os.environ.get("TIDEMQ_TLS_SERVER_NAME") or None)
    except ConfigError as exc:
        raise click.UsageError(f"{exc} (set TIDEMQ_TLS=1)") from None
