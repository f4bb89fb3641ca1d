"""`tidemq operator`'s first contact with Kubernetes, and its log of later connection trouble.

Before kopf starts, :func:`find_api` finds the API server the way the operator's login handler will
(kopf's own login functions: the pod's service account, else the kubeconfig of $KUBECONFIG or
~/.kube/config) and :func:`wait_for_api` checks that it accepts a TCP connection, retrying for a
bounded time. Either failure is one line that names the server and where it came from, instead of
kopf's nine retries and tracebacks. :class:`OneLineConnectionErrors` then folds the tracebacks kopf
and asyncio attach to connection errors (an API server lost while running) into the log line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import click

log = logging.getLogger("tidemq.cli")

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


@dataclasses.dataclass(frozen=True, slots=True)
class KubeApi:
    server: str  # e.g. https://10.96.0.1:443
    source: str  # where it came from, for messages
    proxied: bool = False  # reached through a proxy: a direct TCP probe would not tell

    @property
    def host_port(self) -> tuple[str, int]:
        u = urlsplit(self.server)
        return u.hostname or "", u.port or (443 if u.scheme == "https" else 80)


def find_api() -> KubeApi:
    """The API server kopf will log in to; click.ClickException when there is none."""
    import kopf  # noqa: PLC0415 (optional dependency)

    settings = kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings)
    source = f"the pod's service account ({SERVICE_ACCOUNT_TOKEN})"
    if info is None:
        env = os.environ.get("KUBECONFIG")
        source = f"KUBECONFIG={env}" if env else "~/.kube/config"
        try:
            info = kopf.login_with_kubeconfig(settings=settings)
        except OSError as exc:
            raise click.ClickException(f"cannot read the kubeconfig ({source}): {exc.strerror or exc}: "
                                       f"{exc.filename or ''}".rstrip(": ")) from None
        except Exception as exc:  # noqa: BLE001 (kopf's parser: yaml, missing keys ...)
            raise click.ClickException(f"cannot use the kubeconfig ({source}): {exc}") from None
    if info is None:
        raise click.ClickException(
            "no Kubernetes cluster to talk to: not in a pod (no service account token at "
            f"{SERVICE_ACCOUNT_TOKEN}) and no kubeconfig ($KUBECONFIG unset, ~/.kube/config missing); "
            "point KUBECONFIG at a cluster's kubeconfig, or run the operator in the cluster (the Helm chart)")
    return KubeApi(info.server, source, proxied=bool(info.proxy_url))


async def _tcp_probe(host: str, port: int, timeout: float) -> None:
    _r, w = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    w.close()


async def wait_for_api(api: KubeApi, wait: float,
                       probe: Callable[[str, int, float], Awaitable[None]] = _tcp_probe,
                       clock: Callable[[], float] = time.monotonic) -> int:
    """Return once the API server accepts a connection (the attempts it took); after ``wait``
    seconds of refusals, click.ClickException naming the server, its source and the last reason.
    Each failed attempt is one warning line. ``probe`` and ``clock`` are test seams."""
    if api.proxied:
        log.info("Kubernetes API %s (%s) is reached through a proxy: not probed", api.server, api.source)
        return 0
    host, port = api.host_port
    deadline = clock() + wait
    attempt, backoff = 0, 0.5
    while True:
        attempt += 1
        try:
            await probe(host, port, min(5.0, max(0.5, wait)))
        except (OSError, asyncio.TimeoutError) as exc:
            reason = _reason(exc) or "timed out"
            left = deadline - clock()
            if left <= 0:
                raise click.ClickException(
                    f"cannot reach the Kubernetes API at {api.server} (from {api.source}) after {attempt} "
                    f"attempt(s) in {wait:g} s: {reason}; check that the cluster runs (kubectl cluster-info "
                    "with the same kubeconfig), or wait longer with --api-wait") from None
            pause = min(backoff, left)
            log.warning("Kubernetes API %s (from %s) not reachable: %s; attempt %d, retrying in %.1f s "
                        "(for %.0f s more: --api-wait)", api.server, api.source, reason, attempt, pause, left)
            await asyncio.sleep(pause)
            backoff = min(backoff * 2, 8.0)
            continue
        if attempt > 1:
            log.info("Kubernetes API %s answers (attempt %d)", api.server, attempt)
        return attempt


def _reason(exc: BaseException) -> str:
    """The words of a connection error, without the exception's repr."""
    if isinstance(exc, OSError) and exc.strerror and not type(exc).__module__.startswith("aiohttp"):
        return exc.strerror
    return str(exc) or type(exc).__name__


def connection_error(exc: BaseException | None) -> BaseException | None:
    """``exc`` or the first of its causes that is a connection failure (OSError, timeout, kopf's
    LoginError), else None."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, (OSError, asyncio.TimeoutError)) or type(exc).__name__ == "LoginError":
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


_CONNECTION_KEY = re.compile(r"ConnectionKey\([^)]*\), ")


class OneLineConnectionErrors(logging.Filter):
    """On a handler: records of kopf and asyncio whose exception is a connection failure lose the
    traceback and gain the reason at the end of their line; kopf's request retries lose aiohttp's
    ConnectionKey(...) noise. Every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(("kopf", "asyncio")):
            return True
        if record.exc_info and record.exc_info[1] is not None:
            err = connection_error(record.exc_info[1])
            if err is None:
                return True
            if record.name == "asyncio" and str(record.msg).startswith("Task exception was never retrieved"):
                return False  # a task kopf abandoned on the way out: its error was logged already
            message, reason = record.getMessage(), _reason(err)
            record.msg = message if reason in message else f"{message} ({reason})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        if isinstance(record.msg, str) and "ConnectionKey(" in record.msg:
            record.msg = _CONNECTION_KEY.sub("", record.msg)
        return True


def install_log_filter() -> None:
    for handler in logging.getLogger().handlers:
        handler.addFilter(OneLineConnectionErrors())
