"""CRD upgrades at operator start: Helm installs ``crds/`` once and never upgrades them.

The leader (before kopf starts) compares each installed TideMQ CRD with the one it ships
(:mod:`tidemq.operator.crds`) and applies its own when the installed one is older. What it
applies carries two annotations: ``tidemq.io/crd-version`` (the operator's version) and
``tidemq.io/crd-hash`` (a hash of the CRD's spec). The decision (:func:`decide`, pure):

- not installed: create it;
- its crd-hash annotation is our spec's hash: nothing to do (the installed spec itself is not
  hashed: the API server adds defaults to it);
- installed by a newer operator (crd-version above ours): left alone, with a log line (never
  downgrade: a newer schema may hold fields an older one would prune);
- older crd-version, the same version with another spec (a development build), or no annotation
  (installed from a chart's ``crds/`` by Helm or kubectl, which are never newer than the operator
  of the same chart): upgraded.

An upgrade is one JSON merge patch that turns the installed spec into ours exactly (keys we no
longer have are set to null) and sets the annotations; the API server keeps ``status.storedVersions``.
Errors are the caller's to report: the operator logs them and runs with the CRDs it finds.
Needs get, create and patch on customresourcedefinitions (the chart's ``operator.manageCRDs``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from tidemq.operator import crds

log = logging.getLogger(__name__)

VERSION_ANNOTATION = "tidemq.io/crd-version"
HASH_ANNOTATION = "tidemq.io/crd-hash"
_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.?dev(\d+))?$")
_PRE = {"a": 0, "b": 1, "rc": 2}


@dataclass(frozen=True, slots=True)
class Decision:
    name: str     # the CRD's name, e.g. topics.tidemq.io
    action: str   # create | upgrade | current | newer
    reason: str


def spec_hash(crd: dict[str, Any]) -> str:
    text = json.dumps(crd.get("spec") or {}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def version_key(version: str) -> tuple | None:
    """An ordering key of a PEP 440-style version (1.2.0 > 1.2.0rc1 > 1.2.0.dev3); None when it
    does not parse."""
    m = _VERSION.match(version.strip())
    if m is None:
        return None
    release = tuple(int(p) for p in m.group(1).split("."))
    release += (0,) * (6 - len(release))
    pre = (_PRE[m.group(2)], int(m.group(3))) if m.group(2) else (3, 0)
    dev = (0, int(m.group(4))) if m.group(4) is not None else (1, 0)
    if m.group(4) is not None and not m.group(2):
        pre = (-1, 0)  # 1.0.dev1 comes before 1.0a1
    return release, pre, dev


def desired(kind: str, version: str) -> dict[str, Any]:
    """The CRD of ``kind`` as the operator applies it: crds/ plus the two annotations."""
    crd = crds.load_crd(kind)
    annotations = crd.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[VERSION_ANNOTATION] = version
    annotations[HASH_ANNOTATION] = spec_hash(crd)
    return crd


def decide(installed: dict[str, Any] | None, wanted: dict[str, Any]) -> Decision:
    """What to do with the installed CRD (None: absent) given the one we ship (:func:`desired`)."""
    name = wanted["metadata"]["name"]
    ours_v = wanted["metadata"]["annotations"][VERSION_ANNOTATION]
    if installed is None:
        return Decision(name, "create", "not installed")
    annotations = (installed.get("metadata") or {}).get("annotations") or {}
    if annotations.get(HASH_ANNOTATION) == wanted["metadata"]["annotations"][HASH_ANNOTATION]:
        return Decision(name, "current", "the installed spec is ours")
    theirs_v = annotations.get(VERSION_ANNOTATION)
    if theirs_v is None:
        return Decision(name, "upgrade", "installed without a version (from a chart's crds/)")
    theirs, ours = version_key(theirs_v), version_key(ours_v)
    if theirs is not None and ours is not None and theirs > ours:
        return Decision(name, "newer", f"installed by operator {theirs_v}, newer than {ours_v}")
    if theirs == ours:
        return Decision(name, "upgrade", f"version {theirs_v} with another spec")
    return Decision(name, "upgrade", f"installed by operator {theirs_v}, older than {ours_v}")


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old:
            patch[k] = v
        elif old[k] != v:
            patch[k] = merge_patch(old[k], v)
    return patch


def upgrade_patch(installed: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    annotations = wanted["metadata"]["annotations"]
    return {"metadata": {"annotations": {k: annotations[k] for k in (VERSION_ANNOTATION, HASH_ANNOTATION)}},
            "spec": merge_patch(installed.get("spec") or {}, wanted["spec"])}


def ensure_crds(api_client: Any, version: str, timeout: float = 10.0) -> list[Decision]:
    """Create or upgrade every TideMQ CRD as :func:`decide` says (blocking: run it in a thread).
    ``api_client`` is a configured ``kubernetes.client.ApiClient``."""
    import kubernetes  # noqa: PLC0415 (optional dependency: the operator extra)

    api = kubernetes.client.ApiextensionsV1Api(api_client)
    done = []
    for kind in crds.KINDS:
        wanted = desired(kind, version)
        name = wanted["metadata"]["name"]
        try:
            # the raw JSON: the client's models would drop what they do not know
            resp: Any = api.read_custom_resource_definition(name, _request_timeout=timeout,
                                                            _preload_content=False)
            installed = json.loads(resp.data)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
            installed = None
        decision = decide(installed, wanted)
        if decision.action == "create":
            api.create_custom_resource_definition(wanted, _request_timeout=timeout)  # type: ignore[arg-type]
        elif decision.action == "upgrade":
            assert installed is not None
            api.patch_custom_resource_definition(name, upgrade_patch(installed, wanted), _request_timeout=timeout,
                                                 _content_type="application/merge-patch+json")
        level = logging.WARNING if decision.action == "newer" else logging.INFO
        log.log(level, "CRD %s: %s (%s)%s", name,
                {"create": "created", "upgrade": "upgraded", "current": "up to date",
                 "newer": "left alone"}[decision.action], decision.reason,
                "; run an operator of that version or newer" if decision.action == "newer" else "")
        done.append(decision)
    return done
