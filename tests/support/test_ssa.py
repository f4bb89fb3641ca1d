"""The emulator's server-side apply (tests.support.ssa) behaves as the API server does in what the
operator's tests rely on: an apply owns what it sends, gives up what it stops sending, never
removes another manager's fields, conflicts without force, and keys lists of named items."""

from __future__ import annotations

import pytest

from tests.support import ssa


def _obj(**spec) -> dict:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "x", "namespace": "ns"},
            "spec": spec}


def _owned(obj: dict, manager: str) -> set:
    return ssa.managers_of(obj)[manager][1]


def test_an_apply_creates_and_owns_exactly_what_it_sends():
    out = ssa.apply(None, _obj(replicas=1, template={"labels": {"a": "1"}}), "op", force=True)
    assert out["metadata"]["generation"] == 1
    assert _owned(out, "op") == {("spec", "replicas"), ("spec", "template", "labels", "a")}


def test_fields_no_longer_sent_go_unless_another_manager_owns_them():
    live = ssa.apply(None, _obj(replicas=1, a=1, b=2, volumes=[{"name": "acl", "secret": {"s": "x"}},
                                                                {"name": "tmp", "emptyDir": {}}]), "op", True)
    fields = ssa.track_update(live, ssa.merge_patch(live, {"spec": {"b": 3, "c": 4}}), "kubectl")
    live = ssa.merge_patch(live, {"spec": {"b": 3, "c": 4}, "metadata": {"managedFields": fields}})
    out = ssa.apply(live, _obj(replicas=1, volumes=[{"name": "tmp", "emptyDir": {}}]), "op", True)
    # a: op's alone, gone; b: kubectl changed it, so kubectl's; c: kubectl's; the acl item goes whole
    assert out["spec"] == {"replicas": 1, "b": 3, "c": 4, "volumes": [{"name": "tmp", "emptyDir": {}}]}
    assert out["metadata"]["generation"] == 2
    assert _owned(out, "kubectl") == {("spec", "b"), ("spec", "c")}


def test_a_conflict_needs_force_and_force_takes_the_field_over():
    live = ssa.apply(None, _obj(replicas=1), "op", True)
    live = ssa.merge_patch(live, {"spec": {"replicas": 0}, "metadata": {
        "managedFields": ssa.track_update(live, ssa.merge_patch(live, {"spec": {"replicas": 0}}), "kubectl")}})
    with pytest.raises(ssa.Conflict, match="spec.replicas"):
        ssa.apply(live, _obj(replicas=1), "op", force=False)
    out = ssa.apply(live, _obj(replicas=1), "op", force=True)
    assert out["spec"]["replicas"] == 1 and "kubectl" not in ssa.managers_of(out)
    # the same value is shared ownership, not a conflict
    assert ssa.apply(live, _obj(replicas=0), "op", force=False)["spec"]["replicas"] == 0


def test_named_list_items_merge_by_name_other_lists_are_replaced():
    live = {"spec": {"c": [{"name": "a", "x": 1}, {"name": "b", "x": 2}], "args": ["1", "2"]}}
    applied = {"spec": {"c": [{"name": "b", "x": 3}], "args": ["3"]}}
    assert ssa.merge(live, applied) == {"spec": {"c": [{"name": "b", "x": 3}, {"name": "a", "x": 1}], "args": ["3"]}}


def test_managed_fields_round_trip_in_fields_v1_notation():
    paths = {("spec", "replicas"), ("spec", "volumes", ("name", "acl")), ("spec", "volumes", ("name", "acl"), "secret")}
    tree = ssa.encode(paths)
    assert tree == {"f:spec": {"f:replicas": {}, "f:volumes": {'k:{"name":"acl"}': {".": {}, "f:secret": {}}}}}
    obj = {"metadata": {"managedFields": [{"manager": "m", "operation": "Apply", "fieldsV1": tree}]}}
    assert ssa.managers_of(obj) == {"m": ("Apply", paths)}
