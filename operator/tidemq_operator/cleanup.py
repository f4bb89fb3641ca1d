"""``tidemq operator cleanup``: delete a Helm release's Topics and ConsumerGroups before the release goes.

``helm uninstall`` deletes the operator, its RBAC and the Topics together; a Topic keeps the
operator's finalizer (``tidemq.io/finalizer``) until the operator has deleted the topic on the
brokers, and with the operator gone it stayed Terminating for ever. The chart runs this as a
pre-delete hook (a Job), while the operator still runs:

1. delete the release's Topics and ConsumerGroups (labels ``app.kubernetes.io/instance=<release>``
   and ``app.kubernetes.io/managed-by=Helm``; nothing else is touched);
2. wait, up to ``timeout``, for them to go (the operator deletes each topic on the brokers, then
   releases its finalizer);
3. whatever is still there then keeps only finalizers that are not the operator's: a Warning
   Event on the object says that the topic may remain on the brokers.

Invariants: only objects of the release are deleted or patched; the command ends within about
``timeout`` plus a few API calls; every step is idempotent (a re-run after a failed hook is safe);
a kind whose CRD is gone counts as cleaned up.
Clock and sleep are injected.
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidemq.operator import crds

log = logging.getLogger(__name__)

FINALIZER = "tidemq.io/finalizer"  # kopf's, as tidemq.operator.handlers configures it
KINDS = ("Topic", "ConsumerGroup")
POLL = 1.0


@dataclass(frozen=True, slots=True)
class CleanupResult:
    deleted: tuple[str, ...] = ()    # Kind/name deleted (by the operator or without a finalizer)
    released: tuple[str, ...] = ()   # Kind/name whose finalizer was released after the timeout
    remaining: tuple[str, ...] = field(default=())  # still present at the end (other finalizers)


def of_release(obj: dict[str, Any], release: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get("app.kubernetes.io/instance") == release and labels.get("app.kubernetes.io/managed-by") == "Helm"


def _key(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


class Cleanup:
    def __init__(self, api_client: Any, namespace: str, release: str, timeout: float,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 poll: float = POLL) -> None:
        import kubernetes  # noqa: PLC0415 (optional dependency: the operator extra)

        self._custom = kubernetes.client.CustomObjectsApi(api_client)
        self._core = kubernetes.client.CoreV1Api(api_client)
        self._errors = kubernetes.client.ApiException
        self.namespace, self.release, self.timeout = namespace, release, timeout
        self.clock, self.sleep, self.poll = clock, sleep, poll

    def _list(self) -> list[dict[str, Any]]:
        out = []
        for kind in KINDS:
            try:
                listed: Any = self._custom.list_namespaced_custom_object(crds.GROUP, crds.VERSION, self.namespace,
                                                                         crds.PLURALS[kind])
            except self._errors as exc:
                if exc.status == 404:  # the CRD is gone: nothing of that kind is left to clean up
                    continue
                raise
            items = listed["items"]
            out += [{**o, "kind": kind} for o in items if of_release(o, self.release)]
        return out

    def run(self) -> CleanupResult:
        objs = self._list()
        names = {_key(o) for o in objs}
        log.info("release %s: deleting %d Topics and ConsumerGroups in %s", self.release, len(objs), self.namespace)
        for obj in objs:
            try:
                self._custom.delete_namespaced_custom_object(crds.GROUP, crds.VERSION, self.namespace,
                                                             crds.PLURALS[obj["kind"]], obj["metadata"]["name"])
            except self._errors as exc:
                if exc.status != 404:
                    raise
        deadline = self.clock() + self.timeout
        left = self._list()
        while left and self.clock() < deadline:
            self.sleep(min(self.poll, max(0.0, deadline - self.clock())))
            left = self._list()
        released = []
        for obj in left:
            if FINALIZER in ((obj.get("metadata") or {}).get("finalizers") or []):
                self._release(obj)
                released.append(_key(obj))
        remaining = sorted(_key(o) for o in self._list())
        gone = tuple(sorted(names - set(released) - set(remaining)))
        if remaining:
            log.warning("release %s: still present after cleanup (finalizers of others): %s",
                        self.release, ", ".join(remaining))
        return CleanupResult(deleted=gone, released=tuple(sorted(released)), remaining=tuple(remaining))

    def _release(self, obj: dict[str, Any]) -> None:
        md = obj["metadata"]
        message = (f"the operator did not delete {obj['kind']} {md['name']} within {self.timeout:g} s of "
                   f"helm uninstall (release {self.release}): its finalizer {FINALIZER} was released, "
                   "so the topic may remain on the brokers (mqadmin deleteTopic removes it)")
        log.warning("%s", message)
        self._event(obj, message)
        finalizers = [f for f in md.get("finalizers") or [] if f != FINALIZER]
        try:
            self._custom.patch_namespaced_custom_object(
                crds.GROUP, crds.VERSION, self.namespace, crds.PLURALS[obj["kind"]], md["name"],
                {"metadata": {"finalizers": finalizers}}, _content_type="application/merge-patch+json")
        except self._errors as exc:
            if exc.status != 404:  # gone meanwhile: the operator finished after all
                raise

    def _event(self, obj: dict[str, Any], message: str) -> None:
        md = obj["metadata"]
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{md['name']}.{uuid.uuid4().hex[:10]}", "namespace": self.namespace},
            "involvedObject": {"apiVersion": crds.API_VERSION, "kind": obj["kind"], "name": md["name"],
                               "namespace": self.namespace, "uid": md.get("uid")},
            "type": "Warning", "reason": "FinalizerReleased", "message": message,
            "source": {"component": "tidemq-operator-cleanup"}, "reportingComponent": "tidemq-operator-cleanup",
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self._core.create_namespaced_event(self.namespace, body)  # type: ignore[arg-type]
        except self._errors as exc:  # the release matters more than its Event
            log.warning("cannot post the Warning Event on %s: %s", _key(obj), exc)
