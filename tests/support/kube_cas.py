"""A kmock emulator with resourceVersion compare-and-swap and a log of writes by client token.

Adaptations of kmock 0.8 (on top of tests.support.kube.status_emulator), each as the API server:
- Leases (VERSIONED) get a new ``metadata.resourceVersion`` (a counter) on every create and
  patch, and a merge patch carrying another ``metadata.resourceVersion`` than the stored one is
  refused with 409 Conflict (a JSON patch whose ``test`` of it fails, with 422). kmock has no
  versions at all, and leader election (tidemq.operator.leader) is only correct with this
  compare-and-swap: two replicas racing for a free Lease must not both win. Other kinds stay
  unversioned, as in kmock: with versions on them, kopf (which waits for the watch event of the
  version its patch returned) stopped handling some Topics against kmock's watch. kopf's JSON
  patches test ``/metadata/resourceVersion`` against the value it saw (none there), which kmock
  answered with a 500: that test is dropped for unversioned objects;
- ``metadata.generateName`` is honoured (kopf's Events use it; kmock stores them under None);
- every write (create, patch, delete) is logged with the bearer token that sent it (``writes``),
  so a test gives each operator process its own token and sees which one wrote what; ``seen``
  lists every request (reads too), for RBAC checks (tests.support.rbac.permission).
The compare-and-swap and the log run under one lock, so concurrent writes are serialised.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from dataclasses import dataclass
from typing import Any

from tests.support.kube import status_emulator


@dataclass(frozen=True, slots=True)
class Write:
    token: str       # the bearer token ("" without one)
    action: str      # CREATE | UPDATE | DELETE
    plural: str      # e.g. leases, topics
    namespace: str | None
    name: str | None
    subresource: str | None


VERSIONED = frozenset({"leases"})


@functools.cache
def cas_emulator() -> type:
    import aiohttp.web  # noqa: PLC0415
    import kmock  # noqa: PLC0415

    writes_actions = {kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE}

    class CasEmulator(status_emulator()):
        """See the module docstring. ``writes`` lists every write in order."""

        writes: list[Write]
        seen: list[tuple[str, str, str, dict]]  # every request: (token, method, path, query)
        _version: int
        _cas: asyncio.Lock | None

        async def _handle(self, request: Any) -> Any:
            if request.resource is not None:
                self.seen.append((request.headers.get("Authorization", "").removeprefix("Bearer "),
                                  str(getattr(request.method, "value", request.method)), request.url.path,
                                  dict(request.params)))
            if request.resource is None or request.action not in writes_actions:
                return await super()._handle(request)
            if self._cas is None:
                self._cas = asyncio.Lock()
            async with self._cas:
                data = request.data if isinstance(request.data, dict) else None
                versioned = request.resource.plural in VERSIONED
                if request.action == kmock.action.CREATE and data is not None:
                    md = data.setdefault("metadata", {})
                    if not md.get("name") and md.get("generateName"):
                        md["name"] = md["generateName"] + uuid.uuid4().hex[:8]
                    if versioned:
                        md["resourceVersion"] = self._next_version()
                elif request.action == kmock.action.UPDATE and isinstance(request.data, list) and not versioned:
                    request.data[:] = [op for op in request.data if not (
                        op.get("op") == "test" and op.get("path") == "/metadata/resourceVersion")]
                elif request.action == kmock.action.UPDATE and isinstance(request.data, list):
                    have = self._stored_version(request)
                    for op in request.data:
                        if op.get("op") == "test" and op.get("path") == "/metadata/resourceVersion" \
                                and op.get("value") != have:
                            return _status(422, "Invalid", f"test of resourceVersion {op.get('value')} failed: now {have}")
                    request.data.append({"op": "add", "path": "/metadata/resourceVersion",
                                         "value": self._next_version()})
                elif request.action == kmock.action.UPDATE and data is not None and versioned:
                    sent = (data.get("metadata") or {}).get("resourceVersion")
                    have = self._stored_version(request)
                    if sent is not None and have is not None and sent != have:
                        return _status(409, "Conflict", f"the object has been modified (resourceVersion {sent}, now {have})")
                    data.setdefault("metadata", {})["resourceVersion"] = self._next_version()
                self.writes.append(Write(request.headers.get("Authorization", "").removeprefix("Bearer "),
                                         str(request.action.value), request.resource.plural,
                                         request.namespace, request.name, request.subresource))
                return await super()._handle(request)

        def _stored_version(self, request: Any) -> str | None:
            key = (request.resource, request.namespace, request.name)
            stored = self._objects[key] if key in self._objects else None
            if stored is None or stored.deleted:
                return None
            return (stored.get("metadata") or {}).get("resourceVersion")

        def _next_version(self) -> str:
            self._version += 1
            return str(self._version)

    def _status(code: int, reason: str, message: str) -> Any:
        return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                                          "reason": reason, "code": code, "message": message}, status=code)

    return CasEmulator


def build_cas_emulator(custom: bool = True) -> Any:
    """The emulator with the bundled kinds (Leases, CRDs, Events ...) and, with ``custom``, the
    TideMQ kinds registered from crds/ (it serves no CustomResourceDefinitions itself)."""
    import kmock  # noqa: PLC0415

    from tidemq.operator import crds  # noqa: PLC0415

    emu = cas_emulator()()
    emu.writes, emu.seen, emu._version, emu._cas = [], [], 0, None
    emu.resources.load_bundled()
    if custom:
        for kind in crds.KINDS:
            names = crds.load_crd(kind)["spec"]["names"]
            emu.resources[f"{crds.API_VERSION}/{names['plural']}"] = kmock.ResourceInfo(
                kind=names["kind"], namespaced=True, singular=names["singular"],
                shortnames=set(names.get("shortNames", [])),
                verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
                subresources={"status"})
    return emu


def kubeconfig_text(url: str, token: str) -> str:
    """A kubeconfig for the emulator at ``url`` that authenticates with ``token``."""
    return ("apiVersion: v1\nkind: Config\ncurrent-context: emu\n"
            f"clusters:\n- name: emu\n  cluster:\n    server: {url}\n"
            f"users:\n- name: emu\n  user:\n    token: {token}\n"
            "contexts:\n- name: emu\n  context:\n    cluster: emu\n    user: emu\n")
