"""The CRDs in crds/: valid apiextensions.k8s.io/v1 manifests, examples that validate, defaults,
refusals of bad specs, and the CEL rules (evaluated with cel-python, as the API server would)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tidemq.operator import crds

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "crds" / "examples").glob("*.yaml"))
K8S_VERSION = "1.30"


def _example(name: str) -> dict:
    return yaml.safe_load((ROOT / "crds" / "examples" / name).read_text())


def _topic(**spec) -> dict:
    return {"apiVersion": crds.API_VERSION, "kind": "Topic", "metadata": {"name": "t1"},
            "spec": {"clusterRef": {"name": "demo"}, **spec}}


def _group(**spec) -> dict:
    return {"apiVersion": crds.API_VERSION, "kind": "ConsumerGroup", "metadata": {"name": "g1"},
            "spec": {"clusterRef": {"name": "demo"}, **spec}}


def _cluster(name: str = "demo", **spec) -> dict:
    return {"apiVersion": crds.API_VERSION, "kind": "Cluster", "metadata": {"name": name}, "spec": spec}


# -- the manifests ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", crds.KINDS)
def test_crd_is_a_valid_apiextensions_v1_object(kind):
    crd = crds.load_crd(kind)
    kubernetes_validate.validate(crd, K8S_VERSION, strict=True)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == f"{crds.PLURALS[kind]}.tidemq.io"
    spec = crd["spec"]
    assert spec["group"] == "tidemq.io" and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == kind and spec["names"]["categories"] == ["tidemq"]
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"]["status"] == {}


def test_the_repository_root_on_sys_path_does_not_shadow_the_stdlib_operator():
    """operator/ holds no __init__.py (the package is operator/tidemq_operator/): with the root first
    on sys.path it is at most a namespace portion, and the standard library's module wins."""
    code = ("import sys, operator; operator.eq; print(operator.__file__)\n"
            "import tidemq, tidemq.operator; print(tidemq.operator.__file__)\n"
            "print(sys.path[1])")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    std, ours, path1 = proc.stdout.splitlines()
    assert Path(path1) == ROOT  # PYTHONPATH: the root comes before the standard library
    assert not Path(std).is_relative_to(ROOT) and std.endswith("operator.py")
    assert Path(ours) == ROOT / "operator" / "tidemq_operator" / "__init__.py"
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_crd_files_are_the_ones_on_disk():
    assert crds.crd_path("Topic") == ROOT / "crds" / "tidemq.io_topics.yaml"
    assert sorted(p.name for p in (ROOT / "crds").glob("*.yaml")) == sorted(crds.crd_path(k).name for k in crds.KINDS)
    with pytest.raises(KeyError):
        crds.crd_path("Kafka")


def test_short_names_and_printer_columns():
    names = {k: crds.load_crd(k)["spec"]["names"]["shortNames"] for k in crds.KINDS}
    assert names == {"Cluster": ["tmqc"], "Topic": ["tmqt"], "ConsumerGroup": ["tmqg"]}

    def columns(kind):
        return {c["name"]: c["jsonPath"] for c in crds.load_crd(kind)["spec"]["versions"][0]["additionalPrinterColumns"]}

    topic = columns("Topic")
    assert list(topic) == ["Cluster", "Topic", "Read", "Write", "Ready", "Age"]
    assert topic["Read"] == ".spec.readQueueNums" and topic["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    group = columns("ConsumerGroup")
    assert group["Lag"] == ".status.totalLag" and "Consumers" in group
    assert columns("Cluster")["Name Servers"] == ".status.nameServerAddress"
    assert columns("Cluster")["Replication"] == ".status.replication"  # "2/2 groups in sync" (issue 17)


def _walk(schema, path=""):
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("kind", crds.KINDS)
def test_schema_is_structural_and_described(kind):
    for path, node in _walk(crds.openapi_schema(kind)):
        if path == ".metadata":
            continue
        if not node.get("x-kubernetes-int-or-string"):
            assert "type" in node, f"{kind}{path} has no type"
        assert node.get("description"), f"{kind}{path} has no description"


def test_status_schemas_have_the_promised_fields():
    def status(kind):
        return crds.openapi_schema(kind)["properties"]["status"]["properties"]

    cluster, topic, group = status("Cluster"), status("Topic"), status("ConsumerGroup")
    for s in (cluster, topic, group):
        assert {"observedGeneration", "conditions"} <= set(s)
        cond = s["conditions"]["items"]["properties"]
        assert {"type", "status", "reason", "message", "lastTransitionTime"} <= set(cond)
    assert {"nameServerAddress", "readyNameServers", "readyBrokers", "brokers"} <= set(cluster)
    assert {"name", "address", "version"} <= set(cluster["brokers"]["items"]["properties"])
    assert {"topicName", "brokers"} <= set(topic)
    assert {"readQueueNums", "writeQueueNums"} <= set(topic["brokers"]["items"]["properties"])
    assert {"lag", "totalLag", "consumersOnline"} <= set(group)


# -- examples and defaults ----------------------------------------------------------------------

def test_there_are_examples_of_every_kind():
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in EXAMPLES}
    assert kinds == set(crds.KINDS)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates_against_its_crd(path):
    obj = yaml.safe_load(path.read_text())
    schema = crds.to_json_schema(crds.openapi_schema(obj["kind"]))
    assert not any(k.startswith("x-kubernetes-") for k in str(schema).split("'"))
    jsonschema.Draft7Validator(schema).validate(obj)  # raw, before defaults
    defaulted, errors = crds.admit(obj)  # defaults + schema + CEL
    assert errors == []
    assert _contains(defaulted, obj)  # defaulting only adds


def _contains(big, small) -> bool:
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and _contains(big[k], v) for k, v in small.items())
    return big == small


def test_topic_defaults():
    t, errors = crds.admit(_topic())
    assert errors == []
    assert {k: t["spec"][k] for k in ("readQueueNums", "writeQueueNums", "perm", "order", "messageType")} == {
        "readQueueNums": 8, "writeQueueNums": 8, "perm": "RW", "order": False, "messageType": "NORMAL"}
    assert "topicName" not in t["spec"]  # defaults to metadata.name in the operator, not in the schema


def test_consumer_group_defaults():
    g, errors = crds.admit(_group())
    assert errors == []
    assert g["spec"] | {"clusterRef": None} == {
        "clusterRef": None, "consumeEnable": True, "consumeBroadcastEnable": True, "consumeFromMinEnable": True,
        "retryMaxTimes": 16, "retryQueueNums": 1}


def test_cluster_defaults():
    c, errors = crds.admit(_cluster(brokers={}, nameServers={}))
    assert errors == []
    b, n = c["spec"]["brokers"], c["spec"]["nameServers"]
    assert (b["groups"], b["replicas"], b["flushMode"], b["port"], b["segmentSize"]) == (1, 1, "sync", 10911, 1 << 30)
    assert (n["replicas"], n["port"], n["metricsPort"]) == (2, 9876, 9877)
    assert c["spec"]["image"]
    assert "storage" not in b  # nested defaults apply only where the object exists (as in Kubernetes)
    c2, _ = crds.admit(_cluster(brokers={"storage": {}}))
    assert c2["spec"]["brokers"]["storage"] == {"size": "10Gi"}


def test_admit_does_not_mutate_its_input():
    t = _topic()
    before = copy.deepcopy(t)
    crds.admit(t)
    assert t == before


# -- refusals -----------------------------------------------------------------------------------

@pytest.mark.parametrize("obj, where", [
    (_topic(writeQueueNums=0), "writeQueueNums"),
    (_topic(writeQueueNums=2000), "writeQueueNums"),
    (_topic(readQueueNums=1025), "readQueueNums"),
    (_topic(perm="X"), "perm"),
    (_topic(messageType="BATCH"), "messageType"),
    (_topic(topicName="has space"), "topicName"),
    (_topic(topicName="x" * 128), "topicName"),
    ({"apiVersion": crds.API_VERSION, "kind": "Topic", "metadata": {"name": "t"}, "spec": {"readQueueNums": 4}}, "clusterRef"),
    ({"apiVersion": crds.API_VERSION, "kind": "Topic", "metadata": {"name": "t"}}, "spec"),
    (_group(retryMaxTimes=-1), "retryMaxTimes"),
    (_group(clusterRef={}), "name"),
    (_cluster(brokers={"groups": 0}), "groups"),
    (_cluster(brokers={"replicas": 6}), "replicas"),
    (_cluster(brokers={"replicas": 0}), "replicas"),
    (_cluster(brokers={"replicas": 3, "minInSync": 0}), "minInSync"),
    (_cluster(brokers={"replicas": 3, "replication": "quorum"}), "replication"),
    (_cluster(brokers={"replicas": 3, "leaseSeconds": 1}), "leaseSeconds"),
    (_cluster(brokers={"flushMode": "fsync"}), "flushMode"),
    (_cluster(brokers={"storage": {"size": "lots"}}), "size"),
    (_cluster(external={"nameServers": []}), "nameServers"),
    (_cluster(external={"nameServers": ["no-port"]}), "no-port"),
    (_cluster(brokers={"config": {"k": "multi\nline"}}), "config"),
])
def test_bad_specs_are_refused_by_the_schema(obj, where):
    schema = crds.to_json_schema(crds.openapi_schema(obj["kind"]))
    defaulted = crds.apply_defaults(crds.openapi_schema(obj["kind"]), obj)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(defaulted)
    _, errors = crds.admit(obj)
    assert errors and any(where in e for e in errors), errors


def test_admit_refuses_foreign_objects():
    assert crds.admit({"apiVersion": "v1", "kind": "ConfigMap"})[1]
    assert crds.admit({"apiVersion": "tidemq.io/v1", "kind": "Topic", "spec": {}})[1]


# -- CEL rules ----------------------------------------------------------------------------------

def _rules(kind):
    return {path: [r["rule"] for r in rules] for path, rules in _group_rules(kind).items()}


def _group_rules(kind):
    out: dict[str, list] = {}
    for path, rule in crds.iter_cel_rules(crds.openapi_schema(kind)):
        out.setdefault(path, []).append(rule)
    return out


def test_cel_rules_are_where_promised():
    cluster, topic, group = _rules("Cluster"), _rules("Topic"), _rules("ConsumerGroup")
    assert "has(self.external) != has(self.brokers)" in cluster[".spec"]
    assert any("oldSelf" in r for r in cluster[".spec.brokers"])  # brokers.port immutable
    assert any("!('brokerName' in self)" in r for r in cluster[".spec.brokers.config"])
    assert "self == oldSelf" in topic[".spec.clusterRef"] and "self == oldSelf" in topic[".spec.topicName"]
    assert any("oldSelf.metadata.name" in r for r in topic["."])  # topicName immutable even when added later
    assert "self == oldSelf" in group[".spec.clusterRef"] and "self == oldSelf" in group[".spec.groupName"]
    for kind in crds.KINDS:
        for rules in _group_rules(kind).values():
            for r in rules:
                assert r.get("message"), f"{kind}: rule {r['rule']!r} has no message"
                assert r["rule"].count("(") == r["rule"].count(")")


def _max_length(schema, path):
    node = schema
    for part in path.strip(".").split("."):
        if part:
            node = node["properties"][part]
    return node.get("maxLength"), node.get("type")


@pytest.mark.parametrize("kind", crds.KINDS)
def test_cel_rules_stay_within_the_cost_budget(kind):
    """The API server refuses a CRD whose rules may cost too much: string scans (matches,
    startsWith, all()) only over strings with a maxLength, never over map keys."""
    schema = crds.openapi_schema(kind)
    for path, rule in crds.iter_cel_rules(schema):
        text = rule["rule"]
        assert ".all(" not in text and ".exists(" not in text, f"{kind}{path}: {text}"
        if ".matches(" in text or "startsWith(" in text:
            max_length, typ = _max_length(schema, path)
            assert typ == "string" and max_length and max_length <= 1024, f"{kind}{path}: {text}"


needs_cel = pytest.mark.skipif(not crds.cel_available(), reason="cel-python is not installed: CEL rules not evaluated")


@needs_cel
@pytest.mark.parametrize("kind", crds.KINDS)
def test_every_cel_rule_compiles(kind):
    import celpy  # noqa: PLC0415 (optional: cel-python, see needs_cel)

    env = celpy.Environment()
    for _path, rule in crds.iter_cel_rules(crds.openapi_schema(kind)):
        env.compile(rule["rule"])


@pytest.mark.parametrize("obj, message", [
    (_cluster(), "exactly one of spec.external"),
    (_cluster(brokers={}, external={"nameServers": ["ns:9876"]}), "exactly one of spec.external"),
    (_cluster(external={"nameServers": ["ns:9876"]}, nameServers={"replicas": 1}), "spec.nameServers describes"),
    (_cluster(brokers={"config": {"brokerName": "x"}}), "keys the operator manages"),
    (_cluster(brokers={"config": {"flush-disk": "x", "store": "/tmp"}}), "keys the operator manages"),
    (_cluster(name="x" * 41, brokers={}), "at most 40 characters"),
    (_cluster(brokers={}, nameServers={"port": 9000, "metricsPort": 9000}), "must differ"),
    (_cluster(brokers={"replicas": 2, "minInSync": 3}), "minInSync must be at most brokers.replicas"),
    (_cluster(brokers={"minInSync": 2}), "minInSync must be at most brokers.replicas"),  # replicas defaults to 1
    (_cluster(brokers={"config": {"min-in-sync": "1"}}), "keys the operator manages"),
    (_cluster(brokers={"config": {"coordination": "etcd://x:2379"}}), "keys the operator manages"),
    (_topic(order=True, messageType="DELAY"), "order: true cannot"),
    (_topic(topicName="TBW102"), "system topic"),
    (_topic(topicName="%RETRY%g1"), "system topic"),
    (_group(groupName="%DLQ%g1"), "may not start with"),
])
@needs_cel
def test_cel_rules_refuse(obj, message):
    _, errors = crds.admit(obj)
    assert any(message in e for e in errors), errors


@needs_cel
def test_cel_rules_accept_good_objects():
    assert crds.admit(_cluster(brokers={"config": {"autoCreateTopicEnable": "true"}}))[1] == []
    assert crds.admit(_cluster(external={"nameServers": ["10.0.0.1:9876", "[::1]:9876"]}))[1] == []
    assert crds.admit(_topic(order=True, messageType="FIFO"))[1] == []
    replicated, errors = crds.admit(_cluster(brokers={"replicas": 3, "minInSync": 3}))
    assert errors == []
    assert replicated["spec"]["brokers"]["replication"] == "sync"
    assert replicated["spec"]["brokers"]["leaseSeconds"] == 10
    defaulted, errors = crds.admit(_cluster(brokers={"replicas": 3}))
    assert errors == [] and "minInSync" not in defaulted["spec"]["brokers"]  # min(2, replicas): the operator's


@needs_cel
def test_transition_rules_on_update():
    old = _topic(readQueueNums=8)
    assert crds.admit(_topic(readQueueNums=16), old=old)[1] == []  # growing is fine
    moved = _topic()
    moved["spec"]["clusterRef"] = {"name": "other"}
    assert any("clusterRef is immutable" in e for e in crds.admit(moved, old=old)[1])
    renamed = _topic(topicName="Other")
    assert any("is immutable" in e for e in crds.admit(renamed, old=old)[1])
    # spelling out the name it already had is not a rename
    assert crds.admit(_topic(topicName="t1"), old=old)[1] == []
    named = _topic(topicName="Orders_1")
    assert any("is immutable" in e for e in crds.admit(_topic(), old=named)[1])  # dropping it renames
    assert crds.admit(named, old=named)[1] == []
    g_old = _group(groupName="g_1")
    assert any("groupName is immutable" in e for e in crds.admit(_group(groupName="g_2"), old=g_old)[1])
    c_old = _cluster(brokers={"port": 10911})
    assert any("brokers.port is immutable" in e for e in crds.admit(_cluster(brokers={"port": 10912}), old=c_old)[1])
    assert crds.admit(_cluster(brokers={"port": 10911, "groups": 3}), old=c_old)[1] == []
    s_old = _cluster(brokers={"storage": {"size": "1Gi"}})
    s_new = _cluster(brokers={"storage": {"size": "1Gi", "storageClassName": "fast"}})
    assert any("storageClassName is immutable" in e for e in crds.admit(s_new, old=s_old)[1])
    assert crds.admit(s_new, old=s_new)[1] == []
