"""kmock's KubernetesEmulator adapted to serve Leases the way the coordination store uses them.

kmock 0.8 keeps no ``metadata.resourceVersion`` and ignores one sent with a patch, so it has no
optimistic concurrency. Here, for Leases only, every create and patch gets the next version of one
counter (as the API server takes etcd's revision), and a patch naming another version than the
stored one is answered 409 Conflict, as the API server does. Lease writes are serialized so that the
check and the write are one step. What the emulator still does not do (and the tests therefore do
not check on it): watch from a resourceVersion (it replays every Lease as ADDED, the store skips
what it has seen), ``timeoutSeconds`` on watches, and field selectors (the store filters by name).
"""

from __future__ import annotations

import asyncio
import itertools

import aiohttp.web
import kmock

from tests.support.kube import status_emulator


class LeaseEmulator(status_emulator()):
    def __init__(self) -> None:
        super().__init__()
        self._versions = itertools.count(1)
        self._writes = asyncio.Lock()

    async def _handle(self, request):
        resource = request.resource
        if resource is None or resource.plural != "leases" or \
                request.action not in (kmock.action.CREATE, kmock.action.UPDATE):
            return await super()._handle(request)
        async with self._writes:
            metadata = request.data.setdefault("metadata", {})
            if request.action == kmock.action.UPDATE:
                key = (resource, request.namespace, request.name)
                stored = self._objects[key] if key in self._objects else None
                wanted = metadata.get("resourceVersion")
                current = None if stored is None or stored.deleted else \
                    (stored.get("metadata") or {}).get("resourceVersion")
                if wanted is not None and current is not None and wanted != current:
                    return aiohttp.web.json_response(
                        {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                         "reason": "Conflict", "code": 409,
                         "message": f"the object has been modified (at {current}, not {wanted})"},
                        status=409)
            metadata["resourceVersion"] = str(next(self._versions))
            return await super()._handle(request)


def build_emulator() -> LeaseEmulator:
    emu = LeaseEmulator()
    emu.resources["coordination.k8s.io/v1/leases"] = kmock.ResourceInfo(
        kind="Lease", namespaced=True, singular="lease",
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"})
    return emu
