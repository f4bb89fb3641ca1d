"""Registration scales (issue 14): real name server and broker processes.

- A broker whose topic table is more than 16 MiB as JSON (48,000 topics with 127-byte names)
  stays routed: it registers compressed (RocketMQ 4.9's RegisterBrokerBody form). Before, the
  JSON body exceeded the name server's 16 MiB frame limit, the name server closed the connection
  and the broker was never in any route (logged only as "not reachable yet").
- A registration over --register-max-body goes out as several requests of whole topics that the
  name server merges; the broker's log says so on every round.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import pytest

from tests.procs import ServerProcess, free_port, tidemq_cmd
from tests.support.waiting import wait_until
from tidemq.broker.register import encode_json
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode


def write_topics(store: Path, names: list[str]) -> None:
    """A topics.json the broker loads at start (as a broker that created these topics wrote it)."""
    table = {n: {"topicName": n, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6,
                 "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False} for n in names}
    config = store / "config"
    config.mkdir(parents=True)
    (config / "topics.json").write_text(json.dumps(
        {"topicConfigTable": table, "dataVersion": {"counter": 1, "timestamp": 1700000000000}}))


def names(count: int, length: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + "_-"
    return [f"{i:06d}" + "".join(rnd.choice(alphabet) for _ in range(length - 6)) for i in range(count)]


def start(root: Path, *broker_args: str) -> tuple[ServerProcess, ServerProcess, str]:
    ns_port, ns_m, b_port, b_m = free_port(), free_port(), free_port(), free_port()
    ns = ServerProcess(tidemq_cmd("namesrv", "--listen", f"127.0.0.1:{ns_port}",
                                  "--metrics-listen", f"127.0.0.1:{ns_m}"),
                       root / "namesrv.log", f"http://127.0.0.1:{ns_m}/readyz").start()
    broker = ServerProcess(
        tidemq_cmd("broker", "--namesrv", f"127.0.0.1:{ns_port}", "--listen", f"127.0.0.1:{b_port}",
                   "--store", str(root / "store"), "--segment-size", str(4 << 20),
                   "--metrics-listen", f"127.0.0.1:{b_m}", *broker_args),
        root / "broker.log", f"http://127.0.0.1:{b_m}/readyz")
    try:
        broker.start()
    except BaseException:
        ns.stop()
        raise
    return ns, broker, f"127.0.0.1:{ns_port}"


async def routable(ns: str, topics: list[str]) -> bool:
    """Whether the name server has a route for every topic of ``topics``."""
    client = RemotingClient()
    try:
        for t in topics:
            resp = await client.invoke(ns, RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": t}), 5.0)
            if resp.code != ResponseCode.SUCCESS:
                return False
        return True
    finally:
        await client.close()


async def all_topics(ns: str) -> set[str]:
    client = RemotingClient()
    try:
        resp = await client.invoke(ns, RemotingCommand.request(
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), 10.0)
        return set(json.loads(resp.body_bytes())["topicList"])
    finally:
        await client.close()


async def test_broker_with_more_than_16_mib_of_topic_json_stays_routed(tmp_path) -> None:
    topics = names(48_000, 127, seed=14)
    table = {t: {"topicName": t, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6,
                 "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False} for t in topics}
    # The JSON form (all a broker sent before) does not fit in a name server's 16 MiB frame.
    assert len(encode_json(table, {"counter": 1, "timestamp": 1})) > 16 * 1024 * 1024
    write_topics(tmp_path / "store", topics)
    ns, broker, addr = start(tmp_path)
    try:
        sample = [topics[0], topics[len(topics) // 2], topics[-1]]
        await wait_until(lambda: routable(addr, sample), "the topics to be routable", timeout=120, interval=0.5)
        assert set(topics) <= await all_topics(addr)
        log = broker.log()
        assert "registered broker-a" in log, log[-2000:]
        assert "48006 topics in 1 request(s)" in log and "(compressed)" in log, log[-2000:]
        assert "closing connection" not in ns.log()
    finally:
        broker.stop()
        ns.stop()


async def test_registration_over_the_limit_is_split_and_merged(tmp_path) -> None:
    topics = names(3000, 100, seed=15)  # random names: ~200 KB compressed
    write_topics(tmp_path / "store", topics)
    ns, broker, addr = start(tmp_path, "--register-max-body", "65536", "--register-interval", "1")
    try:
        async def every_topic() -> bool:
            return set(topics) <= await all_topics(addr)

        await wait_until(every_topic, "every topic to be routable", timeout=60, interval=0.5)
        await wait_until(lambda: broker.log().count("over the 65536-byte limit") >= 2, "two rounds logged",
                         timeout=30, interval=0.5)
        line = next(x for x in broker.log().splitlines() if "over the 65536-byte limit" in x)
        assert "3006 topics" in line and "requests of whole topics" in line
        assert "closing connection" not in ns.log()
    finally:
        broker.stop()
        ns.stop()


@pytest.mark.parametrize("args", [["--compressed-register"], ["--config", "broker.conf"]])
async def test_compressed_register_sends_small_registrations_compressed(tmp_path, args) -> None:
    topics = names(10, 20, seed=16)
    write_topics(tmp_path / "store", topics)
    (tmp_path / "broker.conf").write_text("compressedRegister=true\n")  # RocketMQ's key
    args = [str(tmp_path / a) if a == "broker.conf" else a for a in args]
    ns, broker, addr = start(tmp_path, *args)
    try:
        await wait_until(lambda: routable(addr, topics), "the topics to be routable", timeout=30, interval=0.5)
        assert "(compressed)" in broker.log()
    finally:
        broker.stop()
        ns.stop()
