"""NATS JetStream in bench/compare.py: ``nats-server -js`` with file storage, driven with nats-py.

Durability: JetStream file storage as configured by default (async rows). For sync rows the
server config gets ``jetstream { sync_interval: always }`` (fsync on every write) when the
installed nats-server accepts it (the key arrived in 2.10); nats-server 2.9 (Debian 12) rejects
it, and then the sync rows run the default storage and are marked as weaker durability
(:func:`sync_supported`).

One stream per topic (subject = topic name). Sends are ``js.publish`` (waits for the PubAck);
"256 in flight" is 256 concurrent ``js.publish``; batches are 64 ``js.publish_async`` then one
wait for their acks. Consumers are durable pull consumers with ``AckPolicy.ALL``: each fetch of
n messages is acknowledged by acking its last message (JetStream's batch ack, like XACK of a
batch). The latency consumer is a push subscription with explicit acks (NATS' low-latency path).
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from peerbase import BenchError, Client, Progress, Server, free_port, wait_port

_SYNC_SUPPORTED: bool | None = None
STALL = 20.0  # seconds without a message before a backlog read gives up


def version() -> str:
    try:
        out = subprocess.run(["nats-server", "--version"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return "?"
    return out.strip().split()[-1] if out.strip() else "?"


def sync_supported() -> bool:
    """Whether this nats-server accepts ``sync_interval: always`` (checked once with ``-t``)."""
    global _SYNC_SUPPORTED
    if _SYNC_SUPPORTED is None:
        with tempfile.TemporaryDirectory() as d:
            conf = Path(d) / "t.conf"
            conf.write_text(f'listen: 127.0.0.1:4222\njetstream {{ store_dir: "{d}", sync_interval: always }}\n')
            r = subprocess.run(["nats-server", "-c", str(conf), "-t"], capture_output=True, timeout=20)
            _SYNC_SUPPORTED = r.returncode == 0
    return _SYNC_SUPPORTED


def stream_name(topic: str) -> str:
    return topic.upper().replace("-", "_")


class Running:
    name = "nats"

    def __init__(self, root: Path, flush: str) -> None:
        self.root = root
        self.flush = flush
        self.port = free_port()
        self.sync = flush == "sync" and sync_supported()

    def start(self) -> "Running":
        self.root.mkdir(parents=True, exist_ok=True)
        extra = ", sync_interval: always" if self.sync else ""
        conf = self.root / "nats.conf"
        conf.write_text(
            f"listen: 127.0.0.1:{self.port}\n"
            f'jetstream {{ store_dir: "{self.root / "js"}"{extra} }}\n'
        )
        self.server = Server.start("nats-server", ["nats-server", "-c", str(conf)], self.root / "nats.log")
        wait_port(self.port, self.server.proc, self.server.log, "nats-server")
        return self

    @property
    def pid(self) -> int:
        return self.server.pid

    @property
    def spec(self) -> dict:
        return {"port": self.port}

    @property
    def weaker(self) -> bool:
        """Sync rows without per-write fsync (nats-server < 2.10)."""
        return self.flush == "sync" and not self.sync

    def durability(self) -> str:
        if self.flush == "async":
            return "file storage, default sync"
        if self.sync:
            return "file storage, sync_interval: always"
        return "file storage, default sync (sync_interval needs nats-server >= 2.10)"

    def stop(self) -> None:
        if hasattr(self, "server"):
            self.server.stop()


class NatsClient(Client):
    name = "nats"

    async def open(self, topics: list[str]) -> None:
        import nats  # noqa: PLC0415
        from nats.js.api import StorageType, StreamConfig  # noqa: PLC0415

        self.nc = await nats.connect(f"nats://127.0.0.1:{self.spec['port']}", max_reconnect_attempts=0)
        self.js = self.nc.jetstream(timeout=30)
        for t in topics:
            await self.js.add_stream(StreamConfig(name=stream_name(t), subjects=[t], storage=StorageType.FILE))

    async def close(self) -> None:
        await self.nc.close()

    async def send(self, topic: str, body: bytes) -> None:
        await self.js.publish(topic, body)

    async def send_batch(self, topic: str, bodies: list[bytes]) -> None:
        futs = [await self.js.publish_async(topic, b) for b in bodies]
        for f in futs:
            await f

    async def _pull(self, topic: str, group: str):  # noqa: ANN202 (a nats-py PullSubscription)
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy  # noqa: PLC0415

        stream = stream_name(topic)
        try:
            await self.js.consumer_info(stream, group)
        except Exception:  # noqa: BLE001 (not found: create it)
            await self.js.add_consumer(stream, ConsumerConfig(
                durable_name=group, ack_policy=AckPolicy.ALL, deliver_policy=DeliverPolicy.ALL,
                max_ack_pending=-1, filter_subject=topic,
            ))
        return await self.js.pull_subscribe_bind(group, stream)

    async def _fetch(self, sub, batch: int) -> list:  # noqa: ANN001
        import nats.errors  # noqa: PLC0415

        try:
            return await sub.fetch(batch, timeout=0.5)
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            return []

    async def consume(self, topic: str, group: str, total: int, concurrency: int, batch: int,
                      progress: Progress) -> tuple[int, int, float]:
        subs = [await self._pull(topic, group) for _ in range(concurrency)]
        count = nbytes = 0
        last = 0.0
        t0 = time.perf_counter()

        async def loop(sub) -> None:  # noqa: ANN001
            nonlocal count, nbytes, last
            while count < total:
                msgs = await self._fetch(sub, batch)
                if not msgs:
                    if time.perf_counter() - max(last, t0) > STALL:
                        raise BenchError(f"JetStream delivered {count} of {total} messages, then "
                                         f"nothing for {STALL:.0f} s")
                    continue
                nbytes += sum(len(m.data) for m in msgs)
                await msgs[-1].ack()  # AckPolicy.ALL: acknowledges the whole batch
                count += len(msgs)
                last = time.perf_counter()
                progress(count)

        await asyncio.gather(*(loop(s) for s in subs))
        for s in subs:
            await s.unsubscribe()
        return count, nbytes, last - t0

    async def fanout(self, topic: str, groups: list[str], batch: int, deadline: float) -> int:
        total = 0
        info = await self.js.stream_info(stream_name(topic))
        backlog = info.state.messages

        async def loop(group: str) -> None:
            nonlocal total
            sub = await self._pull(topic, group)
            got = 0
            while time.perf_counter() < deadline and got < backlog:
                msgs = await self._fetch(sub, batch)
                if msgs:
                    await msgs[-1].ack()
                    got += len(msgs)
                    total += len(msgs)
            await sub.unsubscribe()

        await asyncio.gather(*(loop(g) for g in groups))
        return total

    async def latency_consume(self, topic: str, group: str, record: Callable[[bytes], None],
                              stop: asyncio.Event) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy  # noqa: PLC0415

        async def handle(msg) -> None:  # noqa: ANN001
            record(msg.data)
            await msg.ack()

        sub = await self.js.subscribe(
            topic, durable=group, cb=handle, manual_ack=True, stream=stream_name(topic),
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.NEW),
        )
        try:
            await stop.wait()
        finally:
            await sub.unsubscribe()


CLIENT = NatsClient
