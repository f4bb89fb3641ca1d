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

Invariants: an object is always sent whole (an applied configuration lists every field the
operator owns; a partial one would give up the rest); Secrets holding keys are never applied but
created once (:func:`create_once`), so a key is never rotated silently. Blocking calls: run them
in a worker thread.
"""

from __future__ import annotations

import re
from typing import Any

from tidemq.errors import ConfigError

FIELD_MANAGER = "tidemq-operator"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"

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


def apply_object(client: Any, obj: dict[str, Any], namespace: str) -> None:
    """Server-side apply one object (created when missing) through ``client`` (an ApiClient)."""
    api = _api(client, obj)
    ns = obj.get("metadata", {}).get("namespace") or namespace
    # The raw response is enough (unpreloaded: no model validation of a partly filled status).
    getattr(api, f"patch_namespaced_{_snake(obj['kind'])}")(
        obj["metadata"]["name"], ns, obj, field_manager=FIELD_MANAGER, force=True,
        _content_type=APPLY_CONTENT_TYPE, _preload_content=False)


def apply_objects(objs: list[dict[str, Any]], namespace: str) -> list[str]:
    """Server-side apply each object in order; returns ``Kind/name`` of each (worker thread)."""
    import kubernetes  # noqa: PLC0415

    client = kubernetes.client.ApiClient()
    done = []
    for obj in objs:
        apply_object(client, obj, namespace)
        done.append(f"{obj['kind']}/{obj['metadata']['name']}")
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
