"""Damaged store files, real broker processes: recovery repairs what it can prove and refuses what it
cannot, with a message naming the file; it never serves corrupt data and never silently drops
valid records (the Jepsen/NATS lesson: corruption in the middle must not truncate what follows).

Covered: garbage after the CommitLog tail, a zeroed ConsumeQueue file, a missing checkpoint, a
truncated topics.json (its .bak is loaded; both damaged refuse), and one flipped bit in a record with a thousand valid records after it.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import pytest

from tidemq.message import MESSAGE_MAGIC, decode_record_header
from tidemq.remoting import RemotingClient, ResponseCode
from tests.broker.chaos import Ledger, check
from tests.broker.test_broker_protocol import send_cmd

QUEUES = 2


async def _produce(c, topic: str, n: int, prefix: str, ledger: Ledger) -> None:
    cl = RemotingClient()
    try:
        for i in range(n):
            body = f"{prefix}-{i}-".encode() + bytes(40)
            ledger.sent.add(body)
            r = await cl.invoke(c.broker_addr, send_cmd(topic, body, queue_id=i % QUEUES), 3)
            assert r.code == ResponseCode.SUCCESS, r.remark
            ledger.acked[body] = (int(r.ext_fields["queueId"]), int(r.ext_fields["queueOffset"]))
    finally:
        await cl.close()


async def _verify(c, topic: str, ledger: Ledger) -> None:
    res = await check(c.broker_addr, topic, QUEUES, ledger)
    print(res.summary(ledger))
    assert not res.lost and not res.misplaced
    assert res.duplicates == res.gaps == res.phantoms == 0
    assert len(res.stored) == len(ledger.acked)


def _segments(c) -> list[Path]:
    """CommitLog segments holding data (pre-created empty ones skipped)."""
    return [s for s in sorted((c.store_dir / "commitlog").iterdir()) if s.read_bytes()[:4] != bytes(4)]


def _records(segment: Path) -> list[tuple[int, int, object]]:
    """(file position, size, header) of every record of a segment."""
    data = segment.read_bytes()
    out, pos = [], 0
    while pos + 8 <= len(data):
        total = int.from_bytes(data[pos:pos + 4], "big", signed=True)
        if total <= 0 or int.from_bytes(data[pos + 4:pos + 8], "big") != MESSAGE_MAGIC:
            break
        out.append((pos, total, decode_record_header(data, pos)))
        pos += total
    return out


def _refuses_to_start(c) -> str:
    with pytest.raises(RuntimeError, match="exited"):
        c.broker.start()
    assert c.broker.proc.returncode != 0
    return c.broker.log()


@pytest.fixture
async def loaded(cluster_factory):
    c = cluster_factory(flush="sync", segment_size=4 << 20)
    topic = f"cor_{uuid.uuid4().hex[:6]}"
    c.create_topic(topic, queues=QUEUES)
    ledger = Ledger()
    await _produce(c, topic, 1500, "before", ledger)
    return c, topic, ledger


async def test_garbage_after_the_commitlog_tail_is_cut_after_a_crash(loaded):
    c, topic, ledger = loaded
    c.broker.kill()
    seg = _segments(c)[-1]
    pos, size, _h = _records(seg)[-1]
    with open(seg, "r+b") as f:
        f.seek(pos + size)
        f.write(os.urandom(3000))
    c.broker.start()
    assert "truncated the commitlog" in c.broker.log()
    await _verify(c, topic, ledger)
    await _produce(c, topic, 10, "after", ledger)
    await _verify(c, topic, ledger)


async def test_a_zeroed_consume_queue_file_is_rebuilt(loaded):
    c, topic, ledger = loaded
    c.broker.stop()
    cq = sorted((c.store_dir / "consumequeue" / topic / "0").iterdir())[-1]
    cq.write_bytes(bytes(cq.stat().st_size))
    c.broker.start()
    log = c.broker.log()
    assert f"consume queue {topic}/0 is damaged" in log and "rebuilt from the commitlog" in log
    await _verify(c, topic, ledger)
    await _produce(c, topic, 10, "after", ledger)  # queue offsets continue where they were
    await _verify(c, topic, ledger)


async def test_a_missing_checkpoint_means_a_full_replay(loaded):
    c, topic, ledger = loaded
    c.broker.kill()
    (c.store_dir / "checkpoint").unlink()
    c.broker.start()
    await _verify(c, topic, ledger)
    await _produce(c, topic, 10, "after", ledger)
    await _verify(c, topic, ledger)


async def test_a_truncated_topics_json_loads_its_backup_and_refuses_when_both_are_damaged(loaded):
    """topics.json keeps the previous version as topics.json.bak (RocketMQ's ConfigManager): a
    damaged file loads the backup with a warning; with both damaged the start is refused, naming them."""
    c, topic, ledger = loaded
    c.create_topic(f"{topic}_later", queues=1)  # another write: the backup holds `topic` too
    c.broker.stop()
    path = c.store_dir / "config" / "topics.json"
    bak = path.with_name("topics.json.bak")
    data, bak_data = path.read_bytes(), bak.read_bytes()
    assert topic.encode() in bak_data
    path.write_bytes(data[: len(data) // 2])
    c.broker.start()
    log = c.broker.log()
    assert f"{path} is not valid JSON" in log and f"loaded the previous version from {bak}" in log
    await _verify(c, topic, ledger)
    c.broker.stop()
    path.write_bytes(data[: len(data) // 2])
    bak.write_bytes(bak_data[:10])
    log = _refuses_to_start(c)
    assert str(path) in log and str(bak) in log and "unusable too" in log
    path.write_bytes(data)  # the operator restores it: everything is back
    c.broker.start()
    await _verify(c, topic, ledger)


async def test_a_corrupt_record_in_the_middle_refuses_the_start_and_keeps_the_records_after_it(loaded):
    c, topic, ledger = loaded
    c.broker.stop()
    seg = _segments(c)[-1]
    recs = _records(seg)
    pos, size, h = recs[len(recs) - 1001]  # a thousand valid records follow it
    offset = int(seg.name) + pos
    with open(seg, "r+b") as f:  # flip one bit of the body
        f.seek(pos + h.body_start + 3)
        b = f.read(1)[0]
        f.seek(pos + h.body_start + 3)
        f.write(bytes([b ^ 0x10]))
    before = hashlib.sha256(seg.read_bytes()).hexdigest()
    for _ in range(2):  # clean shutdown, then again after the failed (crashed) start
        log = _refuses_to_start(c)
        assert str(seg) in log and f"at offset {offset}" in log and "corrupt in the middle" in log
        assert "body CRC" in log
        assert hashlib.sha256(seg.read_bytes()).hexdigest() == before, "recovery changed the segment"
    print(log.strip().splitlines()[-1])
