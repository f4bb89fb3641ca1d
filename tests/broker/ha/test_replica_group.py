"""A replicated broker group on real processes (issue 17, step 4a): a name server, etcd and three
`tidemq broker --coordination etcd://...` replicas of one group. Exactly one becomes master and
registers brokerId 0, the others register 1..n and replicate its CommitLog byte for byte; after
SIGKILL of the master another replica registers brokerId 0 within the lease + 5 s and accepts
sends. (The sync acknowledgement wait is the next step: here acknowledgement is the master's.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.cli.clirun import tidemq
from tests.procs import ServerProcess, free_port, tidemq_cmd
from tidemq.client import ClientConfig
from tidemq.client.send import SendStatus
from tidemq.client.sync import SyncProducer
from tidemq.message import Message

LEASE = 3.0  # s: short, so the failover fits the suite's budget
GROUP = "rg-broker"
TOPIC = "ReplicaTopic"


def _rows(namesrv: str) -> list[list[str]]:
    run = tidemq("admin", "clusterList", "-n", namesrv)
    return [line.split() for line in run.lines()[1:]] if run.rc == 0 else []


def _ids(namesrv: str) -> dict[str, str]:
    """brokerId -> address of the group, as the name server routes it."""
    return {r[2]: r[3] for r in _rows(namesrv) if len(r) >= 4 and r[1] == GROUP}


def _wait(what: str, check, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.2)


def _commitlog(store: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((store / "commitlog").iterdir()))


@pytest.fixture
def group(etcd, tmp_path, monkeypatch):
    monkeypatch.setenv("TIDEMQ_BROKER_SEGMENT_SIZE", str(1 << 20))
    ns_port, ns_metrics = free_port(), free_port()
    procs: list[ServerProcess] = [ServerProcess(
        tidemq_cmd("namesrv", "--listen", f"127.0.0.1:{ns_port}", "--metrics-listen", f"127.0.0.1:{ns_metrics}"),
        tmp_path / "namesrv.log", f"http://127.0.0.1:{ns_metrics}/readyz")]
    namesrv = f"127.0.0.1:{ns_port}"
    replicas = {}
    for rid in range(3):
        port, ha, metrics = free_port(), free_port(), free_port()
        store = tmp_path / f"store-{rid}"
        procs.append(ServerProcess(tidemq_cmd(
            "broker", "-n", namesrv, "--listen", f"127.0.0.1:{port}", "--store", str(store),
            "--cluster", "RC", "--broker-name", GROUP, "--coordination", f"etcd://{etcd.endpoint}",
            "--replica-id", str(rid), "--ha-listen", f"127.0.0.1:{ha}", "--lease-seconds", str(LEASE),
            "--metrics-listen", f"127.0.0.1:{metrics}"),
            tmp_path / f"broker-{rid}.log", f"http://127.0.0.1:{metrics}/readyz"))
        replicas[f"127.0.0.1:{port}"] = (procs[-1], store)
    try:
        for p in procs:
            p.start()
        yield namesrv, replicas
    finally:
        for p in procs:
            p.stop()


def test_one_master_replicates_and_a_killed_master_is_replaced_within_the_lease(group):
    namesrv, replicas = group
    ids = _wait("one master and two followers registered",
                lambda: (i if "0" in (i := _ids(namesrv)) and len(i) == 3 else None), 20)
    master = ids["0"]
    assert master in replicas and len(set(ids.values())) == 3, ids
    # Metadata rides the replicated log (ha/metalog.py): the topic is created through the master.
    tidemq("admin", "updateTopic", "-n", namesrv, "-b", master, "-t", TOPIC, "-r", "2", "-w", "2").ok()
    with SyncProducer("rg-pg", namesrv, ClientConfig(request_timeout=5.0)) as producer:
        for i in range(30):
            assert producer.send(Message(TOPIC, f"m{i}".encode() * 50)).status is SendStatus.SEND_OK

    master_store = replicas[master][1]
    expected = _commitlog(master_store)
    assert expected.strip(b"\0"), "the master stored nothing"
    for addr, (_p, store) in replicas.items():
        if addr != master:
            _wait(f"replica {addr}'s CommitLog byte-identical to the master's",
                  lambda store=store: _commitlog(store) == expected, 15)

    replicas[master][0].kill()
    killed = time.monotonic()
    new_master = _wait("another replica registered as brokerId 0",
                       lambda: (a := _ids(namesrv).get("0")) not in (None, master) and a, LEASE + 5)
    took = time.monotonic() - killed
    print(f"failover: {new_master} registered brokerId 0 {took:.2f} s after SIGKILL of {master}")
    assert new_master in replicas and took <= LEASE + 5
    with SyncProducer("rg-pg2", namesrv, ClientConfig(request_timeout=5.0)) as producer:
        assert producer.send(Message(TOPIC, b"after failover")).status is SendStatus.SEND_OK
    assert b"after failover" in _commitlog(replicas[new_master][1])
