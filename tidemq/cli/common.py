"""Shared CLI plumbing: logging, running a service until a signal, errors as sentences."""

from __future__ import annotations

import asyncio
import functools
import logging
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


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-5s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def run_async(coro_fn: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on uvloop when available, else the default loop."""
    try:
        import uvloop
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


def user_errors(fn: Callable[..., T]) -> Callable[..., T]:
    """Turn TideMQ errors into one line on stderr and exit code 1 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TideMQError as exc:
            raise click.ClickException(str(exc)) from None
        except OSError as exc:
            raise click.ClickException(f"{exc.strerror or exc}: {getattr(exc, 'filename', '') or ''}".rstrip(": ")) from None

    return wrapper


def client_config() -> "ClientConfig":
    """The client settings of `tidemq admin|send|consume`: ACL credentials from
    $TIDEMQ_ACCESS_KEY / $TIDEMQ_SECRET_KEY (environment only, so secrets stay out of
    shell history and `ps`); requests are signed when both are set."""
    from tidemq.client.config import ClientConfig  # noqa: PLC0415 (CLI start-up stays lazy)

    access, secret = os.environ.get("TIDEMQ_ACCESS_KEY"), os.environ.get("TIDEMQ_SECRET_KEY")
    if bool(access) != bool(secret):
        raise click.UsageError("set both TIDEMQ_ACCESS_KEY and TIDEMQ_SECRET_KEY (ACL), or neither")
    return ClientConfig(access_key=access or None, secret_key=secret or None)
