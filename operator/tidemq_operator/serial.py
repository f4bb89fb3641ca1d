"""One pass at a time per object, acting on the object as the API server has it now.

kopf runs a resource's timer in parallel with its event handlers, and hands a timer a live view
of the body that the watch stream rewrites under it. A timer that read the old spec could thus
re-apply the old StatefulSet template right after an update had applied the new one (a second
roll), or lower the write queues of a Topic an update had just grown. So every Cluster, Topic and
ConsumerGroup pass goes through :meth:`Serializer.current`:

- it takes the object's lock (one per metadata.uid) before anything of the object is read, so
  passes of one object never overlap (a create/update/resume handler, the timer, the deletion);
- under the lock it reads the object back from the API (a GET, not the watch stream, which may
  lag) and the pass acts on that snapshot: its spec, generation and status (:func:`choose`).
  A body older than what the API returns is never acted on. A timer skips an object that is gone,
  replaced by another of the same name, or being deleted.

Invariants: the lock table holds only the locks of passes running or waiting (weak values), so
it never outgrows the objects being reconciled now; a failed read raises (the pass is retried
later, never run on the body it doubts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, cast

import kopf

from tidemq.errors import TideMQError

log = logging.getLogger(__name__)

# (plural, namespace, name) -> the object as the API has it now, None when it does not exist.
Reader = Callable[[str, str, str], Awaitable[Mapping[str, Any] | None]]


class ReadFailed(TideMQError):
    """The object could not be read back from the API server (the pass is retried later)."""


def _generation(obj: Mapping[str, Any]) -> int:
    gen = (obj.get("metadata") or {}).get("generation")
    return gen if isinstance(gen, int) else 0


def choose(body: Mapping[str, Any], current: Mapping[str, Any] | None, timer: bool) -> kopf.Body | None:
    """What a pass started with ``body`` acts on, given ``current`` (the API's copy, None when the
    object is gone); None: skip the pass.

    The API's copy wins unless it is of an older generation than the body (an API server does
    not go back; a copy that does is itself stale). A pass never acts on another object of the
    same name (a new uid), and a timer not on an object that is gone or being deleted (its
    deletion handler has it)."""
    if current is None:
        return None
    uid = (body.get("metadata") or {}).get("uid")
    if uid and (current.get("metadata") or {}).get("uid") not in (None, uid):
        return None
    if timer and (current.get("metadata") or {}).get("deletionTimestamp"):
        return None
    chosen = body if _generation(current) < _generation(body) else current
    return kopf.Body(cast(kopf.RawBody, dict(chosen)))


class Serializer:
    """Per-object locks and the re-read. ``read`` is the API access (:func:`kube_reader` in the
    operator; tests pass their own against the emulator)."""

    def __init__(self, read: Reader) -> None:
        self._read = read
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def lock(self, body: Mapping[str, Any]) -> asyncio.Lock:
        """The lock of ``body``'s object (by uid; by namespace/name when it has none)."""
        md = body.get("metadata") or {}
        key = md.get("uid") or f"{md.get('namespace')}/{md.get('name')}"
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    @contextlib.asynccontextmanager
    async def current(self, plural: str, body: Mapping[str, Any], timer: bool = False
                      ) -> AsyncIterator[kopf.Body | None]:
        """Hold the object's lock and yield what the pass acts on (:func:`choose`); None: skip."""
        md = body.get("metadata") or {}
        async with self.lock(body):
            try:
                now = await self._read(plural, md.get("namespace") or "", md.get("name") or "")
            except Exception as exc:  # noqa: BLE001 (any API failure: this pass cannot know the spec)
                raise ReadFailed(f"cannot read {plural} {md.get('namespace')}/{md.get('name')} back "
                                 f"from the API server: {exc}") from None
            chosen = choose(body, now, timer)
            if chosen is None:
                log.info("%s %s/%s: pass skipped (%s)", plural, md.get("namespace"), md.get("name"),
                         "gone" if now is None else "being deleted or replaced")
            elif _generation(chosen) > _generation(body):
                log.info("%s %s/%s: pass started with generation %d acts on generation %d", plural,
                         md.get("namespace"), md.get("name"), _generation(body), _generation(chosen))
            yield chosen


def kube_reader(group: str, version: str) -> Reader:
    """A reader of ``group``/``version`` objects through the ``kubernetes`` client (configured by
    the operator's startup), its blocking calls in a worker thread; one API client for all."""
    api: list[Any] = []

    def get(plural: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        import kubernetes  # noqa: PLC0415 (optional dependency, only in the operator)

        if not api:
            api.append(kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient()))
        try:
            obj = api[0].get_namespaced_custom_object(group, version, namespace, plural, name)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj if isinstance(obj, Mapping) else None

    async def read(plural: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return await asyncio.to_thread(get, plural, namespace, name)

    return read
