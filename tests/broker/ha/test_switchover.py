"""`tidemq admin switchover` on real processes (issue 17): a name server, etcd and three
`tidemq broker --coordination etcd://...` replicas of one group.

Once the master's in-sync set holds all three, `tidemq admin switchover --to N` moves mastership
to replica N: the name server routes N's address as brokerId 0, `clusterList` shows N as master
of the next epoch with the in-sync set, and the replicas' /metrics show the roles, the epoch and
the old master's switchover. Asking the master itself to take over is refused with a sentence.
Then the new master is SIGKILLed: the replica elected in its place exports its failover duration,
refuses a switchover to the dead replica (not in sync), and its /metrics agree with
docs/metrics.md's tidemq_replica_* table both ways."""

from __future__ import annotations

import socket
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cli.clirun import assert_clean_failure, tidemq
from tests.broker.ha.conftest import wait_for
from tests.procs import ServerProcess
from tidemq.client import ClientConfig
from tidemq.client.send import SendStatus
from tidemq.client.sync import SyncProducer
from tidemq.message import Message
from tests.test_metrics_doc import differences, doc_section, scrape

LEASE = 3.0  # s: short, so the failover at the end fits the suite's budget
GROUP = "sw-broker"


@dataclass
class Replica:
    rid: int
    addr: str
    metrics_port: int
    proc: ServerProcess

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


def _rows(namesrv: str, group: str = GROUP) -> dict[str, list[str]]:
    """brokerId -> clusterList row of the group (cluster, name, id, addr, role, epoch, in-sync)."""
    run = tidemq("admin", "clusterList", "-n", namesrv)
    if run.rc != 0:
        return {}
    return {r[2]: r for r in (line.split() for line in run.lines()[1:]) if len(r) >= 4 and r[1] == group}


def _samples(url: str) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name.startswith("tidemq_replica_")}


def _value(url: str, name: str, **labels: str) -> float | None:
    found = [v for (n, ls), v in _samples(url).items() if n == name and set(labels.items()) <= set(ls)]
    return found[0] if len(found) == 1 else None


def _start(replica_group, name: str) -> tuple[str, dict[int, Replica]]:
    g = replica_group(name, 3, LEASE)
    # replica ids in start order; each replica's metrics port is the one its readiness URL names
    replicas = {rid: Replica(rid, addr, int(urllib.parse.urlsplit(proc.ready_url or "").port or 0), proc)
                for rid, (addr, (proc, _store)) in enumerate(g.replicas.items())}
    return g.namesrv, replicas


@pytest.fixture
def group(replica_group):
    return _start(replica_group, GROUP)


def test_switchover_moves_mastership_and_clusterlist_and_metrics_follow(group):
    namesrv, replicas = group
    by_addr = {r.addr: r for r in replicas.values()}
    rows = wait_for("a master with all three replicas in its in-sync set, shown by clusterList",
                 lambda: (rs if "0" in (rs := _rows(namesrv)) and len(rs) == 3 and len(rs["0"]) == 7
                          and rs["0"][6] == "0,1,2" else None), 30)
    master = by_addr[rows["0"][3]]
    role, epoch = rows["0"][4], int(rows["0"][5])
    assert role == f"master/{master.rid}" and epoch >= 1, rows
    followers = sorted(r.rid for r in replicas.values() if r is not master)
    for bid, row in rows.items():
        if bid != "0":
            assert row[4].startswith("follower/") and row[3] != master.addr, rows
    target = replicas[followers[-1]]

    refused = tidemq("admin", "switchover", "-n", namesrv, "-b", GROUP, "--to", str(master.rid))
    assert_clean_failure(refused, f"replica {master.rid}", "master")
    assert _rows(namesrv)["0"][3] == master.addr  # nothing moved

    started = time.monotonic()
    run = tidemq("admin", "switchover", "-n", namesrv, "-b", GROUP, "--to", str(target.rid)).ok()
    took = time.monotonic() - started
    print(f"switchover to replica {target.rid}: {took:.2f} s ({run.out.strip()})")
    assert f"replica {target.rid} at {target.addr} is master (brokerId 0), was {master.addr}" in run.out
    assert _rows(namesrv)["0"][3] == target.addr

    after = wait_for("clusterList showing the new master of the next epoch with the in-sync set",
                  lambda: (rs if (row := (rs := _rows(namesrv)).get("0")) and len(row) == 7
                           and row[4] == f"master/{target.rid}" and int(row[5]) > epoch and row[6] != "-"
                           else None), 15)
    new_epoch = int(after["0"][5])
    assert str(target.rid) in after["0"][6].split(","), after
    assert _value(target.metrics_url, "tidemq_replica_role", role="master") == 1
    assert _value(target.metrics_url, "tidemq_replica_epoch") == new_epoch
    assert _value(master.metrics_url, "tidemq_replica_switchovers_total") == 1
    wait_for("the old master following the new one", lambda: _value(master.metrics_url, "tidemq_replica_role",
                                                                  role="follower") == 1, 15)

    # A failover: the replica elected after SIGKILL of the new master exports what the doc lists.
    wait_for("every replica back in the in-sync set",
          lambda: (row := _rows(namesrv).get("0")) and len(row) == 7 and row[6] == "0,1,2", 20)
    target.proc.kill()
    survivor = wait_for("another replica registered as brokerId 0",
                     lambda: (a := (_rows(namesrv).get("0") or [None] * 4)[3]) not in (None, target.addr)
                     and by_addr[a], LEASE + 5)
    assert wait_for("a failover duration", lambda: _value(survivor.metrics_url, "tidemq_replica_failover_seconds"),
                 10) < LEASE + 5
    gone = tidemq("admin", "switchover", "-n", namesrv, "-b", GROUP, "--to", str(target.rid))
    assert_clean_failure(gone, f"replica {target.rid} is not an in-sync follower")
    section = doc_section("tidemq_replica_")

    def replica_differences() -> list[str] | None:
        exported = {n: e for n, e in scrape(survivor.metrics_url).items() if n.startswith("tidemq_replica_")}
        diff = differences(section, exported)
        return diff or None

    deadline = time.monotonic() + 15  # the remaining follower reconnects for its lag series
    while (diff := replica_differences()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not diff, "docs/metrics.md and a replica's /metrics disagree:\n" + "\n".join(diff or [])


RESIGN_GROUP = "sw-resign"  # its own group record in the shared etcd


def test_a_replica_that_cannot_listen_for_followers_gives_mastership_up(replica_group):
    """Replica N takes mastership (here by a switchover) while another process holds its
    --ha-listen address: no follower can reach it, so it writes the group record without a
    master and without itself in sync (Elector.resign), another in-sync replica is elected
    within a few seconds and takes sends, the switchover says in a sentence that N did not keep
    mastership, and N, following, rejoins the in-sync set (followers do not listen)."""
    namesrv, replicas = _start(replica_group, RESIGN_GROUP)
    by_addr = {r.addr: r for r in replicas.values()}
    rows = wait_for("a master with all three replicas in sync",
                    lambda: (rs if (row := (rs := _rows(namesrv, RESIGN_GROUP)).get("0")) and len(row) == 7
                             and row[6] == "0,1,2" else None), 30)
    master = by_addr[rows["0"][3]]
    target = next(r for r in replicas.values() if r is not master)
    args = target.proc.args
    ha_host, _, ha_port = args[args.index("--ha-listen") + 1].rpartition(":")
    squatter = socket.socket()
    try:
        squatter.bind((ha_host, int(ha_port)))  # free: a follower does not listen on it
        squatter.listen()
        run = tidemq("admin", "switchover", "-n", namesrv, "-b", RESIGN_GROUP, "--to", str(target.rid), "--timeout", "15")
        assert_clean_failure(run, f"replica {target.rid}", "did not keep it", "--ha-listen")
        elected = by_addr[_rows(namesrv, RESIGN_GROUP)["0"][3]]
        assert elected is not target
        assert "gave mastership of epoch" in target.proc.log() and "--ha-listen" in target.proc.log()
        with SyncProducer("sw-resign", namesrv, ClientConfig(request_timeout=5.0)) as producer:
            tidemq("admin", "updateTopic", "-n", namesrv, "-b", elected.addr, "-t", "ResignTopic",
                   "-r", "1", "-w", "1").ok()
            assert producer.send(Message("ResignTopic", b"after the resignation")).status is SendStatus.SEND_OK
        wait_for(f"replica {target.rid} back in the in-sync set as a follower",
                 lambda: (row := _rows(namesrv, RESIGN_GROUP).get("0")) and len(row) == 7 and row[6] == "0,1,2"
                 and row[3] == elected.addr, 20)
    finally:
        squatter.close()


def test_a_lone_in_sync_replica_that_cannot_listen_keeps_trying_and_serves_once_it_can(replica_group):
    """The only in-sync replica may not give mastership up (no other could be elected without
    an unclean election): it refuses writes, says why in its log, tries its --ha-listen address
    each second, and registers as brokerId 0 and takes sends once the address is free."""
    g = replica_group("sw-lone", 1, LEASE)
    addr = g.master(20)
    proc = g.replicas[addr][0]
    assert proc.stop() == 0
    ha_host, _, ha_port = proc.args[proc.args.index("--ha-listen") + 1].rpartition(":")
    squatter = socket.socket()
    try:
        squatter.bind((ha_host, int(ha_port)))
        squatter.listen()
        proc.start()
        wait_for("the replica saying it keeps trying its --ha-listen address",
                 lambda: "keeps trying to listen" in proc.log(), 15)
        assert g.ids().get("0") is None
    finally:
        squatter.close()
    assert g.master(10) == addr
    assert "listens for its followers on" in proc.log()
    tidemq("admin", "updateTopic", "-n", g.namesrv, "-b", addr, "-t", "LoneTopic", "-r", "1", "-w", "1").ok()
    with SyncProducer("sw-lone", g.namesrv, ClientConfig(request_timeout=5.0)) as producer:
        assert producer.send(Message("LoneTopic", b"at last")).status is SendStatus.SEND_OK
