"""Server-side apply (SSA) for kmock's KubernetesEmulator: just enough of the API server's field
management for the operator's tests (tests.support.kube.status_emulator uses it).

kmock 0.8 merges every PATCH as plain JSON and knows no field managers, so an apply that no longer
sends a field would leave it in place, the very defect SSA fixes. Here a PATCH with the content type
``application/apply-patch+yaml`` is turned into what the API server would store:

- Each manager's owned fields are kept in ``metadata.managedFields`` in the API server's own
  FieldsV1 notation (``f:<key>``, ``k:{"name":...}`` for a list item, ``.`` for the item itself).
- An apply by manager M owns exactly the fields it sends. The fields M owned before and no longer
  sends are removed from the object unless another manager owns them too; fields it never owned
  (set by kubectl, a controller, the status subresource) are never touched.
- A field another manager owns with another value is a conflict: 409 Conflict, unless the apply
  says ``force=true``, which takes the field over.
- An apply of a missing object creates it; one that changes ``spec`` bumps ``metadata.generation``.
- Once an object has managedFields, a non-apply write (merge patch, update, status) takes over the
  fields whose value it changes, under its ``fieldManager`` parameter or its User-Agent's product
  (as the API server names an Update manager).

Simplified against the real API server (documented so that a test does not lean on them):
- Lists of objects whose every item has a ``name`` are maps keyed by ``name``; every other list is
  atomic (replaced whole). The API server keys some lists otherwise (volumeMounts by mountPath,
  ports by containerPort + protocol) per the OpenAPI schema's list-map-keys.
- No defaulting, validation, immutability checks or resourceVersion; ``apiVersion``, ``kind``,
  ``metadata.name``/``namespace``, the server's metadata fields and ``status`` (applied to the main
  resource) are not tracked. Objects written before their first apply have no managedFields (the
  API server tracks every write from creation), so only fields an apply sent can ever be removed;
  a test that needs the API server's record of earlier writers creates the object with
  ``metadata.managedFields`` (:func:`encode` gives the FieldsV1 of a set of paths).
- The apply is computed from the stored object just before kmock's handler stores the result;
  both run on the emulator's one event loop without awaiting in between, so no write interleaves.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
# metadata the server owns: never part of an applied configuration, never removed by an apply
_SERVER_METADATA = frozenset({"managedFields", "resourceVersion", "generation", "uid", "creationTimestamp",
                              "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"})
_UNTRACKED_TOP = frozenset({"apiVersion", "kind", "status"})
_UNTRACKED_METADATA = _SERVER_METADATA | {"name", "namespace"}

Item = tuple[str, str]           # a list item keyed by name: ("name", <name>)
Path = tuple[str | Item, ...]     # keys and keyed items from the object's root


class Refused(Exception):
    """A write the API server refuses: answered as a Status with ``code`` and ``reason``."""

    code, reason = 400, "BadRequest"


class Conflict(Refused):
    """An apply without force would change fields other managers own."""

    code, reason = 409, "Conflict"

    def __init__(self, manager: str, fields: list[tuple[str, Path]]) -> None:
        self.fields = fields
        what = "; ".join(f"{_dotted(p)} (owned by {m})" for m, p in fields)
        super().__init__(f"Apply failed with {len(fields)} conflict(s): {what}; "
                         f"apply with force=true to take them over as {manager}")


def _dotted(path: Path) -> str:
    return ".".join(p if isinstance(p, str) else f"[name={p[1]}]" for p in path)


def _keyed(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in value))


def field_paths(obj: Mapping[str, Any]) -> set[Path]:
    """Every field an object sets, as tracked for ownership (leaves, empty maps, keyed items)."""
    out: set[Path] = set()
    for key, value in obj.items():
        if key in _UNTRACKED_TOP:
            continue
        if key == "metadata" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in _UNTRACKED_METADATA}
            if not value:
                continue
        _walk(value, (key,), out)
    return out


def _walk(value: Any, prefix: Path, out: set[Path]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _walk(v, (*prefix, k), out)
    elif _keyed(value):
        for item in value:
            node = (*prefix, ("name", item["name"]))
            out.add(node)
            fields = {k: v for k, v in item.items() if k != "name"}  # the key is the item's own
            if fields:
                _walk(fields, node, out)
    else:
        out.add(prefix)


def _child(value: Any, step: str | Item) -> Any:
    if isinstance(step, str):
        return value.get(step) if isinstance(value, dict) else None
    if isinstance(value, list):
        return next((i for i in value if isinstance(i, dict) and i.get("name") == step[1]), None)
    return None


def value_at(obj: Any, path: Path) -> Any:
    for step in path:
        obj = _child(obj, step)
        if obj is None:
            return None
    return obj


def _remove(obj: dict[str, Any], path: Path) -> None:
    """Remove the field at ``path`` and the maps/lists it leaves empty (below the top level)."""
    chain = [obj]
    for step in path[:-1]:
        nxt = _child(chain[-1], step)
        if nxt is None:
            return
        chain.append(nxt)
    _drop(chain[-1], path[-1])
    for depth in range(len(chain) - 1, 1, -1):
        if chain[depth] in ({}, []):
            _drop(chain[depth - 1], path[depth - 1])


def _drop(container: Any, step: str | Item) -> None:
    if isinstance(step, str) and isinstance(container, dict):
        container.pop(step, None)
    elif isinstance(step, tuple) and isinstance(container, list):
        container[:] = [i for i in container if not (isinstance(i, dict) and i.get("name") == step[1])]


def merge(live: Any, applied: Any) -> Any:
    """``applied`` over ``live``: maps merge, keyed lists merge by name (applied order first, then
    the live items it does not name), anything else is replaced."""
    if isinstance(live, dict) and isinstance(applied, dict):
        out = dict(live)
        for k, v in applied.items():
            out[k] = merge(live.get(k), v)
        return out
    if _keyed(applied) and (_keyed(live) or live == []):
        named = {i["name"]: i for i in live}
        out_list = [merge(named.get(i["name"]), i) for i in applied]
        sent = {i["name"] for i in applied}
        return out_list + [i for i in live if i["name"] not in sent]
    return copy.deepcopy(applied)


def merge_patch(base: Any, patch: Any) -> Any:
    """JSON merge patch (RFC 7386), as kmock stores a non-apply PATCH."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(base) if isinstance(base, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def merge_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch that turns ``old`` into ``new`` (what kmock's PATCH path stores)."""
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old:
            out[k] = v
        elif old[k] != v:
            out[k] = merge_diff(old[k], v) if isinstance(old[k], dict) and isinstance(v, dict) and v else v
    return out


# managedFields in the API server's FieldsV1 notation ------------------------------------------------
def encode(paths: Iterable[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        for step in path:
            key = f"f:{step}" if isinstance(step, str) else "k:" + json.dumps({step[0]: step[1]}, separators=(",", ":"))
            node = node.setdefault(key, {})
        if isinstance(path[-1], tuple):
            node["."] = {}
    return tree


def _decode(tree: Mapping[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, sub in tree.items():
        if key == ".":
            out.add(prefix)
            continue
        if key.startswith("f:"):
            step: str | Item = key[2:]
        else:
            (k, v), = json.loads(key[2:]).items()
            step = (k, v)
        path = (*prefix, step)
        if sub:
            out |= _decode(sub, path)
        else:
            out.add(path)
    return out


def managers_of(obj: Mapping[str, Any]) -> dict[str, tuple[str, set[Path]]]:
    """manager -> (operation, owned paths) from an object's metadata.managedFields."""
    out: dict[str, tuple[str, set[Path]]] = {}
    for entry in (obj.get("metadata") or {}).get("managedFields") or ():
        out[entry["manager"]] = (entry.get("operation", "Update"), _decode(entry.get("fieldsV1") or {}))
    return out


def _managed_fields(managers: Mapping[str, tuple[str, set[Path]]], api_version: str) -> list[dict[str, Any]]:
    return [{"manager": m, "operation": op, "apiVersion": api_version, "fieldsType": "FieldsV1",
             "fieldsV1": encode(paths)} for m, (op, paths) in sorted(managers.items()) if paths]


# the two writes --------------------------------------------------------------------------------------
def apply(live: dict[str, Any] | None, applied: dict[str, Any], manager: str, force: bool) -> dict[str, Any]:
    """The object the API server stores after ``manager`` applies ``applied`` to ``live`` (None:
    missing). Raises :class:`Conflict`."""
    config = copy.deepcopy(applied)
    meta = config.setdefault("metadata", {})
    hint = meta.get("generation")  # an emulator subclass may have bumped it already
    for key in _SERVER_METADATA:
        meta.pop(key, None)
    config.pop("status", None)
    sent = field_paths(config)
    api_version = str(config.get("apiVersion", ""))
    if live is None:
        config["metadata"]["generation"] = 1
        config["metadata"]["managedFields"] = _managed_fields({manager: ("Apply", sent)}, api_version)
        return config
    managers = managers_of(live)
    conflicts = [(m, p) for m, (_, owned) in managers.items() if m != manager
                 for p in sorted(owned & sent, key=str)
                 if value_at(live, p) != value_at(config, p) and not isinstance(p[-1], tuple)]
    if conflicts and not force:
        raise Conflict(manager, conflicts)
    for m, p in conflicts:
        managers[m][1].discard(p)
    mine = managers.get(manager, ("Apply", set()))[1]
    others = set().union(*(owned for m, (_, owned) in managers.items() if m != manager))
    result = merge(copy.deepcopy(live), config)
    keep = sent | others
    gone = {p for p in mine - keep if not any(q[:len(p)] == p for q in keep)}
    for path in gone:
        if not any(path[:i] in gone for i in range(1, len(path))):  # an item goes whole
            _remove(result, path)
    managers[manager] = ("Apply", sent)
    md = result.setdefault("metadata", {})
    md["managedFields"] = _managed_fields(managers, api_version)
    generation = int((live.get("metadata") or {}).get("generation") or 1)
    if result.get("spec") != live.get("spec"):
        generation += 1
    md["generation"] = max(generation, int(hint or 0))
    return result


def track_update(live: dict[str, Any], new: dict[str, Any], manager: str) -> list[dict[str, Any]] | None:
    """The managedFields after a non-apply write turned ``live`` into ``new``: ``manager`` takes the
    fields whose value changed. None when ``live`` has no managedFields (never applied)."""
    managers = managers_of(live)
    if not managers:
        return None
    before, after = field_paths(live), field_paths(new)
    changed = {p for p in after if p not in before or value_at(live, p) != value_at(new, p)}
    for _, owned in managers.values():
        owned -= changed
        owned &= after
    if changed:
        op, owned = managers.get(manager, ("Update", set()))
        managers[manager] = (op, owned | changed)
    return _managed_fields(managers, str(new.get("apiVersion") or live.get("apiVersion") or ""))


def update_manager(params: Mapping[str, str], headers: Mapping[str, str]) -> str:
    """The manager of a non-apply write: its fieldManager, else its User-Agent's product."""
    agent = headers.get("User-Agent") or headers.get("user-agent") or "unknown"
    return params.get("fieldManager") or agent.split("/", 1)[0] or "unknown"
