"""RuntimeService (issue 17): what the broker reports about itself, read at the moment of the
request, and the switchover refused for another group or a broker without replication, passed
to the replica otherwise with the replica's refusal unchanged."""

from __future__ import annotations

import pytest

from tidemq import __version__
from tidemq.broker.ha.replica import FollowerLag, ReplicaStatus
from tidemq.broker.messaging.context import refused
from tidemq.broker.messaging.runtime import RuntimeService
from tidemq.errors import BrokerError
from tidemq.remoting.codes import ResponseCode

STATUS = ReplicaStatus(
    replica_id=1, role="master", epoch=4, master=1, in_sync=(0, 1), min_in_sync=2, replication="sync",
    log_end=9000, high_water=8000, followers=(FollowerLag(0, 8000, 1000),), failovers=1,
    last_failover_seconds=2.5, switchovers=0)


class FakeStore:
    def __init__(self) -> None:
        self.end = 5000

    def stats(self) -> dict[str, int | float]:
        return {"commitlog_min_offset": 1024, "commitlog_max_offset": self.end, "flushed_offset": 4000,
                "disk_usage_ratio": 0.25}


class FakeReplica:
    def __init__(self) -> None:
        self.asked: list[int | None] = []
        self.refusal: BrokerError | None = None

    def status(self) -> ReplicaStatus:
        return STATUS

    async def switchover(self, to: int | None) -> int:
        self.asked.append(to)
        if self.refusal is not None:
            raise self.refusal
        return 2 if to is None else to


def service(replica: FakeReplica | None = None, store: FakeStore | None = None,
            totals: tuple[int, int] = (7, 3)) -> RuntimeService:
    return RuntimeService(broker_name="broker-a", store=store or FakeStore(), totals=lambda: totals,
                          replica=replica, clock=lambda: 1700000000.5)


def test_a_plain_broker_reports_its_totals_and_store_as_of_the_request():
    store = FakeStore()
    svc = service(store=store)
    rt = svc.runtime()
    assert (rt.version, rt.boot_ms, rt.messages_in, rt.messages_out) == (__version__, 1700000000500, 7, 3)
    assert (rt.commitlog_min_offset, rt.commitlog_max_offset, rt.unflushed_bytes, rt.disk_usage_ratio) == (
        1024, 5000, 1000, 0.25)
    assert rt.replica is None
    store.end = 6000  # read again at the next request, not cached
    assert (svc.runtime().commitlog_max_offset, svc.runtime().unflushed_bytes) == (6000, 2000)


def test_a_replica_adds_its_status():
    assert service(FakeReplica()).runtime().replica == STATUS


async def test_switchover_goes_to_the_replica_with_the_target_asked():
    replica = FakeReplica()
    svc = service(replica)
    assert await svc.switchover("broker-a", None) == 2
    assert await svc.switchover("broker-a", 0) == 0
    assert replica.asked == [None, 0]


async def test_switchover_of_another_group_or_without_replication_is_refused():
    replica = FakeReplica()
    with pytest.raises(BrokerError, match="belongs to group broker-a, not broker-b") as err:
        await service(replica).switchover("broker-b", None)
    assert err.value.code == ResponseCode.SYSTEM_ERROR and "brokerId 0" in err.value.remark
    with pytest.raises(BrokerError, match=r"not \(none named\)"):
        await service(replica).switchover("", None)
    assert replica.asked == []
    with pytest.raises(BrokerError, match="runs alone") as err:
        await service(None).switchover("broker-a", 1)
    assert "--coordination" in err.value.remark


async def test_the_replicas_refusal_is_passed_on_unchanged():
    replica = FakeReplica()
    replica.refusal = refused(ResponseCode.SERVICE_NOT_AVAILABLE, "replica 1 is not the master of its group")
    with pytest.raises(BrokerError) as err:
        await service(replica).switchover("broker-a", 2)
    assert (err.value.code, err.value.remark) == (ResponseCode.SERVICE_NOT_AVAILABLE,
                                                  "replica 1 is not the master of its group")
