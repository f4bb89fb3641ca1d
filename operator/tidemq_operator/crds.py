"""The TideMQ CustomResourceDefinitions (crds/*.yaml), and offline admission of custom objects.

The YAML files in the repository's ``crds/`` folder are the one source of truth; this module only
reads them. :func:`admit` does offline what the API server does on create/update — structural
defaulting, then OpenAPI schema validation, then the CRD's CEL rules (``x-kubernetes-validations``,
transition rules only when an old object is given) — so that tests against an API emulator without
admission (kmock) and the operator itself can refuse what a real API server would refuse.

Invariants: nothing here talks to Kubernetes; inputs are never mutated (defaulting returns a copy);
CEL rules are evaluated with ``cel-python`` when it is installed, and skipped (reported by
:func:`cel_available`) when it is not.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    import celpy

log = logging.getLogger(__name__)

GROUP = "tidemq.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KINDS = ("Cluster", "Topic", "ConsumerGroup")
PLURALS = {"Cluster": "clusters", "Topic": "topics", "ConsumerGroup": "consumergroups"}


def crd_dir() -> Path:
    """The folder holding the CRD manifests: the repository's ``crds/`` (this file is
    ``operator/tidemq_operator/crds.py``), or, installed, the copy the Dockerfile puts next to it."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parents[1] / "crds", here / "crds"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no crds/ folder next to {here}")


def crd_path(kind: str) -> Path:
    """Path of the CRD manifest of ``kind`` (Cluster, Topic or ConsumerGroup)."""
    if kind not in PLURALS:
        raise KeyError(f"unknown TideMQ kind {kind!r}")
    return crd_dir() / f"{GROUP}_{PLURALS[kind]}.yaml"


@functools.cache
def _load(kind: str) -> dict[str, Any]:
    return yaml.safe_load(crd_path(kind).read_text(encoding="utf-8"))


def load_crd(kind: str) -> dict[str, Any]:
    """The CRD manifest of ``kind`` as a dict (a fresh copy)."""
    return copy.deepcopy(_load(kind))


def openapi_schema(kind: str, version: str = VERSION) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of ``kind`` at ``version`` (a fresh copy)."""
    for v in _load(kind)["spec"]["versions"]:
        if v["name"] == version:
            return copy.deepcopy(v["schema"]["openAPIV3Schema"])
    raise KeyError(f"{kind} has no version {version!r}")


def to_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A structural schema as plain JSON Schema: the ``x-kubernetes-*`` keys dropped.

    ``x-kubernetes-preserve-unknown-fields`` needs no translation (JSON Schema allows unknown
    properties unless told otherwise); int-or-string fields already carry their ``anyOf``.
    """
    if isinstance(schema, dict):
        return {k: to_json_schema(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if isinstance(schema, list):
        return [to_json_schema(v) for v in schema]
    return schema


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """``obj`` with the schema's defaults filled in, as the API server does (returns a copy).

    A default applies to a missing property of an object that exists; defaults inside a default
    are applied too; arrays default their items.
    """
    obj = copy.deepcopy(obj)
    _default_into(schema, obj)
    return obj


def _default_into(schema: dict[str, Any], obj: Any) -> None:
    if isinstance(obj, dict):
        props = schema.get("properties") or {}
        for name, sub in props.items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                _default_into(sub, obj[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name, value in obj.items():
                if name not in props:
                    _default_into(extra, value)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            _default_into(schema["items"], item)


def cel_available() -> bool:
    """Whether CEL rules can be evaluated here (the ``cel-python`` package is installed)."""
    return importlib.util.find_spec("celpy") is not None


def iter_cel_rules(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every ``x-kubernetes-validations`` rule of a schema, with the JSON path it applies at."""
    for rule in schema.get("x-kubernetes-validations", ()):
        yield path or ".", rule
    for name, sub in (schema.get("properties") or {}).items():
        yield from iter_cel_rules(sub, f"{path}.{name}")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from iter_cel_rules(schema["additionalProperties"], f"{path}[*]")
    if isinstance(schema.get("items"), dict):
        yield from iter_cel_rules(schema["items"], f"{path}[*]")


@functools.cache
def _cel_program(rule: str) -> celpy.Runner:
    import celpy  # noqa: PLC0415 (optional: cel-python comes with the test extra, see cel_available)

    env = celpy.Environment()
    return env.program(env.compile(rule))


def _cel_check(schema: dict[str, Any], new: Any, old: Any, has_old: bool, path: str, errors: list[str]) -> None:
    import celpy  # noqa: PLC0415 (optional: cel-python comes with the test extra, see cel_available)

    for rule in schema.get("x-kubernetes-validations", ()):
        text = rule["rule"]
        if "oldSelf" in text and not has_old:
            continue  # a transition rule: only on updates where the old value exists
        act = {"self": celpy.json_to_cel(new)}
        if has_old:
            act["oldSelf"] = celpy.json_to_cel(old)
        try:
            ok: object = _cel_program(text).evaluate(act)
        except celpy.CELEvalError as exc:  # no such key etc.: the API server refuses too
            ok = False
            log.debug("CEL rule %r failed to evaluate at %s: %s", text, path, exc)
        if not (isinstance(ok, (bool, celpy.celtypes.BoolType)) and bool(ok)):
            errors.append(f"{path or '.'}: {rule.get('message') or 'failed rule: ' + text}")
    if isinstance(new, dict):
        props = schema.get("properties") or {}
        for name, sub in props.items():
            if name in new:
                o_has = has_old and isinstance(old, dict) and name in old
                _cel_check(sub, new[name], old[name] if o_has else None, o_has, f"{path}.{name}", errors)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name, value in new.items():
                if name not in props:
                    o_has = has_old and isinstance(old, dict) and name in old
                    _cel_check(extra, value, old[name] if o_has else None, o_has, f"{path}[{name}]", errors)
    elif isinstance(new, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(new):  # list items are not correlated with the old list here
            _cel_check(schema["items"], item, None, False, f"{path}[{i}]", errors)


def admit(obj: dict[str, Any], old: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Default and validate a TideMQ custom object as the API server would.

    Returns the defaulted object and a list of error messages (empty when the object would be
    accepted). ``old`` is the stored object on an update (enables transition rules such as
    "clusterRef is immutable"). Status is validated like the rest of the object.
    """
    import jsonschema  # noqa: PLC0415 (optional: jsonschema comes with the test extra, not the operator's)

    kind = obj.get("kind")
    if kind not in PLURALS:
        return obj, [f"kind: not a TideMQ kind: {kind!r}"]
    if obj.get("apiVersion") != API_VERSION:
        return obj, [f"apiVersion: expected {API_VERSION}, got {obj.get('apiVersion')!r}"]
    schema = openapi_schema(kind)
    new = apply_defaults(schema, obj)
    errors = [
        f"{'.' + '.'.join(str(p) for p in e.absolute_path) if e.absolute_path else '.'}: {e.message}"
        for e in sorted(jsonschema.Draft7Validator(to_json_schema(schema)).iter_errors(new), key=lambda e: list(map(str, e.absolute_path)))
    ]
    if not errors and cel_available():
        old_d = apply_defaults(schema, old) if old is not None else None
        _cel_check(schema, new, old_d, old is not None, "", errors)
    return new, errors
