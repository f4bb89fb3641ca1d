"""The tidemq_replica_* families (issue 17) read from a replica's status at scrape time: each scrape
shows the status of that moment, a follower has no lag series and no failover duration until it
has one. docs/metrics.md is checked against a real replica in tests/broker/ha/test_switchover.py."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tidemq.broker.ha.replica import FollowerLag, ReplicaStatus
from tidemq.broker.metrics import _ReplicaCollector

BASE = {"cluster": "RC", "broker": "broker-a"}
FOLLOWER = ReplicaStatus(
    replica_id=2, role="follower", epoch=3, master=0, in_sync=(0, 2), min_in_sync=2, replication="sync",
    log_end=4096, high_water=4096, followers=(), failovers=0, last_failover_seconds=None, switchovers=0)


class FakeReplica:
    def __init__(self, status: ReplicaStatus) -> None:
        self.now = status

    def status(self) -> ReplicaStatus:
        return self.now


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = dict(s.labels)
            assert {k: labels.pop(k) for k in BASE} == BASE, s
            out[(s.name, tuple(sorted(labels.items())))] = s.value
    return out


def test_each_scrape_reads_the_status_of_that_moment():
    replica = FakeReplica(FOLLOWER)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_ReplicaCollector(replica, (BASE["cluster"], BASE["broker"])))  # type: ignore[arg-type]
    assert samples(registry) == {
        ("tidemq_replica_role", (("role", "master"),)): 0.0,
        ("tidemq_replica_role", (("role", "follower"),)): 1.0,
        ("tidemq_replica_role", (("role", "none"),)): 0.0,
        ("tidemq_replica_epoch", ()): 3.0,
        ("tidemq_replica_in_sync", ()): 2.0,
        ("tidemq_replica_min_in_sync", ()): 2.0,
        ("tidemq_replica_high_water_offset_bytes", ()): 4096.0,
        ("tidemq_replica_failovers_total", ()): 0.0,
        ("tidemq_replica_switchovers_total", ()): 0.0,
        ("tidemq_replica_deposed_total", ()): 0.0,
    }

    replica.now = replace(FOLLOWER, role="master", epoch=4, master=2, in_sync=(0, 1, 2), high_water=8000,
                          followers=(FollowerLag(0, 8000, 192), FollowerLag(1, 8192, 0)), failovers=1,
                          last_failover_seconds=2.75, switchovers=1, deposed=2)
    after = samples(registry)
    assert after[("tidemq_replica_role", (("role", "master"),))] == 1.0
    assert after[("tidemq_replica_role", (("role", "follower"),))] == 0.0
    assert (after[("tidemq_replica_epoch", ())], after[("tidemq_replica_in_sync", ())]) == (4.0, 3.0)
    assert {k[1]: v for k, v in after.items() if k[0] == "tidemq_replica_follower_lag_bytes"} == {
        (("replica", "0"),): 192.0, (("replica", "1"),): 0.0}
    assert after[("tidemq_replica_failover_seconds", ())] == 2.75
    assert (after[("tidemq_replica_failovers_total", ())], after[("tidemq_replica_switchovers_total", ())],
            after[("tidemq_replica_deposed_total", ())]) == (1, 1, 2)
