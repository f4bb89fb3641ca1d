"""TideMQ in bench/compare.py: a name server and one broker (tests.procs.Cluster), driven with the
asyncio client (tidemq.Producer / tidemq.PullConsumer).

Durability: ``--flush async`` (ASYNC_FLUSH: appended to the mapped CommitLog, flushed in the
background) or ``--flush sync`` (SYNC_FLUSH: the answer waits for the flush; group commit).
Topics have 4 queues. Consumers pull up to ``batch`` messages per PULL_MESSAGE (the broker's
default byte cap per pull applies) and commit the queue offset after each pull, as Redis XACKs
and JetStream acks each batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from peerbase import BenchError, Client, Progress
from tests.procs import Cluster
from tests.support.routes import wait_for_route
from tidemq import Admin, Message, Producer, PullConsumer

QUEUES = 4
SEGMENT = 1 << 30  # the broker's default CommitLog segment size


class Running:
    name = "tidemq"

    def __init__(self, root: Path, flush: str) -> None:
        # No retention passes during a run: the store deletes the oldest segment before it
        # expires when its disk-usage probe reads >= 85 %, and on a VM whose root-reserved blocks
        # count as used that fires under a 1 GiB backlog (Redis and NATS delete nothing either).
        self.cluster = Cluster(root, flush=flush, segment_size=SEGMENT,
                               extra_broker_args=["--cleanup-interval", "86400"])
        self.flush = flush

    def start(self) -> "Running":
        try:
            self.cluster.start()
        except (TimeoutError, RuntimeError) as exc:
            self.cluster.stop()
            raise BenchError(f"TideMQ did not start: {exc}\n{self.cluster.broker.log()[-2000:]}") from None
        return self

    @property
    def pid(self) -> int:
        assert self.cluster.broker.proc is not None
        return self.cluster.broker.proc.pid

    @property
    def spec(self) -> dict:
        return {"namesrv": self.cluster.namesrv_addr}

    def durability(self) -> str:
        return "ASYNC_FLUSH" if self.flush == "async" else "SYNC_FLUSH (group commit)"

    def stop(self) -> None:
        self.cluster.stop()


async def wait_for_cluster(admin: Admin, cluster: str, timeout: float = 30.0) -> None:
    """The broker answers /readyz before its first registration reaches the name server."""
    deadline = time.monotonic() + timeout
    while True:
        info = await admin.cluster_info()
        if info.cluster_addr_table.get(cluster):
            return
        if time.monotonic() > deadline:
            raise BenchError(f"cluster {cluster} did not register with the name server in {timeout:g} s")
        await asyncio.sleep(0.1)


class TideMQClient(Client):
    name = "tidemq"

    async def open(self, topics: list[str]) -> None:
        ns = self.spec["namesrv"]
        if topics:
            async with Admin(ns) as admin:
                await wait_for_cluster(admin, "DefaultCluster")
                for t in topics:
                    await admin.create_topic(t, QUEUES, QUEUES, cluster="DefaultCluster")
                for t in topics:
                    await wait_for_route(admin, t, QUEUES)
        self.producer = Producer("bench-producer", name_servers=[ns])
        await self.producer.start()
        self.consumers: list[PullConsumer] = []

    async def close(self) -> None:
        for c in self.consumers:
            await c.close()
        await self.producer.close()

    async def _consumer(self, group: str) -> PullConsumer:
        c = PullConsumer(group, name_servers=[self.spec["namesrv"]])
        await c.start()
        self.consumers.append(c)
        return c

    async def send(self, topic: str, body: bytes) -> None:
        await self.producer.send(Message(topic, body))

    async def send_batch(self, topic: str, bodies: list[bytes]) -> None:
        await self.producer.send_batch([Message(topic, b) for b in bodies])

    async def consume(self, topic: str, group: str, total: int, concurrency: int, batch: int,
                      progress: Progress) -> tuple[int, int, float]:
        c = await self._consumer(group)
        queues = await c.fetch_queues(topic)
        ends = [await c.max_offset(mq) for mq in queues]
        if sum(ends) < total:
            raise BenchError(f"TideMQ holds {sum(ends)} messages in {topic}, expected {total}")
        count = nbytes = 0
        last = 0.0
        t0 = time.perf_counter()

        async def loop(mq, end: int) -> None:  # noqa: ANN001 (MessageQueue)
            nonlocal count, nbytes, last
            offset = 0
            while offset < end:
                r = await c.pull(mq, offset, batch)
                n = len(r.messages)
                nbytes += sum(len(m.body) for m in r.messages)
                offset = r.next_begin_offset
                await c.commit(mq, offset)
                count += n
                last = time.perf_counter()
                progress(count)

        # one loop per queue, at most `concurrency` at a time (4 queues, 4 loops)
        sem = asyncio.Semaphore(concurrency)

        async def bounded(mq, end: int) -> None:  # noqa: ANN001
            async with sem:
                await loop(mq, end)

        await asyncio.gather(*(bounded(mq, e) for mq, e in zip(queues, ends)))
        return count, nbytes, last - t0

    async def fanout(self, topic: str, groups: list[str], batch: int, deadline: float) -> int:
        total = 0

        async def group_loop(group: str) -> None:
            nonlocal total
            c = await self._consumer(group)
            queues = await c.fetch_queues(topic)
            ends = [await c.max_offset(mq) for mq in queues]
            offsets = [0] * len(queues)
            while time.perf_counter() < deadline and any(o < e for o, e in zip(offsets, ends)):
                for i, mq in enumerate(queues):  # one loop per group, round-robin over queues
                    if offsets[i] >= ends[i]:
                        continue
                    r = await c.pull(mq, offsets[i], batch)
                    offsets[i] = r.next_begin_offset
                    await c.commit(mq, offsets[i])
                    total += len(r.messages)

        await asyncio.gather(*(group_loop(g) for g in groups))
        return total

    async def latency_consume(self, topic: str, group: str, record: Callable[[bytes], None],
                              stop: asyncio.Event) -> None:
        c = await self._consumer(group)
        queues = await c.fetch_queues(topic)
        offsets = {mq: await c.max_offset(mq) for mq in queues}

        async def poll(mq) -> None:  # noqa: ANN001
            while not stop.is_set():  # long polling: the broker answers as soon as a message arrives
                r = await c.pull(mq, offsets[mq], 32, suspend_ms=1000)
                for m in r.messages:
                    record(m.body)
                offsets[mq] = r.next_begin_offset

        async def commit() -> None:  # offsets committed once a second, like the push consumer
            while not stop.is_set():
                await asyncio.sleep(1.0)
                for mq, off in list(offsets.items()):
                    await c.commit(mq, off)

        tasks = [asyncio.ensure_future(poll(mq)) for mq in queues] + [asyncio.ensure_future(commit())]
        try:
            await stop.wait()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


CLIENT = TideMQClient
