"""Pure tests of tidemq.operator.rollout.plan: which stage is applied when, and the conditions."""

from __future__ import annotations

import copy

from tidemq.operator import rollout, workloads

SPEC_HASH = workloads.SPEC_HASH_ANNOTATION


def cluster(image: str = "tidemq:1", groups: int = 2, storage: str = "10Gi") -> dict:
    return {"apiVersion": "tidemq.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "demo", "namespace": "ns", "uid": "u-1", "generation": 1},
            "spec": {"image": image, "brokers": {"groups": groups, "storage": {"size": storage}}}}


def desired(**kw) -> list[dict]:
    return workloads.desired_objects(cluster(**kw))


def live_from(objs: list[dict], ready: bool | dict[str, int] = True, generation: int = 1) -> dict:
    """Live StatefulSets as the API would serve them after they were applied from ``objs``."""
    out = {}
    for o in objs:
        if o["kind"] != "StatefulSet":
            continue
        live = copy.deepcopy(o)
        n = live["spec"]["replicas"]
        r = n if ready is True else (0 if ready is False else ready.get(o["metadata"]["name"], n))
        live["metadata"]["generation"] = generation
        live["status"] = {"observedGeneration": generation, "replicas": n, "readyReplicas": r,
                          "updatedReplicas": n, "currentRevision": "a", "updateRevision": "a"}
        out[o["metadata"]["name"]] = live
    return out


def names(objs) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in objs]


def cond(p: rollout.Plan, ctype: str) -> tuple[bool, str]:
    for t, ok, reason, _msg in p.conditions():
        if t == ctype:
            return ok, reason
    raise AssertionError(ctype)


def test_stages_end_at_each_statefulset():
    st = rollout.stages(desired())
    assert [s.name for s in st] == ["demo-namesrv", "demo-broker-0", "demo-broker-1"]
    assert [s.component for s in st] == ["namesrv", "broker", "broker"]
    assert sum(len(s.objects) for s in st) == len(desired())


def test_first_install_applies_everything():
    objs = desired()
    p = rollout.plan(objs, {})
    assert names(p.apply) == names(objs)
    assert p.applied_stages == ("demo-namesrv", "demo-broker-0", "demo-broker-1")
    assert cond(p, "Ready") == (False, "WaitingForPods")
    assert cond(p, "Progressing") == (True, "RollingUpdate")
    assert cond(p, "Degraded")[0] is False


def test_pods_starting_then_all_ready():
    objs = desired()
    p = rollout.plan(objs, live_from(objs, ready=False))
    assert p.apply == () and not p.ready and p.progressing
    assert p.ready_name_servers == 0 and p.ready_brokers == 0
    p = rollout.plan(objs, live_from(objs, ready={"demo-broker-1": 0}))
    assert not p.ready and p.rolling == ("demo-broker-1",)
    p = rollout.plan(objs, live_from(objs))
    assert p.ready and not p.progressing and p.apply == ()
    assert cond(p, "Ready") == (True, "AllReady")
    assert cond(p, "Progressing")[0] is False
    assert p.ready_name_servers == 2 and p.ready_brokers == 2  # defaults: 2 name servers, 1 broker a group
    assert set(p.was_ready) == {"demo-namesrv", "demo-broker-0", "demo-broker-1"}


def test_a_change_applies_the_name_servers_first_then_waits():
    old, new = desired(image="tidemq:1"), desired(image="tidemq:2")
    p = rollout.plan(new, live_from(old))
    assert p.applied_stages == ("demo-namesrv",)
    assert "StatefulSet/demo-namesrv" in names(p.apply)
    assert not any("broker" in n for n in names(p.apply))
    assert p.waiting == ("demo-broker-0", "demo-broker-1")
    assert cond(p, "Progressing") == (True, "RollingUpdate") and not p.ready

    # name servers applied: the controller has not observed the new generation yet -> wait
    live = live_from(old)
    live.update({k: v for k, v in live_from(new, generation=2).items() if k == "demo-namesrv"})
    live["demo-namesrv"]["status"]["observedGeneration"] = 1
    p = rollout.plan(new, live)
    assert p.apply == () and p.rolling == ("demo-namesrv",)
    assert p.waiting == ("demo-broker-0", "demo-broker-1")

    # rolling: one pod updated of two ... still waiting
    live["demo-namesrv"]["status"].update(observedGeneration=2, updatedReplicas=0, readyReplicas=0)
    p = rollout.plan(new, live)
    assert p.apply == () and cond(p, "Degraded")[0] is False  # rolling is not degraded


def test_group_one_waits_for_group_zero():
    old, new = desired(image="tidemq:1"), desired(image="tidemq:2")
    live = live_from(old)
    live["demo-namesrv"] = live_from(new, generation=2)["demo-namesrv"]  # rolled and ready
    p = rollout.plan(new, live)
    assert p.applied_stages == ("demo-broker-0",)
    assert names(p.apply) == names(rollout.stages(new)[1].objects)  # ConfigMap .. StatefulSet
    assert p.waiting == ("demo-broker-1",)

    live["demo-broker-0"] = live_from(new, ready={"demo-broker-0": 0}, generation=2)["demo-broker-0"]
    p = rollout.plan(new, live)
    assert p.apply == () and p.rolling == ("demo-broker-0",) and p.waiting == ("demo-broker-1",)

    live["demo-broker-0"] = live_from(new, generation=2)["demo-broker-0"]
    p = rollout.plan(new, live)
    assert p.applied_stages == ("demo-broker-1",) and p.waiting == ()

    live["demo-broker-1"] = live_from(new, generation=2)["demo-broker-1"]
    p = rollout.plan(new, live)
    assert p.ready and p.apply == ()


def test_a_new_broker_group_is_applied_at_once():
    old, new = desired(groups=1), desired(groups=2)
    p = rollout.plan(new, live_from(old))
    assert p.applied_stages == ("demo-broker-1",)


def test_degraded_only_after_having_been_ready():
    objs = desired()
    starting = rollout.plan(objs, live_from(objs, ready={"demo-broker-0": 0}))
    assert cond(starting, "Degraded")[0] is False  # never ready yet: starting, not degraded
    ready = rollout.plan(objs, live_from(objs))
    lost = rollout.plan(objs, live_from(objs, ready={"demo-broker-0": 0}), ready.was_ready)
    assert lost.degraded == ("demo-broker-0",)
    assert cond(lost, "Degraded") == (True, "ReplicasNotReady")
    assert not lost.ready and cond(lost, "Ready")[0] is False
    assert "demo-broker-0" in lost.was_ready  # stays degraded on the next pass
    again = rollout.plan(objs, live_from(objs, ready={"demo-broker-0": 0}), lost.was_ready)
    assert cond(again, "Degraded")[0] is True
    healed = rollout.plan(objs, live_from(objs), again.was_ready)
    assert healed.ready and cond(healed, "Degraded")[0] is False


def test_an_immutable_change_is_blocked_and_reported():
    old, new = desired(storage="10Gi"), desired(storage="20Gi")
    p = rollout.plan(new, live_from(old))
    assert "demo-broker-0" in p.blocked
    assert "spec.volumeClaimTemplates" in p.blocked["demo-broker-0"]
    assert not any(o["metadata"]["name"] == "demo-broker-0" and o["kind"] == "StatefulSet"
                   for o in p.apply)
    assert "demo-broker-1" in p.waiting or "demo-broker-1" in p.blocked
    assert cond(p, "Ready") == (False, "ImmutableFieldChange")


def test_settled_needs_observed_generation_and_equal_revisions():
    base = {"metadata": {"name": "x", "generation": 3}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 3, "replicas": 2, "readyReplicas": 2,
                       "updatedReplicas": 2, "currentRevision": "r1", "updateRevision": "r1"}}
    assert rollout.sts_state(base).settled
    for change in ({"observedGeneration": 2}, {"updateRevision": "r2"}, {"readyReplicas": 1},
                   {"updatedReplicas": 1}, {"replicas": 3}):
        obj = copy.deepcopy(base)
        obj["status"].update(change)
        assert not rollout.sts_state(obj).settled, change


def test_broker_addresses_are_the_advertised_pod_dns_names():
    out = workloads.broker_addresses(cluster(image="reg/tidemq:2.1", groups=2))
    assert [b["address"] for b in out] == [
        "demo-broker-0-0.demo-broker-0-headless.ns.svc:10911",
        "demo-broker-1-0.demo-broker-1-headless.ns.svc:10911",
    ]
    assert {b["version"] for b in out} == {"2.1"}
    assert workloads.image_version("reg:5000/tidemq") == "latest"


def replicated(replicas: int, lease: int = 10) -> list[dict]:
    c = cluster(groups=1)
    c["spec"]["brokers"].update(replicas=replicas, leaseSeconds=lease)
    return workloads.desired_objects(c)


def sts_of(objs: list[dict], name: str = "demo-broker-0") -> dict:
    return next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == name)


def test_a_lone_group_becomes_replicated_in_two_steps():
    """1 -> 3 replicas: first pod 0 restarts as a replica at the old size (new pods would otherwise
    start on the lone revision below the partition), then the StatefulSet grows."""
    lone, three = replicated(1), replicated(3)
    assert not rollout.is_replicated(sts_of(lone)) and rollout.is_replicated(sts_of(three))
    first = rollout.plan(three, live_from(lone))
    step = sts_of(list(first.apply))
    assert step["spec"]["replicas"] == 1 and rollout.is_replicated(step)
    assert step["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 0
    assert step["metadata"]["annotations"][SPEC_HASH] == workloads.spec_hash(step)
    assert step["metadata"]["annotations"][SPEC_HASH] != sts_of(three)["metadata"]["annotations"][SPEC_HASH]
    # the RBAC objects come with the first step, before the StatefulSet
    assert names(first.apply)[:3] == ["ServiceAccount/demo-broker", "Role/demo-broker-leases",
                                      "RoleBinding/demo-broker-leases"]
    second = rollout.plan(three, {**live_from(lone), **live_from(list(first.apply))})
    full = sts_of(list(second.apply))
    assert full["spec"]["replicas"] == 3 and full["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 3
    assert rollout.plan(three, live_from(three)).apply == ()


def test_a_replicated_group_changes_in_one_step():
    three, five = replicated(3), replicated(5)
    p = rollout.plan(five, live_from(three))
    assert sts_of(list(p.apply))["spec"]["replicas"] == 5  # already replicas: grown at once
    new_lease = rollout.plan(replicated(3, lease=5), live_from(three))
    sts = sts_of(list(new_lease.apply))
    assert sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 3  # the operator releases pods
