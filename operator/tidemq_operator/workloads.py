"""Desired state of a TideMQ Cluster's workloads: a Cluster custom object in, Kubernetes objects out.

Pure functions, no Kubernetes client: the operator applies what :func:`desired_objects` returns and
compares :func:`spec_hash` values to decide what changed. For a Cluster named ``c`` in namespace
``ns`` the objects are, in apply order:

- name servers: Service ``c-namesrv-headless`` (headless, publishes not-ready pods so brokers can
  resolve every name server while they start), Service ``c-namesrv`` (ClusterIP, for clients that
  want one address), PodDisruptionBudget ``c-namesrv``, StatefulSet ``c-namesrv``;
- when spec.brokers.replicas > 1: ServiceAccount ``c-broker``, Role and RoleBinding
  ``c-broker-leases`` (the election's Leases; :mod:`tidemq.operator.replication` says what else a
  replicated group changes); otherwise PodDisruptionBudget ``c-broker`` over every broker pod
  (maxUnavailable 1);
- per broker group ``i`` (0 .. spec.brokers.groups-1): ConfigMap ``c-broker-i-config`` (the
  ``broker.conf`` that ``tidemq broker --config`` reads), Service ``c-broker-i-headless``,
  PodDisruptionBudget ``c-broker-i`` (replicated groups only: replicas - minInSync), StatefulSet
  ``c-broker-i`` (broker name ``c-broker-i``, one PVC ``data`` per pod).

Invariants:
- An external Cluster (spec.external) yields no objects.
- Every object carries an owner reference to the Cluster (controller, blockOwnerDeletion), the
  ``app.kubernetes.io/*`` labels, and the annotation ``tidemq.io/spec-hash`` = ``spec_hash(obj)``.
- A broker advertises ``$(POD_NAME).c-broker-i-headless.$(POD_NAMESPACE).svc:<port>`` (stable pod
  DNS, expanded by the kubelet from downward-API env), and registers with every name-server pod
  (``--namesrv`` = :func:`name_server_address`).
- A change of a broker group's config file changes its pod template (annotation
  ``tidemq.io/config-hash``), so the StatefulSet rolls its pods one at a time (RollingUpdate,
  OrderedReady, each pod only after the previous is ready again). Rolling one broker group after
  another is the operator's job: apply a group's StatefulSet after the previous group is ready.
- No pod is covered by two PodDisruptionBudgets (the eviction API refuses such a pod): lone
  brokers share the Cluster-wide budget, a replicated group's pods only their group's.
- Placement (spec.placement): name servers keep apart from each other, lone brokers from every
  broker of the Cluster, a replicated group's replicas from each other (preferred or required
  anti-affinity on one topology key), and every pod gets the topology spread constraints over
  the same pods.
- The HTTP endpoint (/metrics, /healthz, /readyz) always runs because the probes use it;
  spec.metrics.enabled only adds the Prometheus scrape annotations.
- Ready means useful (issue 18, item 10): a broker is ready once a name server took its
  registration; a name server once one broker registration period (:func:`register_period`)
  has passed since it started (``--ready-delay``: every live broker has registered with it again
  by then) and a broker registered, or a little later with none (``--ready-grace``). Readiness,
  not minReadySeconds, is what paces the name servers' own roll: with podManagementPolicy
  Parallel the StatefulSet controller replaces the next pod as soon as the previous one is
  ready.
- Some StatefulSet fields cannot be patched (selector, serviceName, podManagementPolicy, volume
  claim templates): :func:`immutable_changes` names them so the operator can report instead of
  retrying a patch the API server refuses.
- Name-server writes are signed (:mod:`tidemq.operator.clusterkey`): broker containers get the
  Cluster key's account from the Secret ``c-namesrv-acl`` (environment), and name servers, when
  ``namesrv_acl``, mount that Secret's ``plain_acl.yml`` and run with ``--acl-file``. The Secret
  itself is not among the objects here: it is created once, never patched.
- Pods run least-privileged: no service-account token (neither server talks to the Kubernetes
  API; replicated brokers do, for their Leases only), non-root (the image's uid/gid 10001), RuntimeDefault seccomp, a read-only root filesystem
  (writable: the store volume and an emptyDir on /tmp), no privilege escalation, no capabilities.
- Defaults come from the CRD schema (crds/tidemq.io_clusters.yaml), applied here too so objects
  that skipped API-server defaulting (emulators) give the same result.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import re
from typing import Any

from tidemq.errors import ConfigError
from tidemq.operator import replication
from tidemq.operator.crds import API_VERSION, apply_defaults, openapi_schema

log = logging.getLogger(__name__)

SPEC_HASH_ANNOTATION = "tidemq.io/spec-hash"
CONFIG_HASH_ANNOTATION = "tidemq.io/config-hash"
BROKER_GROUP_LABEL = "tidemq.io/broker-group"
MANAGED_BY = "tidemq-operator"
CONFIG_FILE = "broker.conf"
CONFIG_DIR = "/etc/tidemq"
DATA_DIR = "/var/lib/tidemq"
STORE_DIR = f"{DATA_DIR}/store"
ACL_DIR = "/etc/tidemq-acl"  # spec.brokers.acl: the Secret, mounted whole so updates reach the file
ACL_KEY = "plain_acl.yml"
NAMESRV_ACL_DIR = "/etc/tidemq-namesrv-acl"  # the cluster key's plain_acl.yml (tidemq.operator.clusterkey)
# The broker's environment variables of the cluster key's account (`tidemq broker --namesrv-access-key`).
NAMESRV_KEY_ENV = {"TIDEMQ_BROKER_NAMESRV_ACCESS_KEY": "accessKey", "TIDEMQ_BROKER_NAMESRV_SECRET_KEY": "secretKey"}
TLS_DIR = "/etc/tidemq-tls"  # spec.tls: the Secret (tls.crt, tls.key, ca.crt), mounted whole so renewals reach the files
BROKER_GRACE_SECONDS = 60
NAMESRV_GRACE_SECONDS = 30
PRESTOP_SLEEP_SECONDS = 10
REGISTER_PERIOD_SECONDS = 30.0  # a broker's default registration period (registerNameServerPeriod)
# A restarted name server is ready a registration period and READY_DELAY_MARGIN later (a round's
# own duration), or, with no broker by then, a period and READY_GRACE_MARGIN later.
READY_DELAY_MARGIN = 3
READY_GRACE_MARGIN = 10
RUN_AS_ID = 10001  # the image's tidemq user and group (Dockerfile)
TMP_DIR = "/tmp"
# The CRD checks the reserved config keys and the name's length with cheap CEL rules; the formats
# (regular expressions over unbounded strings would exceed the API server's CEL cost budget) here.
CLUSTER_NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?")
CONFIG_KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")


# -- names -------------------------------------------------------------------------------------

def namesrv_name(cluster_name: str) -> str:
    """Name of the name-server StatefulSet, PDB and client Service."""
    return f"{cluster_name}-namesrv"


def namesrv_headless_name(cluster_name: str) -> str:
    """Name of the name servers' headless Service (the StatefulSet's serviceName)."""
    return f"{cluster_name}-namesrv-headless"


def broker_name(cluster_name: str, group: int) -> str:
    """RocketMQ broker name of group ``group``; also its StatefulSet and PDB name."""
    return f"{cluster_name}-broker-{group}"


def broker_headless_name(cluster_name: str, group: int) -> str:
    """Name of broker group ``group``'s headless Service."""
    return f"{broker_name(cluster_name, group)}-headless"


def broker_config_name(cluster_name: str, group: int) -> str:
    """Name of broker group ``group``'s ConfigMap."""
    return f"{broker_name(cluster_name, group)}-config"


# -- helpers -----------------------------------------------------------------------------------

def _defaulted(cluster: dict[str, Any]) -> dict[str, Any]:
    if cluster.get("kind", "Cluster") != "Cluster":
        raise ConfigError(f"expected a Cluster, got {cluster.get('kind')!r}")
    obj = copy.deepcopy({"apiVersion": API_VERSION, "kind": "Cluster", **cluster})
    spec = obj.setdefault("spec", {})
    if not spec.get("external"):
        # a managed cluster: absent sections mean "all defaults" (the CRD defaults only fields)
        for section in ("nameServers", "brokers", "metrics", "placement"):
            spec.setdefault(section, {})
        spec["brokers"].setdefault("storage", {})
    return apply_defaults(openapi_schema("Cluster"), obj)


def _meta(cluster: dict[str, Any]) -> tuple[str, str]:
    md = cluster.get("metadata") or {}
    name = md.get("name")
    if not name:
        raise ConfigError("the Cluster has no metadata.name")
    if not CLUSTER_NAME_RE.fullmatch(name):
        raise ConfigError(f"Cluster name {name!r} must be a DNS label of at most 40 characters starting with a "
                          "letter (it prefixes StatefulSet, Service and pod names)")
    return name, md.get("namespace") or "default"


def cluster_with_defaults(cluster: dict[str, Any]) -> dict[str, Any]:
    """A copy of a Cluster with the CRD's defaults applied (as the API server would)."""
    return _defaulted(cluster)


def broker_selector(cluster_name: str, group: int) -> dict[str, str]:
    """The labels that select broker group ``group``'s pods."""
    return _selector(cluster_name, "broker", group)


def cluster_identity(cluster: dict[str, Any]) -> tuple[str, str]:
    """(name, namespace) of a Cluster; ConfigError when the name is not usable."""
    return _meta(cluster)


def owned_metadata(cluster: dict[str, Any], name: str, component: str) -> dict[str, Any]:
    """Metadata of an object ``name`` the Cluster owns: namespace, labels, owner reference."""
    c = _defaulted(cluster)
    return _metadata(c, name, _labels(_meta(c)[0], component))


def _owner_ref(cluster: dict[str, Any]) -> dict[str, Any]:
    md = cluster.get("metadata") or {}
    if not md.get("uid"):
        raise ConfigError("the Cluster has no metadata.uid (owner references need it)")
    return {
        "apiVersion": API_VERSION,
        "kind": "Cluster",
        "name": md["name"],
        "uid": md["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _selector(cluster_name: str, component: str, group: int | None = None) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": "tidemq",
        "app.kubernetes.io/instance": cluster_name,
        "app.kubernetes.io/component": component,
    }
    if group is not None:
        labels[BROKER_GROUP_LABEL] = str(group)
    return labels


def _labels(cluster_name: str, component: str, group: int | None = None) -> dict[str, str]:
    return {
        **_selector(cluster_name, component, group),
        "app.kubernetes.io/part-of": "tidemq",
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def _metadata(cluster: dict[str, Any], name: str, labels: dict[str, str]) -> dict[str, Any]:
    _cname, ns = _meta(cluster)
    return {
        "name": name,
        "namespace": ns,
        "labels": dict(labels),
        "annotations": {},
        "ownerReferences": [_owner_ref(cluster)],
    }


def _hash(data: Any) -> str:
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def spec_hash(obj: dict[str, Any]) -> str:
    """A stable hash of a desired object, ignoring its own ``tidemq.io/spec-hash`` annotation and
    any status: equal hashes mean nothing to apply."""
    clean = copy.deepcopy(obj)
    clean.pop("status", None)
    annotations = (clean.get("metadata") or {}).get("annotations")
    if annotations:
        annotations.pop(SPEC_HASH_ANNOTATION, None)
    return _hash(clean)


def _stamp(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"].setdefault("annotations", {})[SPEC_HASH_ANNOTATION] = spec_hash(obj)
    return obj


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _resources(spec: dict[str, Any]) -> dict[str, Any]:
    res = spec.get("resources") or {}
    return {k: dict(res[k]) for k in ("requests", "limits") if res.get(k)}


def _placement(spec: dict[str, Any], apart: dict[str, str], spread: dict[str, str] | None = None) -> dict[str, Any]:
    """The pod-spec fields of spec.placement: anti-affinity among the pods ``apart`` selects, and
    topology spread constraints over the same pods. ``spread`` (a replicated group's component)
    adds a weaker preference that keeps different groups apart too.

    Preferred anti-affinity still lets a one-node cluster schedule every pod; required keeps a
    pod Pending instead, so one node never holds two pods ``apart`` selects."""
    p = spec["placement"]
    term = {"labelSelector": {"matchLabels": dict(apart)}, "topologyKey": p["antiAffinityTopologyKey"]}
    preferred = [] if p["antiAffinity"] == "required" else [{"weight": 100, "podAffinityTerm": term}]
    if spread is not None:
        preferred.append({"weight": 50, "podAffinityTerm": {
            "labelSelector": {"matchLabels": dict(spread)}, "topologyKey": p["antiAffinityTopologyKey"]}})
    anti: dict[str, Any] = {}
    if p["antiAffinity"] == "required":
        anti["requiredDuringSchedulingIgnoredDuringExecution"] = [term]
    if preferred:
        anti["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    out: dict[str, Any] = {"affinity": {"podAntiAffinity": anti}}
    if p["topologySpread"]:
        out["topologySpreadConstraints"] = [
            {"maxSkew": t["maxSkew"], "topologyKey": t["topologyKey"], "whenUnsatisfiable": t["whenUnsatisfiable"],
             "labelSelector": {"matchLabels": dict(apart)}}
            for t in p["topologySpread"]]
    return out


def _downward_env() -> list[dict[str, Any]]:
    return [
        {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}
        for name, path in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"), ("POD_IP", "status.podIP"))
    ]


def _pod_security() -> dict[str, Any]:
    """Pod-level fields shared by name-server and broker pods (see the module invariants)."""
    return {
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_ID,
            "runAsGroup": RUN_AS_ID,
            "fsGroup": RUN_AS_ID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


TMP_VOLUME = {"name": "tmp", "emptyDir": {}}
TMP_MOUNT = {"name": "tmp", "mountPath": TMP_DIR}


def _tls(spec: dict[str, Any]) -> tuple[str, bool]:
    """(remoting TLS mode, metrics over HTTPS) of spec.tls."""
    tls = spec.get("tls") or {}
    return tls.get("mode") or "disabled", bool(tls.get("metrics"))


def _tls_args(spec: dict[str, Any]) -> list[str]:
    mode, metrics = _tls(spec)
    if mode == "disabled" and not metrics:
        return []
    args = ["--tls-mode", mode, "--tls-cert-file", f"{TLS_DIR}/tls.crt",
            "--tls-key-file", f"{TLS_DIR}/tls.key", "--tls-ca-file", f"{TLS_DIR}/ca.crt"]
    return args + (["--metrics-tls"] if metrics else [])


def _add_tls(spec: dict[str, Any], container: dict[str, Any], template: dict[str, Any]) -> None:
    """Mount spec.tls's Secret and pass the TLS flags (nothing when TLS is off)."""
    args = _tls_args(spec)
    if not args:
        return
    container["args"] += args
    container.setdefault("volumeMounts", []).append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
    # owner and fsGroup may read the key, nobody else (the pod runs as RUN_AS_ID)
    template["spec"].setdefault("volumes", []).append(
        {"name": "tls", "secret": {"secretName": spec["tls"]["secretName"], "defaultMode": 0o440}})
    annotations = template["metadata"].get("annotations")
    if _tls(spec)[1] and annotations and "prometheus.io/scrape" in annotations:
        annotations["prometheus.io/scheme"] = "https"


def _probes(port_name: str, https: bool = False) -> dict[str, Any]:
    def get(path: str) -> dict[str, Any]:
        return {"path": path, "port": port_name, "scheme": "HTTPS" if https else "HTTP"}

    return {
        # the HTTP endpoint starts after the store recovered: give recovery up to 10 minutes
        "startupProbe": {"httpGet": get("/healthz"), "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 120},
        "livenessProbe": {"httpGet": get("/healthz"), "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
        "readinessProbe": {"httpGet": get("/readyz"), "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3},
    }


def _scrape_annotations(enabled: bool, port: int) -> dict[str, str]:
    if not enabled:
        return {}
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}


def _service(cluster: dict[str, Any], name: str, labels: dict[str, str], selector: dict[str, str],
             ports: list[tuple[str, int]], headless: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": dict(selector),
        "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in ports],
    }
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = True  # stable pod DNS names resolve while pods start
    else:
        spec["type"] = "ClusterIP"
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(cluster, name, labels), "spec": spec}


def _pdb(cluster: dict[str, Any], name: str, labels: dict[str, str], selector: dict[str, str],
         max_unavailable: int = 1) -> dict[str, Any]:
    # maxUnavailable, not minAvailable: a one-pod StatefulSet must not block node drains forever.
    # A replicated group passes replicas - minInSync (tidemq.operator.replication); lone brokers
    # share one budget of 1 over the Cluster's brokers.
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(cluster, name, labels),
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": dict(selector)}},
    }


# -- public API --------------------------------------------------------------------------------

def name_server_address(cluster: dict[str, Any]) -> str:
    """The name server address (``ADDR;ADDR...``) of a Cluster: spec.external.nameServers for an
    external cluster, else every name-server pod's stable DNS name and port."""
    spec = _defaulted(cluster)["spec"]
    external = spec.get("external")
    if external:
        return ";".join(external["nameServers"])
    name, ns = _meta(cluster)
    replicas, port = spec["nameServers"]["replicas"], spec["nameServers"]["port"]
    headless = namesrv_headless_name(name)
    return ";".join(f"{namesrv_name(name)}-{i}.{headless}.{ns}.svc:{port}" for i in range(replicas))


def broker_config_text(cluster: dict[str, Any], group: int) -> str:
    """The ``broker.conf`` (RocketMQ key=value form) of broker group ``group``.

    Extra settings from spec.brokers.config come first (sorted), the operator's own keys last;
    the CRD refuses extra keys that would collide with them.
    """
    c = _defaulted(cluster)
    name, ns = _meta(c)
    if c["spec"].get("external"):
        raise ConfigError(f"Cluster {ns}/{name} runs no brokers (spec.external)")
    b = c["spec"]["brokers"]
    lines = [f"# Generated by the TideMQ operator from Cluster {ns}/{name}: edit the Cluster, not this file."]
    for key in sorted(b.get("config") or {}):
        value = str(b["config"][key])
        if not CONFIG_KEY_RE.fullmatch(key) or "\n" in value or "\r" in value:
            raise ConfigError(f"spec.brokers.config: {key!r}={value!r} cannot be written as a broker.conf line")
        lines.append(f"{key}={value}")
    lines += [
        f"brokerClusterName={name}",
        f"brokerName={broker_name(name, group)}",
        f"flushDiskType={'SYNC_FLUSH' if b['flushMode'] == 'sync' else 'ASYNC_FLUSH'}",
        f"mappedFileSizeCommitLog={int(b['segmentSize'])}",
        f"fileReservedTime={_number(b['retentionHours'])}",
    ]
    return "\n".join(lines) + "\n"


def register_period(brokers: dict[str, Any]) -> float:
    """Seconds between a broker's registrations: spec.brokers.config's registerNameServerPeriod
    (milliseconds, as in RocketMQ) or register-interval (seconds), else the brokers' default. A
    value that is no positive number counts as the default (the broker refuses it at start)."""
    config = brokers.get("config") or {}
    for key, scale in (("registerNameServerPeriod", 1000.0), ("register-interval", 1.0), ("register_interval", 1.0)):
        if key in config:
            try:
                seconds = float(config[key]) / scale
            except ValueError:
                break
            if math.isfinite(seconds) and seconds > 0:
                return seconds
            break
    return REGISTER_PERIOD_SECONDS


def namesrv_key_secret_name(cluster_name: str) -> str:
    """The Secret holding the Cluster key (tidemq.operator.clusterkey)."""
    return f"{cluster_name}-namesrv-acl"


def _namesrv_key_env(cluster_name: str) -> list[dict[str, Any]]:
    """The broker's name-server credentials, from the Cluster key Secret."""
    secret = namesrv_key_secret_name(cluster_name)
    return [
        {"name": env, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for env, key in NAMESRV_KEY_ENV.items()
    ]


def _namesrv_objects(c: dict[str, Any], namesrv_acl: bool = True) -> list[dict[str, Any]]:
    name, _ns = _meta(c)
    spec = c["spec"]
    n = spec["nameServers"]
    port, mport, replicas = n["port"], n["metricsPort"], n["replicas"]
    labels = _labels(name, "namesrv")
    selector = _selector(name, "namesrv")
    ports = [("remoting", port), ("metrics", mport)]
    period = register_period(spec["brokers"])
    container: dict[str, Any] = {
        "name": "namesrv",
        "image": spec["image"],
        "imagePullPolicy": spec["imagePullPolicy"],
        "command": ["tidemq", "namesrv"],
        "args": ["--listen", f"0.0.0.0:{port}", "--metrics-listen", f"0.0.0.0:{mport}",
                 "--ready-delay", _number(period + READY_DELAY_MARGIN),
                 "--ready-grace", _number(period + READY_GRACE_MARGIN)],
        "env": _downward_env(),
        "ports": [{"name": pn, "containerPort": p, "protocol": "TCP"} for pn, p in ports],
        **_probes("metrics", https=_tls(spec)[1]),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
        "securityContext": _container_security(),
        "volumeMounts": [dict(TMP_MOUNT)],
    }
    if _resources(n):
        container["resources"] = _resources(n)
    sts: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(c, namesrv_name(name), labels),
        "spec": {
            "serviceName": namesrv_headless_name(name),
            "replicas": replicas,
            "podManagementPolicy": "Parallel",  # name servers are independent of each other
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "minReadySeconds": 5,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": dict(labels), "annotations": _scrape_annotations(spec["metrics"]["enabled"], mport)},
                "spec": {
                    "terminationGracePeriodSeconds": NAMESRV_GRACE_SECONDS,
                    "enableServiceLinks": False,
                    **_placement(spec, selector),
                    **_pod_security(),
                    "containers": [container],
                    "volumes": [dict(TMP_VOLUME)],
                },
            },
        },
    }
    _add_tls(spec, container, sts["spec"]["template"])
    if namesrv_acl:  # only the plain_acl.yml of the Secret; owner and fsGroup may read it
        container["args"] += ["--acl-file", f"{NAMESRV_ACL_DIR}/plain_acl.yml"]
        container["volumeMounts"].append({"name": "namesrv-acl", "mountPath": NAMESRV_ACL_DIR, "readOnly": True})
        sts["spec"]["template"]["spec"]["volumes"].append(
            {"name": "namesrv-acl", "secret": {"secretName": namesrv_key_secret_name(name), "defaultMode": 0o440,
                                               "items": [{"key": "plain_acl.yml", "path": "plain_acl.yml"}]}})
    return [
        _service(c, namesrv_headless_name(name), labels, selector, ports, headless=True),
        _service(c, namesrv_name(name), labels, selector, [("remoting", port)], headless=False),
        _pdb(c, namesrv_name(name), labels, selector),
        sts,
    ]


def _broker_objects(c: dict[str, Any], group: int, namesrv_addr: str, signing: bool = True) -> list[dict[str, Any]]:
    name, _ns = _meta(c)
    spec = c["spec"]
    b = spec["brokers"]
    port, mport = b["port"], spec["metrics"]["port"]
    labels = _labels(name, "broker", group)
    selector = _selector(name, "broker", group)
    conf = broker_config_text(c, group)
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(c, broker_config_name(name, group), labels),
        "data": {CONFIG_FILE: conf},
    }
    headless = broker_headless_name(name, group)
    ports = [("remoting", port), ("metrics", mport)]
    container: dict[str, Any] = {
        "name": "broker",
        "image": spec["image"],
        "imagePullPolicy": spec["imagePullPolicy"],
        "command": ["tidemq", "broker"],
        "args": [
            "--config", f"{CONFIG_DIR}/{CONFIG_FILE}",
            "--namesrv", namesrv_addr,
            "--listen", f"0.0.0.0:{port}",
            "--advertise", f"$(POD_NAME).{headless}.$(POD_NAMESPACE).svc:{port}",
            "--store", STORE_DIR,
            "--metrics-listen", f"0.0.0.0:{mport}",
        ],
        "env": _downward_env() + (_namesrv_key_env(name) if signing else []),
        "ports": [{"name": pn, "containerPort": p, "protocol": "TCP"} for pn, p in ports],
        **_probes("metrics", https=_tls(spec)[1]),
        # The broker unregisters from the name servers and flushes on SIGTERM; the sleep first lets
        # endpoint removal propagate, the grace period bounds the flush.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_SECONDS)]}}},
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_DIR},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            dict(TMP_MOUNT),
        ],
    }
    if _resources(b):
        container["resources"] = _resources(b)
    acl = b.get("acl")
    if acl:
        container["args"] += ["--acl-file", f"{ACL_DIR}/{acl.get('key') or ACL_KEY}"]
        container["volumeMounts"].append({"name": "acl", "mountPath": ACL_DIR, "readOnly": True})
    pod_annotations = {
        **_scrape_annotations(spec["metrics"]["enabled"], mport),
        CONFIG_HASH_ANNOTATION: _hash(cm["data"]),
    }
    pvc_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": b["storage"]["size"]}},
    }
    if b["storage"].get("storageClassName"):
        pvc_spec["storageClassName"] = b["storage"]["storageClassName"]
    sts: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(c, broker_name(name, group), labels),
        "spec": {
            "serviceName": headless,
            "replicas": b["replicas"],
            "podManagementPolicy": "OrderedReady",
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "minReadySeconds": 10,
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": dict(labels), "annotations": pod_annotations},
                "spec": {
                    "terminationGracePeriodSeconds": BROKER_GRACE_SECONDS,
                    "enableServiceLinks": False,
                    **_placement(spec, *_broker_apart(name, group, b)),
                    **_pod_security(),
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": cm["metadata"]["name"]}},
                                dict(TMP_VOLUME)],
                },
            },
            "volumeClaimTemplates": [{
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data", "labels": dict(selector)},
                "spec": pvc_spec,
            }],
        },
    }
    _add_tls(spec, container, sts["spec"]["template"])
    if _tls(spec)[0] != "disabled":
        container["args"].append("--namesrv-tls")
    if acl:  # owner and fsGroup may read it, nobody else (the pod runs as RUN_AS_ID)
        sts["spec"]["template"]["spec"]["volumes"].append(
            {"name": "acl", "secret": {"secretName": acl["secretName"], "defaultMode": 0o440}})
    service = _service(c, headless, labels, selector, ports, headless=True)
    rspec = replication.replication_spec(b)
    replication.apply_to_broker(rspec, name, port, container, sts["spec"]["template"]["spec"], sts["spec"], service)
    # a lone broker's disruption budget spans the Cluster's brokers (brokers_budget)
    budget = [_pdb(c, broker_name(name, group), labels, selector, rspec.max_unavailable)] if rspec.replicated else []
    return [cm, service, *budget, sts]


def _broker_apart(cluster_name: str, group: int, brokers: dict[str, Any]) -> tuple[dict[str, str], dict[str, str] | None]:
    """(the pods a broker keeps apart from, the pods it prefers to be apart from as well): a
    replicated group's replicas from each other (then the other groups, more weakly), a lone
    broker from every other broker of the Cluster."""
    if replication.replication_spec(brokers).replicated:
        return _selector(cluster_name, "broker", group), _selector(cluster_name, "broker")
    return _selector(cluster_name, "broker"), None


def brokers_budget_name(cluster_name: str) -> str:
    """Name of the one PodDisruptionBudget over every broker pod of a Cluster of lone brokers."""
    return f"{cluster_name}-broker"


def desired_objects(cluster: dict[str, Any], namesrv_acl: bool = True, broker_signing: bool = True) -> list[dict[str, Any]]:
    """Every Kubernetes object a Cluster needs, in apply order (see the module docstring).

    ``cluster`` is the Cluster custom object (metadata with name, namespace and uid; spec).
    ``broker_signing``: brokers sign their registrations with the Cluster key (its Secret must
    exist); ``namesrv_acl``: name servers also require signed writes (only with
    ``broker_signing``; see :func:`tidemq.operator.clusterkey.namesrv_acl_ready`).
    An external Cluster yields ``[]``. Raises ConfigError when metadata.name or uid is missing.
    """
    c = _defaulted(cluster)
    spec = c["spec"]
    if spec.get("external"):
        return []
    _owner_ref(c)  # fail early without a uid
    objs = _namesrv_objects(c, namesrv_acl and broker_signing)
    addr = name_server_address(c)
    name = _meta(c)[0]
    if replication.replication_spec(spec["brokers"]).replicated:  # before the first broker group
        objs += replication.rbac_objects(lambda n: _metadata(c, n, _labels(name, "broker")), name)
    else:
        # Lone brokers: one budget over all of them, so a node drain evicts one broker of the
        # Cluster at a time (a budget per group let it evict every group's only pod at once).
        objs.append(_pdb(c, brokers_budget_name(name), _labels(name, "broker"), _selector(name, "broker")))
    for group in range(spec["brokers"]["groups"]):
        objs += _broker_objects(c, group, addr, broker_signing)
    return [_stamp(o) for o in objs]


# StatefulSet fields the API server refuses to change after creation.
_IMMUTABLE_STS_FIELDS = ("selector", "serviceName", "podManagementPolicy", "volumeClaimTemplates")


def immutable_changes(live: dict[str, Any], desired: dict[str, Any]) -> list[str]:
    """Fields of a StatefulSet that differ between the live object and the desired one but cannot
    be patched (the API server refuses them): a change of storage size or class, for instance.

    Returns ``spec.<field>`` paths (empty when a patch can apply). For volumeClaimTemplates only
    what this module sets is compared (name, storage request, class, access modes), since the
    API server adds defaults to the live templates.
    """
    if live.get("kind") != "StatefulSet" or desired.get("kind") != "StatefulSet":
        return []
    out = []
    ls, ds = live.get("spec") or {}, desired.get("spec") or {}
    for field in _IMMUTABLE_STS_FIELDS:
        if field not in ds or field not in ls:
            continue
        if field == "volumeClaimTemplates":
            if _vct_shape(ls[field], ds[field]) != _vct_shape(ds[field], ds[field]):
                out.append(f"spec.{field}")
        elif ls[field] != ds[field]:
            out.append(f"spec.{field}")
    return out


def _vct_shape(vcts: list[dict[str, Any]], desired: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What this module sets in volume claim templates; a class counts only where the desired
    template names one (the API server fills in the default class otherwise)."""
    out = []
    for i, v in enumerate(vcts):
        spec = v.get("spec") or {}
        want = (desired[i].get("spec") or {}) if i < len(desired) else {}
        out.append((
            (v.get("metadata") or {}).get("name"),
            str((spec.get("resources") or {}).get("requests", {}).get("storage")),
            spec.get("storageClassName") if "storageClassName" in want else None,
            tuple(spec.get("accessModes") or ()),
        ))
    return out


def image_version(image: str) -> str:
    """The tag of an image reference (``repo/tidemq:0.4`` -> ``0.4``; a digest or no tag -> the
    reference itself, ``latest`` when there is nothing after the name)."""
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        return last.split(":", 1)[1]
    return image.split("@", 1)[1] if "@" in image else "latest"


def _pod_address(name: str, ns: str, group: int, ordinal: int, port: int) -> str:
    return f"{broker_name(name, group)}-{ordinal}.{broker_headless_name(name, group)}.{ns}.svc:{port}"


def broker_pod_address(cluster: dict[str, Any], group: int, ordinal: int) -> str:
    """The address broker pod ``ordinal`` of group ``group`` advertises (``--advertise``)."""
    c = _defaulted(cluster)
    name, ns = _meta(c)
    return _pod_address(name, ns, group, ordinal, c["spec"]["brokers"]["port"])


def broker_addresses(cluster: dict[str, Any], masters: dict[str, int | None] | None = None) -> list[dict[str, Any]]:
    """Every broker pod of a managed Cluster: name (RocketMQ brokerName), brokerId, address (the
    stable pod DNS name it advertises, see ``--advertise``) and version (the image tag the
    StatefulSet runs). An external Cluster yields ``[]``.

    brokerId is the pod's ordinal for a lone broker; a replica of a replicated group registers 0
    while it is master and its replica id + 1 otherwise, so ``masters`` (broker name -> the
    master's replica id, None when there is none, as the replicas report it) decides."""
    c = _defaulted(cluster)
    spec = c["spec"]
    if spec.get("external"):
        return []
    name, ns = _meta(c)
    b = spec["brokers"]
    replicated = replication.replication_spec(b).replicated
    version = image_version(spec["image"])

    def broker_id(group: int, ordinal: int) -> int:
        if not replicated:
            return ordinal
        return 0 if (masters or {}).get(broker_name(name, group)) == ordinal else ordinal + 1

    return [
        {"name": broker_name(name, g), "brokerId": broker_id(g, i), "version": version,
         "address": _pod_address(name, ns, g, i, b["port"])}
        for g in range(b["groups"]) for i in range(b["replicas"])
    ]
