"""D8 (style-and-reliability.md B7): a real broker that cannot grow its files answers sends with
SERVICE_NOT_AVAILABLE (14) and a remark naming the failing file, keeps serving reads, corrupts
nothing, and accepts writes again once space is back.

"Disk full" is the kernel's own error: ``prlimit(RLIMIT_FSIZE)`` on the running broker below the
segment size makes creating the next CommitLog segment fail with EFBIG (CPython ignores
SIGXFSZ). The 75 % / 85 % / 90 % usage thresholds are covered with an injected disk-usage probe in
tests/broker/store/test_retention.py.
"""

from __future__ import annotations

import resource
import uuid

import pytest

from tidemq.remoting import RemotingClient, ResponseCode
from tests.broker.chaos import Ledger, check
from tests.broker.test_broker_protocol import send_cmd

SEGMENT = 256 * 1024
QUEUES = 2

pytestmark = pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs Linux prlimit")


async def _send_until_refused(addr: str, topic: str, ledger: Ledger, limit: int) -> list:
    cl = RemotingClient()
    refusals = []
    try:
        for i in range(limit):
            body = f"df-{len(ledger.sent)}-".encode() + bytes(100)
            ledger.sent.add(body)
            r = await cl.invoke(addr, send_cmd(topic, body, queue_id=i % QUEUES), 3)
            if r.code == ResponseCode.SUCCESS:
                ledger.acked[body] = (int(r.ext_fields["queueId"]), int(r.ext_fields["queueOffset"]))
                continue
            if r.code == ResponseCode.FLUSH_DISK_TIMEOUT:  # stored, durability unknown: a slow disk, not full
                ledger.indeterminate.add(body)
                continue
            ledger.failed += 1
            refusals.append((r.code, r.remark))
            if len(refusals) >= 3:
                break
    finally:
        await cl.close()
    return refusals


async def test_sends_are_refused_when_files_cannot_grow_and_resume_after(cluster_factory):
    c = cluster_factory(flush="sync", segment_size=SEGMENT)
    topic = f"df_{uuid.uuid4().hex[:6]}"
    c.create_topic(topic, queues=QUEUES)
    ledger = Ledger()
    assert not await _send_until_refused(c.broker_addr, topic, ledger, QUEUES)  # queue files exist
    pid = c.broker.proc.pid
    old = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (SEGMENT // 2, old[1]))
    try:
        refusals = await _send_until_refused(c.broker_addr, topic, ledger, 20_000)
        assert refusals, "the broker never refused a send"
        assert len(ledger.acked) > SEGMENT // 200  # the segments that existed were used
        code, remark = refusals[0]
        print(f"acked {len(ledger.acked)} before the first refusal: code {code}: {remark}")
        assert code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert "File too large" in remark and "commitlog" in remark
        res = await check(c.broker_addr, topic, QUEUES, ledger)  # reads keep working
        assert not res.lost and not res.misplaced and res.duplicates == res.gaps == res.phantoms == 0
    finally:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, old)
    more = await _send_until_refused(c.broker_addr, topic, ledger, 200)
    assert not more, f"writes did not resume once files could grow: {more[:1]}"
    c.broker.kill()  # no partial record: a crash recovery finds every acknowledged message
    c.broker.start()
    res = await check(c.broker_addr, topic, QUEUES, ledger)
    print(res.summary(ledger))
    assert not res.lost and not res.misplaced and res.duplicates == res.gaps == res.phantoms == 0
    assert set(res.stored.values()) - set(ledger.acked) <= ledger.indeterminate  # nothing refused was stored
