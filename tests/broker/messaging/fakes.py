"""Test doubles for the messaging services: a store kept in lists, and the broker parts a service
is built from (real in-memory managers where they are cheap, with no files written).

FakeStore stores each put as a real encoded record (so a send-back can read it back by offset)
and keeps the consume queues as lists of CommitLog offsets. ``refuse`` makes every put answer
that status; ``flush`` (a future) stands for a SYNC_FLUSH group commit not done yet.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path

from tidemq.broker.config import BrokerConfig
from tidemq.broker.creation import ImplicitCreation
from tidemq.broker.groups import SubscriptionGroupManager
from tidemq.broker.messaging.context import Caller
from tidemq.broker.quota import CreationQuota
from tidemq.broker.store.config import FlushMode, StoreConfig
from tidemq.broker.store.results import GetResult, GetStatus, PutRequest, PutResult, PutStatus
from tidemq.broker.topics import TopicConfig, TopicConfigManager
from tidemq.message import encode_properties, encode_record, tags_code

STORE_HOST = ("10.0.0.9", 10911)
CALLER = Caller("10.0.0.1:5555", 310)


class FakeStore:
    def __init__(self) -> None:
        self.log: list[bytes] = []  # records, in CommitLog order
        self.offsets: list[int] = []  # CommitLog offset of each record
        self.end = 0
        self.queues: dict[tuple[str, int], list[int]] = {}  # -> indexes into log
        self.puts: list[PutRequest] = []
        self.refuse: PutStatus | None = None
        self.flush: asyncio.Future | None = None

    def _append(self, req: PutRequest) -> tuple[int, int, str]:
        q = self.queues.setdefault((req.topic, req.queue_id), [])
        phys = self.end
        rec = encode_record(
            topic=req.topic.encode(), body=req.body, properties=encode_properties(req.properties).encode(),
            queue_id=req.queue_id, flag=req.flag, queue_offset=len(q), physical_offset=phys,
            sys_flag=req.sys_flag, born_timestamp=req.born_timestamp, born_host=bytes([10, 0, 0, 1]),
            born_port=req.born_host[1], store_timestamp=1, store_host=bytes([10, 0, 0, 9]),
            store_port=req.store_host[1], reconsume_times=req.reconsume_times,
        )
        q.append(len(self.log))
        self.log.append(rec)
        self.offsets.append(phys)
        self.end += len(rec)
        self.puts.append(req)
        return phys, len(q) - 1, f"{phys:032X}"

    def put(self, req: PutRequest) -> PutResult:
        if self.refuse is not None:
            return PutResult(self.refuse, remark=f"refused: {self.refuse.name}")
        phys, qoff, msg_id = self._append(req)
        return PutResult(PutStatus.PUT_OK, phys, qoff, [msg_id], 1, self.end)

    def put_batch(self, reqs: list[PutRequest]) -> PutResult:
        prepared = self.prepare_batch(reqs)
        if isinstance(prepared, PutResult):
            return prepared
        return self.put_prepared(*prepared)

    def prepare_batch(self, reqs: list[PutRequest]):
        if self.refuse is not None:
            return PutResult(self.refuse, remark=f"refused: {self.refuse.name}")
        return list(reqs), sum(len(r.body) for r in reqs)

    def put_prepared(self, pending: list[PutRequest], total: int) -> PutResult:
        appended = [self._append(r) for r in pending]
        return PutResult(PutStatus.PUT_OK, appended[0][0], appended[0][1], [a[2] for a in appended],
                         len(appended), self.end)

    def when_durable(self, end_offset: int, callback) -> bool:
        if self.flush is None:
            return False
        self.flush.add_done_callback(lambda f: callback(f.result()))
        return True

    async def wait_durable(self, end_offset: int) -> bool:
        return True if self.flush is None else await self.flush

    def read_record(self, physical_offset: int) -> bytes | None:
        try:
            return self.log[self.offsets.index(physical_offset)]
        except ValueError:
            return None

    def max_offset(self, topic: str, queue_id: int) -> int:
        return len(self.queues.get((topic, queue_id), ()))

    def readable(self, topic: str, queue_id: int, offset: int) -> bool:
        return self.max_offset(topic, queue_id) > offset

    def get_messages(self, topic: str, queue_id: int, offset: int, max_msgs: int,
                     tag_codes: frozenset[int] | None, max_bytes: int = 256 * 1024) -> GetResult:
        q = self.queues.get((topic, queue_id))
        if not q:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        if offset >= len(q):
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, 0, len(q))
        picked = []
        for i in q[offset:offset + max_msgs]:
            req = self.puts[i]
            if tag_codes is None or tags_code(req.properties.get("TAGS")) in tag_codes:
                picked.append(self.log[i])
        nxt = min(len(q), offset + max_msgs)
        if not picked:
            return GetResult(GetStatus.NO_MATCHED_MESSAGE, nxt, 0, len(q))
        return GetResult(GetStatus.FOUND, nxt, 0, len(q), picked, len(picked), sum(map(len, picked)))


@dataclass
class Parts:
    """The broker parts services are built from, over a FakeStore."""

    tmp: Path
    config: BrokerConfig = None  # type: ignore[assignment]
    store: FakeStore = field(default_factory=FakeStore)
    puts: list[tuple[str, int, int]] = field(default_factory=list)  # on_put / on_get observations
    gets: list[tuple[str, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.config is None:
            self.config = BrokerConfig(store=StoreConfig(root=self.tmp))
        self.topics = TopicConfigManager(self.tmp / "topics.json")
        self.groups = SubscriptionGroupManager(self.tmp / "groups.json")
        self.quota = CreationQuota(self.config.creation_limits)
        self.changed = 0
        self.creation = ImplicitCreation(self.topics, self.groups, self.quota,
                                         lambda: self.config.auto_create_subscription_group, self._changed)

    def _changed(self) -> None:
        self.changed += 1

    def settings(self) -> BrokerConfig:
        return self.config

    def on_put(self, topic: str, count: int, size: int) -> None:
        self.puts.append((topic, count, size))

    def on_get(self, topic: str, count: int, size: int) -> None:
        self.gets.append((topic, count, size))

    def topic(self, name: str, queues: int = 4, perm: int = 6) -> TopicConfig:
        tc = TopicConfig(name, queues, queues, perm)
        self.topics.put(tc)
        return tc

    def sync_flush(self) -> None:
        self.config = replace(self.config, store=replace(self.config.store, flush_mode=FlushMode.SYNC))
