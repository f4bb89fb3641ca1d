"""Writing the operator's objects to the API server: server-side apply, and create-once Secrets.

Every object the operator owns (StatefulSets, Services, ConfigMaps, PodDisruptionBudgets, RBAC
objects) is written with server-side apply (PATCH, content type ``application/apply-patch+yaml``)
as the field manager :data:`FIELD_MANAGER`, with ``force``. The API server then keeps exactly the
fields the operator sent: a field the operator set before and no longer sends (an ACL or TLS volume
and its mount, a CPU limit, metrics annotations after they were dropped from the Cluster) is removed,
while fields other managers set (kubectl annotations, the controllers' status, a replicated group's
partition set by the group roll) stay. ``force`` takes over a field another manager changed, as a
controller must (a StatefulSet scaled by hand goes back to the declared size). An apply that changes
nothing is a no-op for the API server (no new resourceVersion, no generation bump), so re-applying
an object on every pass costs one request and repairs drift.

Objects an operator from before server-side apply wrote belong to the Python client's Update
manager; the first apply takes those fields over (:func:`adopt_legacy_fields`), so what that
operator set and the Cluster no longer asks for goes too.

Invariants: an object is always sent whole (an applied configuration lists every field the
operator owns; a partial one would give up the rest); Secrets holding keys are never applied but
created once (:func:`create_once`), so a key is never rotated silently. Blocking calls: run them
in a worker thread.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from tidemq.errors import ConfigError
from tidemq.operator.workloads import MANAGED_BY

log = logging.getLogger(__name__)

FIELD_MANAGER = "tidemq-operator"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
# Update managers of the operator before server-side apply: the kubernetes Python client's
# User-Agent product ("OpenAPI-Generator/<version>/python"), as the API server names a manager
LEGACY_MANAGERS = frozenset({"OpenAPI-Generator"})

# apiVersion -> the kubernetes client's API class serving it
_APIS = {"v1": "CoreV1Api", "apps/v1": "AppsV1Api", "policy/v1": "PolicyV1Api",
         "rbac.authorization.k8s.io/v1": "RbacAuthorizationV1Api"}


def _snake(kind: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()


def _api(client: Any, obj: dict[str, Any]) -> Any:
    import kubernetes  # noqa: PLC0415 (optional dependency, only for managed clusters)

    api_name = _APIS.get(obj.get("apiVersion", ""))
    if api_name is None:
        raise ConfigError(f"cannot apply {obj.get('kind')} of {obj.get('apiVersion')}: the operator "
                          f"applies only {', '.join(sorted(_APIS))} objects")
    return getattr(kubernetes.client, api_name)(client)


def adopt_legacy_fields(managed_fields: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The managedFields with the fields of :data:`LEGACY_MANAGERS`' Update entries moved into the
    operator's Apply entry, or None when there is nothing to move (or no Apply entry yet).

    An object an operator from before server-side apply created or patched belongs to the
    Python client's Update manager; the API server removes only fields the apply manager owned, so
    a field that older operator set would never go. Taking its fields over once (what kubectl's
    csaupgrade does for client-side apply) makes the next apply remove those no longer sent."""
    ours = next((e for e in managed_fields if e.get("manager") == FIELD_MANAGER
                 and e.get("operation") == "Apply" and not e.get("subresource")), None)
    legacy = [e for e in managed_fields if e.get("manager") in LEGACY_MANAGERS
              and e.get("operation") == "Update" and not e.get("subresource")]
    if ours is None or not legacy:
        return None
    fields = dict(ours.get("fieldsV1") or {})
    for entry in legacy:
        fields = _union(fields, entry.get("fieldsV1") or {})
    return [{**e, "fieldsV1": fields} if e is ours else e for e in managed_fields if not any(e is x for x in legacy)]


def _union(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two FieldsV1 trees as one (a field either owns is in the result)."""
    out = dict(a)
    for key, sub in b.items():
        out[key] = _union(out.get(key) or {}, sub or {})
    return out


def apply_object(client: Any, obj: dict[str, Any], namespace: str) -> None:
    """Server-side apply one object (created when missing) through ``client`` (an ApiClient);
    fields an older operator owned are taken over first (:func:`adopt_legacy_fields`)."""
    import kubernetes  # noqa: PLC0415

    api = _api(client, obj)
    ns = obj.get("metadata", {}).get("namespace") or namespace
    name, kind = obj["metadata"]["name"], _snake(obj["kind"])
    patch = getattr(api, f"patch_namespaced_{kind}")

    def send() -> dict[str, Any]:
        # raw JSON: no client-side model validation of a partly filled status
        resp = patch(name, ns, obj, field_manager=FIELD_MANAGER, force=True,
                     _content_type=APPLY_CONTENT_TYPE, _preload_content=False)
        out: dict[str, Any] = json.loads(resp.data)
        return out

    live = send()
    adopted = adopt_legacy_fields((live.get("metadata") or {}).get("managedFields") or [])
    if adopted is None:
        return
    version = (live.get("metadata") or {}).get("resourceVersion")
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}] if version else []
    ops.append({"op": "replace", "path": "/metadata/managedFields", "value": adopted})
    try:
        patch(name, ns, ops, _content_type="application/json-patch+json", _preload_content=False)
    except kubernetes.client.ApiException as exc:
        if exc.status not in (409, 422):  # changed meanwhile (the test op): the next pass retries
            raise
        log.info("%s %s/%s changed while taking over an older operator's fields; retrying next pass",
                 obj["kind"], ns, name)
        return
    log.info("%s %s/%s: took over the fields an older operator owned", obj["kind"], ns, name)
    send()  # now the fields no longer desired go


def apply_objects(objs: list[dict[str, Any]], namespace: str) -> list[str]:
    """Server-side apply each object in order; returns ``Kind/name`` of each (worker thread)."""
    import kubernetes  # noqa: PLC0415

    client = kubernetes.client.ApiClient()
    done = []
    for obj in objs:
        apply_object(client, obj, namespace)
        done.append(f"{obj['kind']}/{obj['metadata']['name']}")
    return done


def covers(live: Any, want: Any) -> bool:
    """Whether ``live`` holds every field of ``want`` with its value: maps may have more keys (the
    API server adds defaults and other managers' fields), lists must match item by item.

    A quantity the API server writes in another form ("1000m" read back as "1") does not match:
    such an object is applied again on each pass, which server-side apply makes a no-op."""
    if isinstance(want, dict):
        return isinstance(live, dict) and all(k in live and covers(live[k], v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(live, list) and len(live) == len(want) and all(map(covers, live, want))
    return bool(live == want)


def _drifted(obj: dict[str, Any], live: dict[str, Any] | None) -> bool:
    if live is None:
        return True
    md = obj.get("metadata") or {}
    want = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}
    want["metadata"] = {k: md[k] for k in ("labels", "annotations", "ownerReferences") if k in md}
    return not covers(live, want)


# kinds whose live objects refresh() lists (by the operator's label) to apply only what drifted;
# others (a replicated group's ServiceAccount/Role/RoleBinding) are applied on every pass
_LISTED = {"Service": "list_namespaced_service", "ConfigMap": "list_namespaced_config_map"}


def refresh(objs: list[dict[str, Any]], namespace: str,
            statefulsets: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """Drift repair: apply those of ``objs`` (in step with the spec) that are missing or differ
    from the live objects (``statefulsets``: the live StatefulSets the pass read already; Services
    and ConfigMaps are listed here). Returns ``Kind/name`` of each applied (worker thread)."""
    import kubernetes  # noqa: PLC0415

    client = kubernetes.client.ApiClient()
    core = kubernetes.client.CoreV1Api(client)
    live: dict[tuple[str, str], Any] = {("StatefulSet", n): o for n, o in statefulsets.items()}
    for kind in sorted({o["kind"] for o in objs} & _LISTED.keys()):
        found = getattr(core, _LISTED[kind])(namespace, label_selector=f"app.kubernetes.io/managed-by={MANAGED_BY}",
                                             _preload_content=False)
        for item in json.loads(found.data).get("items") or []:
            live[(kind, (item.get("metadata") or {}).get("name", ""))] = item
    done = []
    for obj in objs:
        key = (obj["kind"], obj["metadata"]["name"])
        if key[0] in _LISTED or key[0] == "StatefulSet":
            if not _drifted(obj, live.get(key)):
                continue
        apply_object(client, obj, namespace)
        done.append(f"{key[0]}/{key[1]}")
    return done


def create_once(obj: dict[str, Any], namespace: str) -> bool:
    """Create ``obj`` (a Secret) unless it exists; never patch it (a key is not rotated silently).
    Returns whether it was created (worker thread)."""
    import kubernetes  # noqa: PLC0415

    api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient())
    if obj["kind"] != "Secret":
        raise ConfigError(f"cannot create {obj['kind']} once: only Secrets are created once")
    try:
        # the client sends a dict body as it is; its annotations name only the V1Secret model
        api.create_namespaced_secret(obj["metadata"].get("namespace") or namespace, obj)  # type: ignore[arg-type]
    except kubernetes.client.ApiException as exc:
        if exc.status != 409:  # 409 AlreadyExists; any other refusal is an error
            raise
        return False
    return True
