"""The cluster key: name-server write protection for every Cluster the operator runs (pure).

TideMQ name servers started with ``--acl-file`` accept route changes (REGISTER_BROKER,
UNREGISTER_BROKER, WIPE_WRITE_PERM_OF_BROKER, DELETE_TOPIC_IN_NAMESRV ...) only when signed by an
admin account of that file (:mod:`tidemq.namesrv.acl`). For a managed Cluster ``c`` the operator
creates, once, the Secret ``c-namesrv-acl`` (owned by the Cluster) holding one such account:

- ``plain_acl.yml``: mounted into the name-server pods, passed as ``--acl-file``;
- ``accessKey`` / ``secretKey``: given to the broker pods as ``TIDEMQ_BROKER_NAMESRV_ACCESS_KEY`` /
  ``TIDEMQ_BROKER_NAMESRV_SECRET_KEY`` (environment from the Secret), so brokers sign their
  registrations; the operator signs its own name-server writes (topic deletion) with it.

Invariants:

- The operator never reads a Secret (its RBAC has no ``get`` on Secrets): the account is derived,
  ``HMAC-SHA256(master key, namespace/name)``, from the operator's master key (a file, mounted by
  the chart from the Secret the operator creates at its first start), so the operator knows every
  cluster's key without reading it back.
- Secrets are only ever created, never patched: a cluster key is not rotated silently (delete the
  Secret and restart the Cluster's pods to rotate it; a new master key changes only the Secrets
  created afterwards).
- Turning protection on never drops brokers out of the routes: the name servers get
  ``--acl-file`` only when every existing broker StatefulSet runs pods that already sign
  (:func:`namesrv_acl_ready`); a new Cluster gets it at once, and once on it stays on.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tidemq.operator import workloads as w
from tidemq.operator.rollout import sts_state

MASTER_KEY = "masterKey"  # the key of the master Secret (and the file name it is mounted as)
ACCESS_KEY, SECRET_KEY, ACL_FILE = "accessKey", "secretKey", "plain_acl.yml"
MIN_MASTER_BYTES = 32
ENFORCED, PENDING, OFF = "Enforced", "Pending", "Off"  # status.nameServerWriteProtection


secret_name = w.namesrv_key_secret_name


def derive_credentials(master: bytes, namespace: str, name: str) -> tuple[str, str]:
    """(access key, secret key) of Cluster ``namespace/name`` under ``master``."""
    digest = hmac.new(master, f"tidemq-cluster-key\0{namespace}\0{name}".encode(), hashlib.sha256).digest()
    return f"tidemq-cluster-{name}", base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def plain_acl_yml(cluster: str, namespace: str, access_key: str, secret_key: str) -> str:
    """RocketMQ's plain_acl.yml with the one admin account (JSON strings are YAML strings)."""
    return (
        f"# Generated once by the TideMQ operator for Cluster {namespace}/{cluster}: the account\n"
        f"# brokers and the operator sign name-server writes with. Never rotated automatically.\n"
        f"accounts:\n"
        f"  - accessKey: {json.dumps(access_key)}\n"
        f"    secretKey: {json.dumps(secret_key)}\n"
        f"    admin: true\n"
    )


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")


def cluster_key_secret(cluster: dict[str, Any], credentials: tuple[str, str]) -> dict[str, Any]:
    """The Cluster's key Secret, owned by the Cluster (removed with it)."""
    name, ns = w.cluster_identity(cluster)
    ak, sk = credentials
    meta = w.owned_metadata(cluster, secret_name(name), "namesrv-acl")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {ACCESS_KEY: _b64(ak), SECRET_KEY: _b64(sk), ACL_FILE: _b64(plain_acl_yml(name, ns, ak, sk))},
    }


def master_key_secret(name: str, namespace: str, token: Callable[[int], bytes] = secrets.token_bytes) -> dict[str, Any]:
    """The operator's master key Secret (created at its first start, never changed)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "tidemq", "app.kubernetes.io/part-of": "tidemq",
                                "app.kubernetes.io/component": "cluster-key",
                                "app.kubernetes.io/managed-by": w.MANAGED_BY}},
        "type": "Opaque",
        "data": {MASTER_KEY: base64.b64encode(base64.urlsafe_b64encode(token(MIN_MASTER_BYTES))).decode("ascii")},
    }


def read_master_key(path: str | Path) -> bytes | None:
    """The master key from its file; None while it is missing or too short (not projected yet)."""
    try:
        data = Path(path).read_bytes().strip()
    except OSError:
        return None
    return data if len(data) >= MIN_MASTER_BYTES else None


def _args(sts: Mapping[str, Any] | None) -> list[str]:
    containers = (((sts or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
    return [str(a) for c in containers for a in (c.get("args") or [])]


def _env_names(sts: Mapping[str, Any]) -> set[str]:
    containers = ((sts.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
    return {e.get("name") for c in containers for e in (c.get("env") or [])}


def namesrv_acl_ready(cluster_name: str, live: Mapping[str, Mapping[str, Any] | None]) -> bool:
    """Whether the name servers of ``cluster_name`` may require signed writes now, given the live
    StatefulSets (name -> API JSON, None when missing): on a first install (none exists), when the
    name servers already do, or when every existing broker StatefulSet is settled with pods that
    carry the credentials (so no broker's registration would be refused)."""
    present = {n: o for n, o in live.items() if o is not None}
    if not present:
        return True
    if "--acl-file" in _args(present.get(w.namesrv_name(cluster_name))):
        return True
    brokers = [o for n, o in present.items() if n != w.namesrv_name(cluster_name)]
    return all(set(w.NAMESRV_KEY_ENV) <= _env_names(o) and sts_state(o).settled for o in brokers)
