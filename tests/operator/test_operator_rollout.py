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
                          "availableReplicas": r, "updatedReplicas": n, "currentRevision": "a",
                          "updateRevision": "a"}
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
    live["demo-namesrv"]["status"].update(observedGeneration=2, updatedReplicas=0, readyReplicas=0,
                                          availableReplicas=0)
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


def test_the_brokers_wait_until_the_rolled_name_servers_are_available():
    """Ready is not enough (issue 18, item 10): a pod counts once it has been ready for the
    StatefulSet's minReadySeconds (status.availableReplicas)."""
    old, new = desired(image="tidemq:1"), desired(image="tidemq:2")
    live = live_from(old)
    live["demo-namesrv"] = live_from(new, generation=2)["demo-namesrv"]
    live["demo-namesrv"]["status"]["availableReplicas"] = 1  # both ready, one not yet for minReadySeconds
    p = rollout.plan(new, live)
    assert p.apply == () and p.rolling == ("demo-namesrv",) and p.waiting == ("demo-broker-0", "demo-broker-1")
    assert p.ready_name_servers == 1 and not p.ready
    del live["demo-namesrv"]["status"]["availableReplicas"]  # the API server leaves out a zero count
    assert rollout.plan(new, live).ready_name_servers == 0
    live["demo-namesrv"]["status"]["availableReplicas"] = 2
    p = rollout.plan(new, live)
    assert p.applied_stages == ("demo-broker-0",) and p.ready_name_servers == 2


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


def test_an_immutable_change_is_reported_and_the_rest_still_rolls():
    """Issue 18, item 5: a storage size change with an image change left every group blocked and
    the image never rolled. Now the storage change is reported (Ready=False, ImmutableFieldChange)
    while the image rolls stage by stage, each StatefulSet sent with its live claim templates."""
    old, new = desired(storage="10Gi"), desired(storage="20Gi", image="tidemq:2")
    live = live_from(old)
    p = rollout.plan(new, live)
    assert p.blocked == {"demo-broker-0": ("spec.volumeClaimTemplates",),
                         "demo-broker-1": ("spec.volumeClaimTemplates",)}
    assert p.applied_stages == ("demo-namesrv",) and p.waiting == ("demo-broker-0", "demo-broker-1")
    assert cond(p, "Ready") == (False, "ImmutableFieldChange")
    assert "the rest of the change is applied" in next(m for t, *_, m in p.conditions() if t == "Ready")

    live["demo-namesrv"] = live_from([sts_of(new, "demo-namesrv")])["demo-namesrv"]  # rolled, settled
    p = rollout.plan(new, live)
    assert p.applied_stages == ("demo-broker-0",) and p.waiting == ("demo-broker-1",)
    sent = sts_of(p.apply, "demo-broker-0")
    assert sent["spec"]["template"]["spec"]["containers"][0]["image"] == "tidemq:2"
    assert sent["spec"]["volumeClaimTemplates"] == live["demo-broker-0"]["spec"]["volumeClaimTemplates"]
    assert sent["metadata"]["annotations"][SPEC_HASH] == sts_of(new, "demo-broker-0")["metadata"]["annotations"][SPEC_HASH]

    # once every group rolled, only the storage change is left: still reported, nothing applied
    live["demo-broker-0"] = live_from([sent])["demo-broker-0"]
    p = rollout.plan(new, live)
    assert p.applied_stages == ("demo-broker-1",) and "demo-broker-0" in p.blocked
    live["demo-broker-1"] = live_from([sts_of(p.apply, "demo-broker-1")])["demo-broker-1"]
    p = rollout.plan(new, live)
    assert not any(o["kind"] == "StatefulSet" for o in p.apply)
    assert set(p.blocked) == {"demo-broker-0", "demo-broker-1"} and not p.ready
    assert cond(p, "Ready") == (False, "ImmutableFieldChange") and cond(p, "Progressing")[0] is False


def test_a_reverted_storage_change_is_ready_again():
    old = desired(storage="10Gi")
    p = rollout.plan(desired(storage="20Gi"), live_from(old))
    assert p.blocked
    p = rollout.plan(old, live_from(old))
    assert p.ready and not p.blocked


def test_objects_in_step_are_refreshed_every_pass_budgets_are_not():
    """Issue 18, item 3: re-applying what is in place is a no-op with server-side apply, and a
    Service or ConfigMap deleted by hand, or a template edited by hand, comes back next pass."""
    objs = desired()
    p = rollout.plan(objs, live_from(objs))
    assert p.ready and p.apply == ()
    assert sorted(names(p.refresh)) == sorted(n for n in names(objs) if not n.startswith("PodDisruptionBudget/"))
    assert sts_of(p.refresh, "demo-broker-0") == sts_of(objs, "demo-broker-0")
    # a StatefulSet is re-applied only once it and every earlier one are settled (one roll at a time)
    p = rollout.plan(objs, live_from(objs, ready={"demo-broker-0": 0}))
    assert [o["metadata"]["name"] for o in p.refresh if o["kind"] == "StatefulSet"] == ["demo-namesrv"]
    # a stage waiting for its turn keeps its old objects until then
    new = desired(image="tidemq:2")
    p = rollout.plan(new, live_from(objs))
    assert p.applied_stages == ("demo-namesrv",)
    assert not any(o["metadata"]["name"].startswith("demo-broker") for o in p.refresh)


def test_a_statefulset_scaled_by_hand_is_put_back_and_not_ready_meanwhile():
    """kubectl scale sts demo-broker-1 --replicas=0: the Cluster stayed Ready=True (the scaled
    StatefulSet looked settled: 0 of 0 ready); now it is applied again and not Ready until back."""
    objs = desired()
    live = live_from(objs)
    live["demo-broker-1"]["spec"]["replicas"] = 0
    live["demo-broker-1"]["status"].update(replicas=0, readyReplicas=0, availableReplicas=0, updatedReplicas=0)
    p = rollout.plan(objs, live, ("demo-namesrv", "demo-broker-0", "demo-broker-1"))
    assert names(p.apply) == ["StatefulSet/demo-broker-1"] and p.repaired == ("demo-broker-1",)
    assert p.apply[0]["spec"]["replicas"] == 1
    assert p.apply[0]["spec"]["template"] == sts_of(objs, "demo-broker-1")["spec"]["template"]  # nothing rolls
    assert not p.ready and cond(p, "Ready") == (False, "ReplicasRestored")
    live["demo-broker-1"]["spec"]["replicas"] = 1  # applied; its pod is starting
    p = rollout.plan(objs, live, p.was_ready)
    assert p.apply == () and not p.ready and "demo-broker-1" in p.rolling
    assert rollout.plan(objs, live_from(objs), p.was_ready).ready


def test_a_replicated_group_scaled_by_hand_keeps_its_partition():
    objs = replicated(3)
    live = live_from(objs)
    sts = live["demo-broker-0"]
    sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = 1  # the group roll's
    sts["spec"]["replicas"] = 1
    p = rollout.plan(objs, live)
    assert p.repaired == ("demo-broker-0",)
    assert p.apply[0]["spec"]["replicas"] == 3
    assert p.apply[0]["spec"]["updateStrategy"]["rollingUpdate"]["partition"] == 1


def test_settled_needs_observed_generation_and_equal_revisions():
    base = {"metadata": {"name": "x", "generation": 3}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 3, "replicas": 2, "readyReplicas": 2, "availableReplicas": 2,
                       "updatedReplicas": 2, "currentRevision": "r1", "updateRevision": "r1"}}
    assert rollout.sts_state(base).settled
    for change in ({"observedGeneration": 2}, {"updateRevision": "r2"}, {"availableReplicas": 1},
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
