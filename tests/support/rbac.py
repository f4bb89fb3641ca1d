"""Kubernetes RBAC bookkeeping for tests: which (apiGroup, resource, verb) a request needs, and which
a set of rules grants. Verbs follow the API server's request-info rules (GET on a collection is
``list``, ``?watch=true`` is ``watch``, PUT ``update``, PATCH ``patch``, POST ``create``, DELETE on a
collection ``deletecollection``); subresources are ``resource/subresource``. Discovery and other
non-resource paths (``/api``, ``/apis``, ``/apis/g/v``, ``/version``) give None: every authenticated
user may read them (system:discovery)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

Permission = tuple[str, str, str]  # (apiGroup, resource, verb)

BLOCK_OWNER_DELETION_NOTE = (
    "setting ownerReferences[].blockOwnerDeletion needs 'update' on the owner's finalizers "
    "subresource (admission plugin OwnerReferencesPermissionEnforcement); the request itself is a "
    "create/patch of the owned object, so this permission is derived from the recorded bodies"
)


def permission(method: str, path: str, query: Mapping[str, str]) -> Permission | None:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None
    watch_path = rest[0] == "watch"
    if watch_path:
        rest = rest[1:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]  # namespaced: namespaces/<ns>/<resource>[/<name>[/<sub>]]
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
    if sub:
        resource = f"{resource}/{sub}"
    method = method.upper()
    if method == "GET":
        if watch_path or str(query.get("watch", "")).lower() in ("true", "1"):
            verb = "watch"
        else:
            verb = "get" if name else "list"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete" if name else "deletecollection"}.get(method, method.lower())
    return group, resource, verb


def apply_implies_create(perm: Permission | None, content_type: str) -> Permission | None:
    """Server-side apply (PATCH ``application/apply-patch+yaml``) creates a missing object, and the
    API server then also authorizes ``create`` (k8s.io/apiserver, handlers/patch.go: the create
    validation runs with the create authorizer attributes): the ``create`` a recorded apply needs."""
    if perm is None or perm[2] != "patch" or "/" in perm[1] or not content_type.startswith("application/apply-patch"):
        return None
    return perm[0], perm[1], "create"


def granted(rules: Iterable[Mapping]) -> set[Permission]:
    return {(g, r, v) for rule in rules for g in rule.get("apiGroups", [])
            for r in rule.get("resources", []) for v in rule.get("verbs", [])}


def owner_finalizer_permissions(body: object) -> set[Permission]:
    """Permissions implied by blockOwnerDeletion owner references in a created/patched object."""
    out: set[Permission] = set()
    if not isinstance(body, Mapping):
        return out
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("blockOwnerDeletion"):
            group = str(ref.get("apiVersion", "")).rpartition("/")[0]
            plural = str(ref.get("kind", "")).lower() + "s"
            out.add((group, f"{plural}/finalizers", "update"))
    return out


FORBIDDEN_VERBS = {"*", "escalate", "bind", "impersonate"}


def risky(perms: Iterable[Permission]) -> list[str]:
    """Grants that RBAC good practice rules out for this operator."""
    bad = []
    for g, r, v in perms:
        if "*" in (g, r, v) or v in FORBIDDEN_VERBS:
            bad.append(f"{g or 'core'}/{r} {v}")
        elif r == "secrets" and v in ("list", "watch", "get"):
            bad.append(f"secrets {v}")
        elif r == "pods/exec" or r == "pods/attach" or r == "nodes/proxy":
            bad.append(f"{r} {v}")
    return bad
