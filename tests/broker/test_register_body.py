"""The broker's REGISTER_BROKER bodies (tidemq.broker.register): both forms decode with the name
server's codec (tidemq.namesrv.bodies), compression as RocketMQ 4.9, and registrations larger than
the limit split into parts that a name server merges."""

from __future__ import annotations

import random
import string
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.broker import register
from tidemq.broker.config import BrokerConfig
from tidemq.broker.register import (
    COMPRESS_ABOVE,
    NamesrvRegistrar,
    encode_compressed,
    encode_json,
    plan_registration,
)
from tidemq.broker.store.config import StoreConfig
from tidemq.broker.topics import TopicConfig, TopicConfigManager
from tidemq.namesrv import RouteInfoManager
from tidemq.namesrv.bodies import parse_register_body

VERSION = {"counter": 7, "timestamp": 1700000000000}


def cfg(name: str, read: int = 4, write: int = 4, perm: int = 6) -> dict:
    return {"topicName": name, "readQueueNums": read, "writeQueueNums": write, "perm": perm,
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}


def table(n: int, name_len: int = 20, seed: int = 1) -> dict[str, dict]:
    rnd = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + "_-"
    out = {}
    for i in range(n):
        name = f"{i:06d}" + "".join(rnd.choice(alphabet) for _ in range(name_len - 6))
        out[name] = cfg(name, 1 + i % 16, 1 + i % 8)
    return out


def test_json_form_decodes_with_the_name_server_codec() -> None:
    topics = table(5)
    body = parse_register_body(encode_json(topics, VERSION))
    assert body.topic_configs == topics
    assert body.data_version == VERSION


def test_compressed_form_is_rocketmq_4_9_layout_and_decodes() -> None:
    topics = {"TopicTest": cfg("TopicTest", 8, 2, 7)}
    raw = zlib.decompress(encode_compressed(topics, VERSION))
    dv = b'{"counter":7,"timestamp":1700000000000}'
    line = b"TopicTest 8 2 7 SINGLE_TAG"
    assert raw == (len(dv).to_bytes(4, "big") + dv + (1).to_bytes(4, "big")
                   + len(line).to_bytes(4, "big") + line + (2).to_bytes(4, "big") + b"[]")
    body = parse_register_body(encode_compressed(topics, VERSION), compressed=True)
    assert body.data_version == VERSION
    assert body.topic_configs["TopicTest"]["readQueueNums"] == 8
    assert body.topic_configs["TopicTest"]["perm"] == 7


@settings(max_examples=50)
@given(st.dictionaries(st.from_regex(r"[%|a-zA-Z0-9_-]{1,127}", fullmatch=True),
                       st.tuples(st.integers(0, 1024), st.integers(0, 1024), st.sampled_from([2, 4, 6, 7])),
                       max_size=20),
       st.integers(0, 2**40), st.booleans())
def test_round_trip_through_the_name_server_codec(raw: dict, counter: int, compressed: bool) -> None:
    topics = {n: cfg(n, r, w, p) for n, (r, w, p) in raw.items()}
    version = {"counter": counter, "timestamp": 5}
    body = encode_compressed(topics, version) if compressed else encode_json(topics, version)
    decoded = parse_register_body(body, compressed)
    assert decoded.data_version == version
    assert {n: (c["readQueueNums"], c["writeQueueNums"], c["perm"]) for n, c in decoded.topic_configs.items()} \
        == {n: (r, w, p) for n, (r, w, p) in raw.items()}


def test_small_registration_is_one_json_body() -> None:
    plan = plan_registration(table(10), VERSION, max_body=1 << 20)
    assert len(plan.bodies) == 1 and not plan.compressed and not plan.split
    assert plan.body_bytes == plan.json_bytes == len(plan.bodies[0])


def test_compressed_register_compresses_small_bodies_too() -> None:
    plan = plan_registration(table(10), VERSION, max_body=1 << 20, compressed=True)
    assert plan.compressed and len(plan.bodies) == 1
    assert set(parse_register_body(plan.bodies[0], True).topic_configs) == set(table(10))


def test_json_over_the_threshold_goes_compressed() -> None:
    topics = table(COMPRESS_ABOVE // 150 + 100, name_len=60)
    plan = plan_registration(topics, VERSION, max_body=16 << 20)
    assert plan.json_bytes > COMPRESS_ABOVE
    assert plan.compressed and len(plan.bodies) == 1 and plan.body_bytes < plan.json_bytes


def test_registration_over_the_limit_is_split_into_parts_that_merge() -> None:
    topics = table(3000, name_len=100)  # random names: ~80 KB compressed
    plan = plan_registration(topics, VERSION, max_body=20_000, compressed=True)
    assert plan.split and all(len(b) <= 20_000 for b in plan.bodies)
    parts = [parse_register_body(b, True) for b in plan.bodies]
    assert all(p.data_version == VERSION for p in parts)
    names = [n for p in parts for n in p.topic_configs]
    assert sorted(names) == sorted(topics) and len(names) == len(set(names))
    # A name server merges the parts: every topic is routable.
    rim = RouteInfoManager(lambda: 1000.0)
    for p in parts:
        rim.register_broker("C", "broker-a", "10.0.0.5:10911", 0, p.topic_configs, p.data_version)
    assert rim.topic_count == 3000


def test_split_is_bounded_by_what_a_name_server_inflates(monkeypatch) -> None:
    monkeypatch.setattr(register, "MAX_INFLATED", 50_000)
    topics = table(2000, name_len=10, seed=3)
    plan = plan_registration(topics, VERSION, max_body=1 << 20, compressed=True)
    assert plan.split
    assert all(len(zlib.decompress(b)) <= 50_000 for b in plan.bodies)


def test_nothing_fits_gives_no_bodies() -> None:
    plan = plan_registration(table(3), VERSION, max_body=40)
    assert plan.bodies == () and plan.topics == 3


async def test_a_registration_that_fits_nowhere_is_an_error_every_round(tmp_path, caplog) -> None:
    """Never silently out of routing: nothing is sent, and each round says why and what to do."""
    topics = TopicConfigManager(tmp_path / "topics.json")
    for name in table(50):
        topics.put(TopicConfig(name, 4, 4))
    cfg = BrokerConfig(store=StoreConfig(root=tmp_path), namesrv_addrs=("127.0.0.1:1",), register_max_body=100)
    registrar = NamesrvRegistrar(settings=lambda: cfg, topics=topics)

    with caplog.at_level("ERROR", logger="tidemq.broker.register"):
        try:
            assert [await registrar.register_all() for _ in range(2)] == [0, 0]
        finally:
            await registrar.client.close()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 2 and registrar.rounds_not_sent == 2 and registrar.parts == 0
    assert "NOT registered" in errors[0] and "50 topics" in errors[0] and "100-byte limit" in errors[0]
    assert "--register-max-body" in errors[0]
