"""The Kubernetes backend of the coordination store: one ``coordination.k8s.io/v1`` Lease per group.

The group record lives in the Lease's annotation ``tidemq.io/group-record`` (its key in
``tidemq.io/key``); the revision is ``metadata.resourceVersion``, which the API server takes from
etcd's revision, so it is an integer that grows with every write (Kubernetes calls it opaque; every
API server we know of serves etcd's). A compare-and-swap is a JSON merge patch carrying
``metadata.resourceVersion``: the API server applies it only at that version and answers 409
Conflict otherwise; revision 0 is a create (409 when it exists) or, when the Lease exists but holds
no live record, a patch at the version just read.

A lease is the Lease object's own fields: ``holderIdentity`` (the lease id), ``leaseDurationSeconds``
and ``renewTime``. Kubernetes deletes nothing when a Lease runs out; a record written under a lease
reads as absent once ``renewTime + leaseDurationSeconds`` has passed by the injected wall clock
(clocks of the hosts must agree to well under a lease; client-go's leader election assumes the
same) or once it was revoked (holder cleared). As in etcd, the lease is liveness and not fencing.
A watch yields a Change for every write of the Lease; an expiry writes nothing, so a watcher learns
of one by reading the record when the lease's time is up, not from the watch.

Why aiohttp and not a client library: the broker image does not carry the operator's ``kubernetes``
package (synchronous, it would need a thread per call and per watch) and kubernetes_asyncio is not
a dependency; four calls on one resource do not need either.

Invariants: every request has ``KubernetesConfig.timeout``; a watch stream silent for
``watch_idle`` is reopened from the last revision seen; a record annotation is size-checked by the
record codec before parsing.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import logging
import re
import ssl
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

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

RECORD_ANNOTATION = "tidemq.io/group-record"
KEY_ANNOTATION = "tidemq.io/key"
API_PATH = "/apis/coordination.k8s.io/v1"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# A bound service-account token is rotated by the kubelet (hourly); read it again this often.
TOKEN_REREAD_SECONDS = 60.0
MAX_NAME = 63
MAX_WATCH_LINE = 64 * 1024


@dataclass(frozen=True, slots=True)
class KubernetesConfig:
    """Where the API server is: ``api_url`` (https://HOST:PORT), the Leases' ``namespace``, a
    bearer-token file and a CA file (both None outside a pod, e.g. against a test server)."""

    api_url: str
    namespace: str
    token_file: Path | None = None
    ca_file: Path | None = None
    timeout: float = 5.0
    watch_idle: float = 30.0

    @classmethod
    def in_cluster(cls, host: str, port: str, root: Path = SERVICE_ACCOUNT,
                   timeout: float = 5.0) -> KubernetesConfig:
        """The pod's own service account; ``host``/``port`` are KUBERNETES_SERVICE_HOST/PORT,
        which the CLI reads (nothing under the core reads the environment)."""
        try:
            namespace = (root / "namespace").read_text().strip()
        except OSError as exc:
            raise CoordinationError(f"--coordination kubernetes needs the pod's service account "
                                    f"at {root} ({exc}): run the broker in a pod with "
                                    "automountServiceAccountToken, or use etcd://") from None
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", namespace, token_file=root / "token",
                   ca_file=root / "ca.crt", timeout=timeout)


def lease_name(key: str) -> str:
    """The Lease's name for a store key: readable, DNS-1123, unique by a hash of the key."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9-]+", "-", key.removesuffix("/group").lower()).strip("-")
    return f"{slug[:MAX_NAME - len(digest) - 1].rstrip('-')}-{digest}"


def _micro_time(seconds: float) -> str:
    """Kubernetes' MicroTime (RFC 3339 with microseconds, UTC)."""
    when = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class KubernetesLeaseStore:
    """:class:`~tidemq.broker.ha.coordination.CoordinationStore` on Kubernetes Leases."""

    def __init__(self, config: KubernetesConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._ssl: ssl.SSLContext | None = None
        self._token: tuple[str, float] | None = None  # (token, when read, by the monotonic clock)
        # Lease id -> the keys this client wrote under it (keep-alive renews each one), and when
        # it runs out by ``clock`` (a lease with no key yet expires too, as etcd's does).
        self._leased: dict[str, set[str]] = {}
        self._deadline: dict[str, float] = {}

    # ---- HTTP ------------------------------------------------------------------------------------
    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            if self.config.ca_file is not None:
                self._ssl = ssl.create_default_context(cafile=str(self.config.ca_file))
            self._session = aiohttp.ClientSession()
        return self._session

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.config.token_file is not None:
            now = time.monotonic()
            if self._token is None or now - self._token[1] > TOKEN_REREAD_SECONDS:
                try:
                    self._token = (self.config.token_file.read_text().strip(), now)
                except OSError as exc:
                    raise CoordinationError(f"cannot read the service-account token "
                                            f"{self.config.token_file}: {exc}") from None
            headers["Authorization"] = f"Bearer {self._token[0]}"
        return headers

    def _url(self, name: str | None = None, query: Mapping[str, str] | None = None) -> str:
        path = f"{API_PATH}/namespaces/{self.config.namespace}/leases"
        if name is not None:
            path += f"/{name}"
        suffix = f"?{urllib.parse.urlencode(query)}" if query else ""
        return f"{self.config.api_url.rstrip('/')}{path}{suffix}"

    async def _request(self, method: str, name: str | None, body: object = None,
                       content_type: str = "application/json") -> tuple[int, dict[str, Any]]:
        """(status, JSON body) of one request within ``config.timeout``; 2xx, 404 and 409 are
        answers, anything else a CoordinationError."""
        headers = self._headers()
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = orjson.dumps(body)
        try:
            async with self._http().request(
                    method, self._url(name), data=data, headers=headers, ssl=self._ssl or True,
                    timeout=aiohttp.ClientTimeout(total=self.config.timeout)) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise CoordinationError(
                f"the Kubernetes API at {self.config.api_url} did not answer {method} Lease "
                f"{name or ''} within {self.config.timeout:g} s ({exc.__class__.__name__} {exc}); "
                "check the API server and the broker's network policy") from None
        try:
            doc = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        if status < 300 or status in (404, 409):
            return status, doc
        hint = (" (grant the broker's service account get/create/patch/watch on "
                "coordination.k8s.io leases)" if status in (401, 403) else "")
        raise CoordinationError(f"the Kubernetes API refused {method} Lease {name or ''} "
                                f"with {status}: {doc.get('message', raw[:200])!r}{hint}")

    # ---- records ---------------------------------------------------------------------------------
    def _live(self, obj: Mapping[str, Any], key: str) -> Versioned | None:
        """The record the Lease object holds, unless absent, expired or revoked."""
        metadata = obj.get("metadata") or {}
        text = (metadata.get("annotations") or {}).get(RECORD_ANNOTATION)
        if not text:
            return None
        spec = obj.get("spec") or {}
        if spec.get("leaseDurationSeconds") is not None:
            if not spec.get("holderIdentity"):
                return None  # revoked
            renewed = _parse_time(spec.get("renewTime"))
            if renewed is None or renewed + float(spec["leaseDurationSeconds"]) < self.clock():
                return None
        try:
            record = decode_record(text.encode())
        except RecordCodecError as exc:
            raise CoordinationError(
                f"Lease {metadata.get('name')} holds no valid group record for {key} ({exc}): "
                f"remove its annotation {RECORD_ANNOTATION} so the group can elect again") from None
        return Versioned(record, int(metadata["resourceVersion"]))

    async def _fetch(self, key: str) -> dict[str, Any] | None:
        status, doc = await self._request("GET", lease_name(key))
        return None if status == 404 else doc

    async def get(self, key: str) -> Versioned | None:
        obj = await self._fetch(key)
        return None if obj is None else self._live(obj, key)

    def _body(self, key: str, record: GroupRecord, lease: Lease | None) -> dict[str, Any]:
        now = _micro_time(self.clock())
        spec: dict[str, Any] = {"holderIdentity": None, "leaseDurationSeconds": None,
                                "renewTime": None, "acquireTime": None}
        if lease is not None:
            spec = {"holderIdentity": lease.id, "leaseDurationSeconds": max(1, round(lease.ttl)),
                    "renewTime": now, "acquireTime": now}
        return {"metadata": {"annotations": {RECORD_ANNOTATION: encode_record(record).decode(),
                                             KEY_ANNOTATION: key}},
                "spec": spec}

    async def compare_and_swap(self, key: str, record: GroupRecord, revision: int,
                               lease: Lease | None = None) -> Versioned | None:
        if lease is not None and self._deadline.get(lease.id, 0.0) < self.clock():
            self._forget(lease)
            raise CoordinationError(f"lease {lease.id} expired, was revoked or was not granted by "
                                    "this store: grant a new lease and read the record again")
        body = self._body(key, record, lease)
        name = lease_name(key)
        if revision == 0:
            obj = await self._fetch(key)
            if obj is None:
                create = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                          "metadata": {"name": name, "namespace": self.config.namespace,
                                       **body["metadata"]},
                          "spec": {k: v for k, v in body["spec"].items() if v is not None}}
                status, doc = await self._request("POST", None, create)
                return self._written(status, doc, key, record, lease)
            if self._live(obj, key) is not None:
                return None
            revision = int(obj["metadata"]["resourceVersion"])
        body["metadata"]["resourceVersion"] = str(revision)
        status, doc = await self._request("PATCH", name, body, "application/merge-patch+json")
        return self._written(status, doc, key, record, lease)

    def _written(self, status: int, doc: Mapping[str, Any], key: str, record: GroupRecord,
                 lease: Lease | None) -> Versioned | None:
        if status in (404, 409):
            return None
        if lease is not None and lease.id in self._leased:  # else it ran out meanwhile
            self._leased[lease.id].add(key)
        return Versioned(record, int(doc["metadata"]["resourceVersion"]))

    # ---- leases ----------------------------------------------------------------------------------
    async def grant(self, ttl: float) -> Lease:
        lease = Lease(id=f"tidemq-{uuid.uuid4().hex[:12]}", ttl=float(max(1, round(ttl))))
        self._leased[lease.id] = set()
        self._deadline[lease.id] = self.clock() + lease.ttl
        return lease

    def _forget(self, lease: Lease) -> set[str]:
        self._deadline.pop(lease.id, None)
        return self._leased.pop(lease.id, set())

    async def keep_alive(self, lease: Lease) -> bool:
        renewed_at = self.clock()
        if self._deadline.get(lease.id, 0.0) < renewed_at:
            self._forget(lease)
            return False
        keys = self._leased[lease.id]
        for key in sorted(keys):
            renewed = await self._renew(key, lease)
            if renewed is None:
                # Written since under another lease (a deposition, a hand-over taken, a new
                # master): no longer this lease's key, as a key rewritten on etcd leaves its old
                # lease; the lease itself lives on for its other keys.
                keys.discard(key)
            elif not renewed:
                self._forget(lease)
                return False
        self._deadline[lease.id] = renewed_at + lease.ttl
        return True

    async def _renew(self, key: str, lease: Lease) -> bool | None:
        """Move renewTime of ``key``'s Lease on, if ``lease`` still holds it and has not run out:
        True when renewed, None when the key is gone or another lease holds it now, False when
        this lease's hold on it ran out (or the write kept conflicting)."""
        for _attempt in range(3):  # a conflict here is another field's write: read and retry
            obj = await self._fetch(key)
            if obj is None or (obj.get("spec") or {}).get("holderIdentity") != lease.id:
                return None
            if self._live(obj, key) is None:
                return False
            patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                     "spec": {"renewTime": _micro_time(self.clock())}}
            status, _doc = await self._request("PATCH", lease_name(key), patch,
                                               "application/merge-patch+json")
            if status < 300:
                return True
            if status == 404:
                return None
        return False

    async def revoke(self, lease: Lease) -> None:
        for key in sorted(self._forget(lease)):
            obj = await self._fetch(key)
            if obj is None or (obj.get("spec") or {}).get("holderIdentity") != lease.id:
                continue
            patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                     "spec": {"holderIdentity": None}}
            await self._request("PATCH", lease_name(key), patch, "application/merge-patch+json")

    # ---- watch -----------------------------------------------------------------------------------
    async def watch(self, key: str, after: int = 0) -> AsyncIterator[Change]:
        if after <= 0:
            current = await self._fetch(key)
            after = int(current["metadata"]["resourceVersion"]) if current else 0
        while True:
            got_any = False
            try:
                async for change in self._watch_once(key, after):
                    got_any = True
                    after = change.revision
                    yield change
            except (aiohttp.ClientError, TimeoutError, ValueError, CoordinationError) as exc:
                log.info("Lease watch of %s broke after revision %d (%s); reopening", key, after, exc)
                if not got_any:
                    await asyncio.sleep(min(1.0, self.config.timeout))

    async def _watch_once(self, key: str, after: int) -> AsyncIterator[Change]:
        """One watch stream from ``after``; returns when it stays idle past ``watch_idle``."""
        name = lease_name(key)
        query = {"watch": "true", "fieldSelector": f"metadata.name={name}",
                 "timeoutSeconds": str(max(1, round(self.config.watch_idle)))}
        if after > 0:
            query["resourceVersion"] = str(after)
        path = f"{API_PATH}/namespaces/{self.config.namespace}/leases"
        url = f"{self.config.api_url.rstrip('/')}{path}?{urllib.parse.urlencode(query)}"
        resp = await asyncio.wait_for(
            self._http().get(url, headers=self._headers(), ssl=self._ssl or True,
                             timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.config.timeout)),
            self.config.timeout)
        async with resp:
            if resp.status >= 300:
                raise CoordinationError(f"the Kubernetes API refused to watch Lease {name} "
                                        f"with {resp.status}")
            while True:
                try:
                    line = await asyncio.wait_for(resp.content.readline(), self.config.watch_idle)
                except TimeoutError:
                    return
                if not line:
                    return  # the server ended the watch (timeoutSeconds): reopen
                if len(line) > MAX_WATCH_LINE:
                    raise CoordinationError(f"Lease watch line of {len(line)} bytes for {key}")
                if not line.strip():
                    continue
                event = orjson.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:  # too old a version: the current state is next
                        current = await self._fetch(key)
                        if current is not None:
                            live = self._live(current, key)
                            yield Change(live.record if live else None,
                                         int(current["metadata"]["resourceVersion"]))
                        return
                    raise CoordinationError(f"Lease watch of {key} failed: {obj.get('message')}")
                metadata = obj.get("metadata") or {}
                # The emulator (and a server without field selectors) may send other Leases.
                if metadata.get("name") != name or kind not in ("ADDED", "MODIFIED", "DELETED"):
                    continue
                revision = int(metadata.get("resourceVersion") or 0)
                if revision <= after:
                    continue
                live = None if kind == "DELETED" else self._live(obj, key)
                yield Change(live.record if live else None, revision)

    async def close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(aiohttp.ClientError):
                await self._session.close()
            self._session = None
