"""`tidemq admin switchover` and the replica columns of `clusterList` (issue 17).

The waiting and the errors run against a fake admin (the name servers' cluster info as a script of
answers); against the real name server and broker of tests/cli, a plain broker refuses a
switchover with a sentence and an unknown group fails cleanly. The real move of mastership is in
tests/broker/ha/test_switchover.py."""

from __future__ import annotations

import pytest

from tests.cli.clirun import assert_clean_failure, tidemq
from tidemq.cli.admin import _replica_columns, _switchover
from tidemq.client.route import BrokerData, ClusterInfo
from tidemq.errors import AdminError, BrokerError
from tidemq.remoting import ResponseCode


def info(addrs: dict[int, str], group: str = "broker-a") -> ClusterInfo:
    return ClusterInfo({group: BrokerData("RC", group, addrs)}, {"RC": (group,)})


class FakeAdmin:
    """Cluster info answers in turn (the last repeats); switchover answers ``target``."""

    def __init__(self, *answers: ClusterInfo, target: int = 1, refusal: BrokerError | None = None,
                 epochs: tuple[int, ...] = (5,)) -> None:
        self.answers = list(answers)
        self.target = target
        self.refusal = refusal
        self.epochs = list(epochs)  # the epoch each runtime-info answer reports, in turn (the last repeats)
        self.asked: list[tuple[str, str, int | None]] = []

    async def cluster_info(self) -> ClusterInfo:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    async def get_broker_runtime_info(self, addr: str) -> dict[str, str]:
        return {"haEpoch": str(self.epochs.pop(0) if len(self.epochs) > 1 else self.epochs[0])}

    async def switchover(self, addr: str, broker_name: str, to: int | None = None) -> int:
        self.asked.append((addr, broker_name, to))
        if self.refusal is not None:
            raise self.refusal
        return self.target


async def test_it_asks_the_registered_master_then_waits_for_a_new_brokerid_0():
    before = info({0: "10.0.0.1:10911", 2: "10.0.0.2:10911", 3: "10.0.0.3:10911"})
    settling = info({1: "10.0.0.1:10911", 3: "10.0.0.3:10911"})  # the old master re-registered, no new one yet
    after = info({0: "10.0.0.2:10911", 1: "10.0.0.1:10911", 3: "10.0.0.3:10911"})
    admin = FakeAdmin(before, before, settling, after, target=1)
    lines: list[str] = []
    old, new, target, took = await _switchover(admin, "broker-a", None, 10, lines.append)  # type: ignore[arg-type]
    assert (old, new, target) == ("10.0.0.1:10911", "10.0.0.2:10911", 1) and took < 5
    assert admin.asked == [("10.0.0.1:10911", "broker-a", None)]
    assert len(lines) == 2 and all("waiting for replica 1 to register as brokerId 0 of broker-a" in x for x in lines)


async def test_an_unknown_group_or_one_without_a_master_is_a_sentence_and_nothing_is_asked():
    admin = FakeAdmin(info({0: "a:1"}, group="broker-b"))
    with pytest.raises(AdminError, match=r"'broker-a' is not known .*known groups: broker-b.*check -b"):
        await _switchover(admin, "broker-a", None, 10, print)  # type: ignore[arg-type]
    admin = FakeAdmin(info({2: "a:1", 3: "b:1"}))
    with pytest.raises(AdminError, match=r"no master registered \(registered brokerIds: 2, 3\): wait"):
        await _switchover(admin, "broker-a", 1, 10, print)  # type: ignore[arg-type]
    assert admin.asked == []


async def test_the_masters_refusal_is_raised_as_it_is():
    refusal = BrokerError("switchover of broker-a failed at a:1: SYSTEM_ERROR (1): replica 2 is not an in-sync "
                          "follower", ResponseCode.SYSTEM_ERROR, "replica 2 is not an in-sync follower")
    admin = FakeAdmin(info({0: "a:1"}), refusal=refusal)
    with pytest.raises(BrokerError, match="replica 2 is not an in-sync follower"):
        await _switchover(admin, "broker-a", 2, 10, print)  # type: ignore[arg-type]


async def test_a_master_that_does_not_change_within_the_timeout_is_an_error():
    admin = FakeAdmin(info({0: "a:1", 2: "b:1"}), target=1)
    with pytest.raises(AdminError, match=r"replica 1 of 'broker-a' did not register as brokerId 0 within 1 s "
                                         r"\(brokerId 0 is a:1\)"):
        await _switchover(admin, "broker-a", None, 1, lambda line: None)  # type: ignore[arg-type]


async def test_a_target_that_gives_mastership_up_is_an_error_naming_who_was_elected():
    """The target took the hand-over (epoch 6) and gave it up (e.g. its --ha-listen could not be
    bound): another replica, or the old master again at a later epoch, is brokerId 0."""
    before = info({0: "a:1", 2: "b:1", 3: "c:1"})
    other = FakeAdmin(before, info({0: "c:1", 1: "a:1", 2: "b:1"}), target=1)
    with pytest.raises(AdminError, match=r"replica 1 of 'broker-a' took mastership but did not keep it: c:1 was "
                                         r"elected instead .*--ha-listen"):
        await _switchover(other, "broker-a", 1, 10, lambda line: None)  # type: ignore[arg-type]
    again = FakeAdmin(before, target=1, epochs=(5, 5, 7))  # a:1 at epoch 5, then master again at 7
    with pytest.raises(AdminError, match=r"did not keep it: a:1 was elected instead"):
        await _switchover(again, "broker-a", 1, 10, lambda line: None)  # type: ignore[arg-type]


def test_replica_columns():
    assert _replica_columns(None) == ("-", "-", "-")
    assert _replica_columns({"brokerVersion": "407"}) == ("-", "-", "-")
    assert _replica_columns({"haRole": "master", "haReplicaId": "0", "haEpoch": "3", "haInSync": "0,2"}) == (
        "master/0", "3", "0,2")
    assert _replica_columns({"haRole": "none", "haReplicaId": "1", "haEpoch": "0", "haInSync": ""}) == (
        "none/1", "0", "-")


def test_a_plain_broker_refuses_a_switchover_and_an_unknown_group_fails_cleanly(cluster):
    plain = tidemq("admin", "switchover", "-n", cluster.namesrv_addr, "-b", cluster.broker_name)
    assert_clean_failure(plain, "runs alone", "--coordination")
    unknown = tidemq("admin", "switchover", "-n", cluster.namesrv_addr, "-b", "no-such-group", "--to", "1")
    assert_clean_failure(unknown, "'no-such-group' is not known", cluster.broker_name)
    bad = tidemq("admin", "switchover", "-n", cluster.namesrv_addr, "-b", cluster.broker_name, "--to", "7")
    assert_clean_failure(bad, "--to", "0<=x<=4")
