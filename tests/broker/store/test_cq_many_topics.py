"""Topic count never exhausts descriptors or mappings (issue 14): a store with tens of thousands of
topics writes, shuts down and loads again in a fresh process under a low RLIMIT_NOFILE.

Each phase runs in a subprocess (the limit is per process and cannot be raised back): the writer
puts one message into each topic's queue 0, reads a sample back and shuts down; the reader loads
the store it left, reads every queue back and shuts down. Both check that the mapped consume-queue
files never exceed the bound, by the store's counter and by the kernel's own list of mappings.
Before the bound, every consume-queue file stayed mapped (one descriptor each on Python < 3.13):
the writer got "Too many open files" from topic ~245 on, and the store could not load.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tidemq.broker.store.mapped_file import MAPPING_HOLDS_FD

NOFILE = 256  # far below the topic count: every mapped file must be given back
BOUND = 48

_PHASE = textwrap.dedent(r"""
    import asyncio, json, os, random, resource, sys
    from pathlib import Path

    from tidemq.message import decode_record
    from tidemq.broker.store.config import StoreConfig
    from tidemq.broker.store.store import GetStatus, MessageStore, PutRequest

    phase, root, topics, nofile, bound = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

    def cq_mappings():
        with open("/proc/self/maps") as fh:
            return sum(1 for line in fh if "/consumequeue/" in line)

    def cfg():
        kw = dict(root=root, commitlog_segment_size=64 << 20, consume_queue_units_per_file=4,
                  index_hash_slots=1024, index_max_entries=4096, logics_flush_interval=3600.0,
                  cleanup_interval=3600.0)
        if bound != "default":
            kw["max_mapped_queue_files"] = int(bound)
        return StoreConfig(**kw)

    def body(i):
        return f"m{i}".encode()

    def read_one(store, i):
        r = store.get_messages(f"t{i}", 0, 0, 4, None)
        assert r.status is GetStatus.FOUND and r.message_count == 1, (i, r)
        m = decode_record(r.records[0])
        assert (m.topic, m.queue_offset, m.body) == (f"t{i}", 0, body(i)), (i, m)

    async def main():
        store = MessageStore(cfg())
        store.load()
        await store.start()
        limit = store.stats()["cq_files_mapped_limit"]
        most = 0
        if phase == "write":
            for i in range(topics):
                r = store.put(PutRequest(f"t{i}", 0, body(i), {}))
                assert r.status.name == "PUT_OK", (i, r)
                if i % 997 == 0:
                    most = max(most, cq_mappings())
            for i in random.Random(7).sample(range(topics), 500):
                read_one(store, i)
        else:
            assert len(store.topics()) == topics
            for i in range(topics):
                read_one(store, i)
                if i % 997 == 0:
                    most = max(most, cq_mappings())
        most = max(most, cq_mappings())
        st = store.stats()
        await store.shutdown()
        print(json.dumps({"limit": limit, "peak": st["cq_files_mapped_peak"], "mapped": st["cq_files_mapped"],
                          "maps": st["cq_file_maps"], "kernel_most": most, "queues": st["queues"]}))

    asyncio.run(main())
""")


def _phase(phase: str, root, topics: int, bound: str, timeout: float) -> dict:
    p = subprocess.run([sys.executable, "-c", _PHASE, phase, str(root), str(topics), str(NOFILE), bound],
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{phase} phase failed:\n{p.stderr[-4000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def _many_topics(tmp_path, topics: int, timeout: float) -> None:
    root = tmp_path / "store"
    w = _phase("write", root, topics, str(BOUND), timeout)
    assert w["queues"] == topics and w["maps"] >= topics
    assert w["limit"] == BOUND and w["peak"] == BOUND and w["kernel_most"] <= BOUND
    # A restart in a fresh process, same low limit, default bound: fitted under the descriptors.
    r = _phase("read", root, topics, "default", timeout)
    assert r["queues"] == topics
    assert r["peak"] <= r["limit"] and r["kernel_most"] <= r["limit"]
    if MAPPING_HOLDS_FD:
        assert r["limit"] == NOFILE // 4


@pytest.mark.slow  # ~15-30 s: the default suite's 15-minute budget
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts mappings in /proc/self/maps")
def test_20k_topics_work_and_restart_under_256_descriptors(tmp_path):
    _many_topics(tmp_path, 20_000, timeout=120)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts mappings in /proc/self/maps")
def test_100k_topics_work_and_restart_under_256_descriptors(tmp_path):
    _many_topics(tmp_path, 100_000, timeout=600)
