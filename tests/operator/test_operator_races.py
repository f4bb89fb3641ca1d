"""Timers race event handlers (issue 18, item 6): a pass acts on the object as the API has it now.

kopf runs a resource's timer in parallel with its event handlers; a timer pass that read the
spec before an update must not act on it after the update was applied. Here the operator's own
handlers (taken from a registry that :func:`tidemq.operator.handlers.register` filled, so the
lock and the re-read are the ones kopf runs) are called with the bodies kopf would hand them,
against kmock's emulator (tests/operator/test_operator_integration.py says how it is adapted) and
a real name server + broker:

- a Topic grown by an update keeps its write queues when a timer pass holding the old spec runs
  after it (it lowered them: SHRINK_WRITE on the stale spec);
- a Cluster's StatefulSets keep the updated template when a stale timer pass runs after the
  update (it re-applied the old image: a second roll);
- the per-object locks make passes of one object take turns and live only while used.
"""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections.abc import Callable

import pytest

kopf = pytest.importorskip("kopf")
kubernetes = pytest.importorskip("kubernetes")

from tests.operator.test_operator_integration import build_emulator  # noqa: E402
from tests.support.kube import ThreadedEmulator  # noqa: E402
from tidemq.client.admin import Admin  # noqa: E402
from tidemq.operator import crds, handlers, serial  # noqa: E402
from tidemq.operator.metrics import OperatorMetrics  # noqa: E402

NS = "default"
GROUP, VERSION = handlers.GROUP, handlers.VERSION
pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def emulator():
    emu = ThreadedEmulator(build_emulator, name="kmock-races").start()
    yield emu
    emu.stop()


@pytest.fixture
def api(emulator, monkeypatch):
    """The kubernetes client's default configuration pointed at the emulator (the operator's
    reads and applies build their clients from it, as in a pod)."""
    cfg = kubernetes.client.Configuration()
    cfg.host = emulator.url
    monkeypatch.setattr(kubernetes.client.Configuration, "_default", cfg)
    return kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(cfg))


class Operator:
    """The handler functions ``register`` put into a fresh registry, by function name."""

    def __init__(self, config: handlers.OperatorConfig) -> None:
        registry = kopf.OperatorRegistry()
        handlers.register(registry, config, OperatorMetrics())
        self.fns: dict[str, Callable] = {}
        for part in (registry._changing, registry._spawning, registry._activities, registry._watching):
            for h in part.get_all_handlers():
                self.fns[h.fn.__name__] = h.fn

    async def __call__(self, name: str, body: dict, **kw) -> kopf.Patch:
        patch = kopf.Patch()
        await self.fns[name](body=kopf.Body(body), patch=patch, logger=None, **kw)
        return patch

    async def close(self) -> None:
        await self.fns["close_pool"]()


def _get(api, plural: str, name: str) -> dict:
    return api.get_namespaced_custom_object(GROUP, VERSION, NS, plural, name)


def _store(api, plural: str, obj: dict) -> dict:
    api.create_namespaced_custom_object(GROUP, VERSION, NS, plural, obj)
    return _get(api, plural, obj["metadata"]["name"])


def _update(api, plural: str, name: str, spec: dict, generation: int) -> dict:
    """A spec change as the API server makes it: the spec and a new generation (the emulator
    keeps no generation of its own)."""
    api.patch_namespaced_custom_object(GROUP, VERSION, NS, plural, name,
                                       {"metadata": {"generation": generation}, "spec": spec})
    return _get(api, plural, name)


async def _queues(c, topic: str) -> tuple[int, int] | None:
    async with Admin(c.namesrv_addr) as admin:
        tc = (await admin.broker_topic_configs(c.broker_addr)).get(topic)
    return None if tc is None else (tc["readQueueNums"], tc["writeQueueNums"])


def _index(c) -> dict:
    return {(NS, "ext"): [{"spec": {"external": {"nameServers": [c.namesrv_addr]}}, "status": {},
                           "metadata": {"name": "ext", "namespace": NS}}]}


async def test_a_stale_timer_pass_after_an_update_does_not_lower_the_write_queues(api, cluster):
    topic = "Race_" + uuid.uuid4().hex[:8]
    name = topic.lower().replace("_", "-")
    op = Operator(handlers.OperatorConfig(timer_interval=30.0, drain_grace=0.0))
    index = {handlers.CLUSTER_INDEX: _index(cluster)}
    try:
        v1 = _store(api, "topics", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Topic",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1},
            "spec": {"clusterRef": {"name": "ext"}, "topicName": topic, "readQueueNums": 4, "writeQueueNums": 4}})
        await op("topic_changed", v1, **index)
        assert await _queues(cluster, topic) == (4, 4)
        # The timer took this body before the update (kopf hands timers a body of their own).
        stale = dict(v1)

        v2 = _update(api, "topics", name, {"readQueueNums": 8, "writeQueueNums": 8}, 2)
        patch = await op("topic_changed", v2, **index)
        assert await _queues(cluster, topic) == (8, 8)
        api.patch_namespaced_custom_object_status(GROUP, VERSION, NS, "topics", name, {"status": patch["status"]})

        # Before: the pass planned the old 4/4 against the broker's 8/8 and lowered the writes.
        patch = await op("topic_timer", stale, **index)
        assert await _queues(cluster, topic) == (8, 8)
        assert "status" not in patch  # it found what the update's pass stored: nothing to write

        # a timer pass for a Topic that is gone does nothing (no re-creation after a deletion)
        api.delete_namespaced_custom_object(GROUP, VERSION, NS, "topics", name)
        async with Admin(cluster.namesrv_addr) as admin:
            await admin.delete_topic(topic, cluster.cluster_name)
        await op("topic_timer", v2, **index)
        assert await _queues(cluster, topic) is None
    finally:
        await op.close()


def _images(api_client) -> dict[str, str]:
    apps = kubernetes.client.AppsV1Api(api_client)
    return {s.metadata.name: s.spec.template.spec.containers[0].image
            for s in apps.list_namespaced_stateful_set(NS).items if s.metadata.name.startswith("race-")}


async def test_a_stale_timer_pass_after_an_update_does_not_roll_the_old_template_back(api):
    cluster, errors = crds.admit({"apiVersion": crds.API_VERSION, "kind": "Cluster",
                                  "metadata": {"name": "race", "namespace": NS, "uid": "uid-race", "generation": 1},
                                  "spec": {"image": "reg/tidemq:1", "brokers": {"groups": 1}}})
    assert not errors
    op = Operator(handlers.OperatorConfig(retry_delay=1.0))
    try:
        v1 = _store(api, "clusters", cluster)
        await op("cluster_changed", v1)
        images = _images(api.api_client)
        assert images and set(images.values()) == {"reg/tidemq:1"}, images
        stale = dict(v1)

        v2 = _update(api, "clusters", "race", {"image": "reg/tidemq:2"}, 2)
        await op("cluster_changed", v2)
        rolled = {n for n, image in _images(api.api_client).items() if image == "reg/tidemq:2"}
        assert rolled  # the name servers first

        # Before: the stale pass applied reg/tidemq:1 again to what had rolled (a second roll).
        await op("cluster_timer", stale)
        assert {n for n, image in _images(api.api_client).items() if image == "reg/tidemq:2"} == rolled
    finally:
        await op.close()


# the choice and the locks (no API) ----------------------------------------------------------------
def _obj(generation: int, uid: str = "u1", **md) -> dict:
    return {"metadata": {"name": "t", "namespace": NS, "uid": uid, "generation": generation, **md},
            "spec": {"v": generation}}


def test_a_pass_acts_on_the_api_copy_unless_it_is_older_or_another_object():
    assert serial.choose(_obj(1), _obj(2), timer=True)["spec"] == {"v": 2}
    assert serial.choose(_obj(2), _obj(2), timer=False)["spec"] == {"v": 2}
    assert serial.choose(_obj(3), _obj(2), timer=False)["spec"] == {"v": 3}  # a copy that went back
    assert serial.choose(_obj(1), None, timer=False) is None  # gone
    assert serial.choose(_obj(1), _obj(1, uid="u2"), timer=False) is None  # replaced under its name
    deleting = _obj(1, deletionTimestamp="2026-11-26T07:00:00Z")
    assert serial.choose(_obj(1), deleting, timer=True) is None
    assert serial.choose(_obj(1), deleting, timer=False) is not None  # its handlers still see it


async def test_a_failed_read_back_fails_the_pass_instead_of_acting_on_the_body():
    async def broken(plural: str, namespace: str, name: str):
        raise ConnectionError("connection refused")

    with pytest.raises(serial.ReadFailed, match="cannot read topics default/t back.*connection refused"):
        async with serial.Serializer(broken).current("topics", _obj(1)):
            raise AssertionError("the pass ran")


async def test_passes_of_one_object_take_turns_and_locks_live_only_while_used():
    async def read(plural: str, namespace: str, name: str):
        return _obj(1)

    s = serial.Serializer(read)
    for i in range(1000):  # one pass each for a thousand objects, since deleted
        async with s.current("topics", _obj(1, uid=f"uid-{i}")):
            await asyncio.sleep(0)
    order = []

    async def one(tag: str) -> None:
        async with s.current("topics", _obj(1)):
            order.append(f"{tag} in")
            await asyncio.sleep(0.01)
            order.append(f"{tag} out")

    await asyncio.gather(one("a"), one("b"))
    assert order == ["a in", "a out", "b in", "b out"]
    gc.collect()
    assert len(s._locks) == 0
