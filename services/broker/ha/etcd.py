"""The etcd v3 backend of the coordination store, through etcd's JSON gateway over aiohttp.

Why the gateway and not a client library: the maintained-looking Python clients all speak gRPC, so
they bring grpcio and protobuf into the broker for six calls. etcd3 (python-etcd3) had its last
release, 0.12.0, in 2020, is synchronous and ships generated protobuf modules that newer protobuf
runtimes refuse; aetcd (asyncio, 1.0 in 2026) and etcd3-async-client (grpc.aio, 0.3) are async but
young and still pull grpcio + protobuf, whose versions then pin against every other user of them in
the process. etcd serves the same API as JSON over HTTP (its grpc-gateway), which aiohttp, already
a dependency, speaks; the surface used here is small: ``kv/range``, ``kv/txn`` (a put guarded by a
``mod_revision`` compare), ``lease/grant|keepalive|revoke`` and the streaming ``watch``. Int64s are
JSON strings and keys/values base64, as the gateway's proto3 JSON mapping has it.

The prefix is ``/v3``: etcd 3.4 (Debian bookworm's etcd-server) serves both ``/v3`` and the
deprecated ``/v3beta``; 3.5 and later serve only ``/v3``.

Invariants: every request has a deadline (``EtcdConfig.timeout`` for the whole request, across
endpoints, each endpoint at most an equal share of what is left), so an unreachable store raises CoordinationError, never
hangs; a refused connection or an unavailable member moves on to the next endpoint, and the store
keeps using the last endpoint that answered. A watch reconnects from the last revision it yielded
when its stream breaks or stays idle past ``watch_idle`` (so it too never waits unbounded).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from tidemq.errors import ConfigError

from .coordination import (
    Change,
    CoordinationError,
    GroupRecord,
    Lease,
    RecordCodecError,
    Versioned,
    decode_record,
    encode_record,
)

log = logging.getLogger(__name__)

SCHEME = "etcd://"
API_PREFIX = "/v3"
# gRPC status codes etcd answers with (in the gateway's {"code": N} error body).
GRPC_NOT_FOUND = 5
GRPC_UNAVAILABLE = 14
# A watch event line holds one small record; a longer line is not ours to buffer.
MAX_WATCH_LINE = 64 * 1024


@dataclass(frozen=True, slots=True)
class EtcdConfig:
    """Where etcd is and how long to wait for it.

    ``timeout``: seconds for one request, failover included; ``watch_idle``: seconds a watch
    stream may stay silent before it is reopened (from the last revision seen).
    """

    endpoints: tuple[tuple[str, int], ...]
    timeout: float = 5.0
    watch_idle: float = 30.0

    @classmethod
    def parse(cls, url: str, timeout: float = 5.0) -> EtcdConfig:
        """``etcd://HOST:PORT[,HOST:PORT...]`` (the ``--coordination`` value)."""
        if not url.startswith(SCHEME):
            raise ConfigError(f"coordination URL {url!r} must look like etcd://HOST:PORT[,HOST:PORT]")
        endpoints = []
        for part in url[len(SCHEME):].split(","):
            host, sep, port = part.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"etcd endpoint {part!r} in {url!r} must be HOST:PORT")
            endpoints.append((host.strip("[]"), int(port)))
        return cls(tuple(endpoints), timeout=timeout)


class EtcdRefusal(CoordinationError):
    """etcd answered with an error (``grpc_code`` is its gRPC status code)."""

    def __init__(self, message: str, grpc_code: int) -> None:
        super().__init__(message)
        self.grpc_code = grpc_code


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _key(key: str) -> str:
    return _b64(key.encode())


def _record(kv: Mapping[str, Any], key: str) -> GroupRecord:
    try:
        return decode_record(base64.b64decode(kv.get("value", "")))
    except (RecordCodecError, ValueError) as exc:
        raise CoordinationError(f"etcd key {key} holds no valid group record ({exc}); delete it "
                                f"with `etcdctl del {key}` so the group can elect again") from None


class EtcdStore:
    """:class:`~tidemq.broker.ha.coordination.CoordinationStore` on etcd v3."""

    def __init__(self, config: EtcdConfig) -> None:
        if not config.endpoints:
            raise ConfigError("etcd needs at least one endpoint (etcd://HOST:PORT)")
        self.config = config
        self._preferred = 0  # index of the endpoint that answered last
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    def _order(self) -> list[int]:
        n = len(self.config.endpoints)
        return [(self._preferred + i) % n for i in range(n)]

    def _url(self, index: int, path: str) -> str:
        host, port = self.config.endpoints[index]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}{API_PREFIX}{path}"

    def _where(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.config.endpoints)

    async def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """One unary call, failing over between endpoints within ``config.timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout
        errors = []
        order = self._order()
        for attempt, index in enumerate(order):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            # Each endpoint left gets an equal share of the time left, so one that accepts the
            # connection and then stays silent cannot use up the time of the next.
            timeout = aiohttp.ClientTimeout(total=remaining / (len(order) - attempt))
            try:
                async with self._http().post(self._url(index, path), data=orjson.dumps(body),
                                             timeout=timeout) as resp:
                    doc = orjson.loads(await resp.read())
            except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
                errors.append(f"{self.config.endpoints[index][0]}:{self.config.endpoints[index][1]}: "
                              f"{exc.__class__.__name__} {exc}".strip())
                continue
            if not isinstance(doc, dict):
                errors.append(f"endpoint {index}: answer is not a JSON object")
                continue
            code = doc.get("code")
            if isinstance(code, int) and code:
                if code == GRPC_UNAVAILABLE:
                    errors.append(f"endpoint {index}: {doc.get('message')}")
                    continue
                raise EtcdRefusal(f"etcd refused {path}: {doc.get('message')} (gRPC code {code}); "
                                  "see etcd's log for the cause", code)
            if index != self._preferred:
                log.info("etcd: using endpoint %s:%d", *self.config.endpoints[index])
                self._preferred = index
            return doc
        raise CoordinationError(
            f"etcd at {self._where()} did not answer {path} within {self.config.timeout:g} s "
            f"({'; '.join(errors) or 'no time left'}): check that etcd runs and that "
            f"--coordination names its client URLs")

    async def get(self, key: str) -> Versioned | None:
        return (await self._range(key))[0]

    async def _range(self, key: str) -> tuple[Versioned | None, int]:
        """The key's record and the store's current revision."""
        doc = await self._post("/kv/range", {"key": _key(key)})
        revision = int(doc["header"]["revision"])
        kvs = doc.get("kvs") or []
        if not kvs:
            return None, revision
        return Versioned(_record(kvs[0], key), int(kvs[0]["mod_revision"])), revision

    async def compare_and_swap(self, key: str, record: GroupRecord, revision: int,
                               lease: Lease | None = None) -> Versioned | None:
        put: dict[str, Any] = {"key": _key(key), "value": _b64(encode_record(record))}
        if lease is not None:
            put["lease"] = lease.id
        try:
            doc = await self._post("/kv/txn", {
                "compare": [{"key": _key(key), "target": "MOD", "result": "EQUAL",
                             "mod_revision": str(revision)}],
                "success": [{"request_put": put}]})
        except EtcdRefusal as exc:
            if exc.grpc_code == GRPC_NOT_FOUND and lease is not None:
                raise CoordinationError(f"lease {lease.id} expired before writing {key}: grant a "
                                        "new lease and read the record again") from None
            raise
        if not doc.get("succeeded"):
            return None
        return Versioned(record, int(doc["header"]["revision"]))

    async def grant(self, ttl: float) -> Lease:
        # etcd counts whole seconds and may raise a TTL to its minimum; keep what it granted.
        doc = await self._post("/lease/grant", {"TTL": str(max(1, round(ttl)))})
        return Lease(id=str(doc["ID"]), ttl=float(doc["TTL"]))

    async def keep_alive(self, lease: Lease) -> bool:
        doc = await self._post("/lease/keepalive", {"ID": lease.id})
        # An expired or unknown lease is answered with no TTL (proto3 omits the zero).
        return int((doc.get("result") or {}).get("TTL", 0)) > 0

    async def revoke(self, lease: Lease) -> None:
        try:
            await self._post("/lease/revoke", {"ID": lease.id})
        except EtcdRefusal as exc:
            if exc.grpc_code != GRPC_NOT_FOUND:
                raise

    async def watch(self, key: str, after: int = 0) -> AsyncIterator[Change]:
        """Yields the key's changes; reopens the stream (on any endpoint) where it left off."""
        if after <= 0:
            # "From now on" as a revision, so that a reopened stream misses nothing either.
            after = (await self._range(key))[1]
        while True:
            got_any = False
            try:
                async for change in self._watch_once(key, after):
                    got_any = True
                    after = change.revision
                    yield change
            except _Compacted:
                # The revisions after `after` are gone: the current state is the next change.
                current, revision = await self._range(key)
                yield Change(current.record if current else None, revision)
                after = revision
                continue
            except (aiohttp.ClientError, TimeoutError, ValueError, CoordinationError) as exc:
                log.info("etcd watch of %s broke after revision %d (%s); reopening", key, after, exc)
                if not got_any:
                    # Not a busy loop against a store that is down: wait a timeout before retrying.
                    await asyncio.sleep(min(1.0, self.config.timeout))

    async def _watch_once(self, key: str, after: int) -> AsyncIterator[Change]:
        """One watch stream; returns when it stays idle past ``watch_idle``."""
        body = {"create_request": {"key": _key(key), "start_revision": str(after + 1)}}
        errors = []
        for index in self._order():
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.config.timeout,
                                            sock_read=None)
            try:
                resp = await asyncio.wait_for(
                    self._http().post(self._url(index, "/watch"), data=orjson.dumps(body),
                                      timeout=timeout), self.config.timeout)
            except (aiohttp.ClientError, TimeoutError) as exc:
                errors.append(f"{exc.__class__.__name__} {exc}")
                continue
            async with resp:
                if resp.status != 200:
                    raise CoordinationError(f"etcd refused the watch of {key} with HTTP "
                                            f"{resp.status}: {(await resp.read())[:200]!r}")
                while True:
                    try:
                        line = await asyncio.wait_for(resp.content.readline(), self.config.watch_idle)
                    except TimeoutError:
                        return
                    if not line:
                        raise CoordinationError(f"etcd closed the watch of {key}")
                    if len(line) > MAX_WATCH_LINE:
                        raise CoordinationError(f"etcd watch line of {len(line)} bytes for {key}")
                    doc = orjson.loads(line)
                    result = doc.get("result") or {}
                    if int(result.get("compact_revision", 0)):
                        raise _Compacted
                    if "error" in doc or result.get("canceled"):
                        raise CoordinationError(f"etcd ended the watch of {key}: "
                                                f"{doc.get('error') or result.get('cancel_reason')}")
                    for event in result.get("events") or []:
                        kv = event["kv"]
                        revision = int(kv["mod_revision"])
                        if event.get("type") == "DELETE":
                            yield Change(None, revision)
                        else:
                            yield Change(_record(kv, key), revision)
        raise CoordinationError(f"etcd at {self._where()} accepted no watch of {key} "
                                f"({'; '.join(errors)}): check that etcd runs")

    async def close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(aiohttp.ClientError):
                await self._session.close()
            self._session = None


class _Compacted(Exception):  # noqa: N818 (a signal inside watch, never seen outside)
    """The watch's start revision was compacted away."""
