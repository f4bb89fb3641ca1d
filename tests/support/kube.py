"""A kmock KubernetesEmulator served on 127.0.0.1 from a background thread.

Tests talk to it synchronously (kubernetes client, Helm, kopf in a subprocess) while it runs its
own event loop. ``build`` makes the emulator on that loop. Every test package builds on
:func:`status_emulator` (errors answered with their status code, as the API server does) and
adapts kmock 0.8 further in its own way, documented where its subclass is defined.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import threading
from collections.abc import Callable

from tests.support import ssa

# The Status reason the API server gives with each code (metav1.StatusReason).
_REASONS = {404: "NotFound", 409: "AlreadyExists"}


@functools.cache
def status_emulator() -> type:
    """kmock 0.8's KubernetesEmulator answering its errors as the API server does.

    kmock raises its KubernetesError (404 Object Not Found, 409 Already Exists, ...) from the
    request handler, where nothing renders it: it reached the client as a plain 500 with a
    traceback, so a missing object looked like a server failure. Here it becomes a Status object
    with its own code and reason, and code under test can treat only 404 as "missing".
    It also serves server-side apply with field managers (tests.support.ssa), which kmock
    would take for a plain JSON merge, and keeps kmock's request log short (see _handle).
    (A class made on first use: kmock is optional and imported only by the tests that need it.)
    """
    import aiohttp.web  # noqa: PLC0415
    import kmock  # noqa: PLC0415

    class StatusEmulator(kmock.KubernetesEmulator):
        async def _handle(self, request):
            # kmock matches each request to its reactions by walking its log of every request so
            # far (~0.6 ms per logged request here): with an operator passing every second, each
            # request was slower than the last. The log keeps the requests being served (a watch
            # until it ends); tests that count requests record them themselves.
            inflight = self.__dict__.setdefault("_inflight", {})
            inflight[id(request)] = request
            self._requests[:] = list(inflight.values())
            try:
                return await super()._handle(_field_managed(self, request))
            except ssa.Refused as exc:
                return aiohttp.web.json_response(
                    {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                     "reason": exc.reason, "code": exc.code, "message": str(exc)}, status=exc.code)
            except kmock.KubernetesError as exc:
                return aiohttp.web.json_response(
                    {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                     "reason": _REASONS.get(exc.status, "InternalError"), "code": exc.status,
                     "message": exc.message or ""}, status=exc.status)
            finally:
                inflight.pop(id(request), None)

    return StatusEmulator


def _rewritten(request, **fields):
    """kmock finds the reaction for a request by the identity of the request it recorded (a copy
    matches none), so its frozen fields are rewritten in place."""
    for name, value in fields.items():
        object.__setattr__(request, name, value)
    return request


def _field_managed(emulator, request):
    """``request`` as kmock should store it under server-side apply (tests.support.ssa): an apply
    becomes the CREATE or merge PATCH that yields the applied object; a non-apply write to an
    object that was applied carries the managedFields it leaves."""
    import kmock  # noqa: PLC0415

    if request.resource is None or request.name is None or not isinstance(request.data, dict) \
            or request.action != kmock.action.UPDATE:
        return request
    key = (request.resource, request.namespace, request.name)
    stored = emulator.objects[key] if key in emulator.objects else None
    live = copy.deepcopy(stored.raw) if stored is not None and not stored.deleted else None
    content_type = (request.headers.get("Content-Type") or "").split(";")[0].strip()
    if content_type == ssa.APPLY_CONTENT_TYPE and request.subresource is None:
        manager = request.params.get("fieldManager")
        if not manager:
            raise ssa.Refused("PATCH is not supported: fieldManager is required for apply requests")
        new = ssa.apply(live, request.data, manager, request.params.get("force") == "true")
        if live is None:
            new["metadata"].setdefault("namespace", request.namespace)
            return _rewritten(request, action=kmock.action.CREATE, data=new)
        return _rewritten(request, data=ssa.merge_diff(live, new))
    if live is not None:
        fields = ssa.track_update(live, ssa.merge_patch(live, request.data),
                                  ssa.update_manager(request.params, request.headers))
        if fields is not None:
            request.data.setdefault("metadata", {})["managedFields"] = fields
    return request


class ThreadedEmulator:
    def __init__(self, build: Callable[[], object], name: str = "kmock") -> None:
        self.build = build
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "ThreadedEmulator":
        self._thread.start()
        if not self._ready.wait(20) or self._error:
            raise RuntimeError(f"emulator did not start: {self._error}")
        return self

    def stop(self) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 (reported to start())
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        import kmock  # noqa: PLC0415 (optional: only the tests that need it import it)

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        emu = self.build()
        async with kmock.Server(emu) as server:
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()
