"""Client configuration and per-process client caches for the Spark source and sink.

Spark runs ``read``/``write`` in Python worker processes that it reuses between tasks
(``spark.python.worker.reuse``), so executors keep one client per configuration for the life of
the worker instead of connecting per task (a blocking client for writes, a
:class:`~tidemq.spark.pulling.ReaderLoop` per reading thread for reads); :func:`close_all` runs
at interpreter exit.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from tidemq.client.config import ClientConfig
from tidemq.spark.options import Credentials

log = logging.getLogger(__name__)

T = TypeVar("T")
_cache: dict[tuple, object] = {}
_lock = threading.Lock()


def client_config(name_servers: tuple[str, ...], credentials: Credentials,
                  request_timeout_ms: int = 10_000) -> ClientConfig:
    """The client configuration a Spark reader or writer uses."""
    return ClientConfig(name_servers=name_servers, instance_name="tidemq-spark",
                        request_timeout=request_timeout_ms / 1000.0,
                        access_key=credentials.access_key, secret_key=credentials.secret_key)


def cached(key: tuple, make: Callable[[], T]) -> T:
    """The process-wide client for ``key``, made (and started) by ``make`` on first use."""
    with _lock:
        client = _cache.get(key)
        if client is None:
            client = make()
            _cache[key] = client
        return client  # type: ignore[return-value]


def drop(key: tuple) -> None:
    """Close and forget the cached client for ``key`` (after a connection-level failure)."""
    with _lock:
        client = _cache.pop(key, None)
    if client is not None:
        _close(client)


def _close(client: object) -> None:
    try:
        client.close()  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 (closing at exit must not raise; said once)
        log.warning("closing a cached TideMQ client failed: %s", exc)


@atexit.register
def close_all() -> None:
    with _lock:
        clients = list(_cache.values())
        _cache.clear()
    for client in clients:
        _close(client)
