"""Helpers shared by the store tests: small configs (rollover happens), requests, a fake clock."""

from __future__ import annotations

from pathlib import Path

from tidemq.message import MessageExt, decode_record

from tidemq.broker.store.config import FlushMode, StoreConfig
from tidemq.broker.store.store import GetStatus, MessageStore, PutRequest

SEGMENT = 64 * 1024
T0 = 1_700_000_000.0  # seconds


def config(root: Path, **kw) -> StoreConfig:
    base = dict(
        root=root,
        commitlog_segment_size=SEGMENT,
        consume_queue_units_per_file=64,
        index_hash_slots=97,
        index_max_entries=400,
        async_flush_interval=0.05,
        logics_flush_interval=3600.0,
        cleanup_interval=3600.0,
        flush_mode=FlushMode.ASYNC,
    )
    base.update(kw)
    return StoreConfig(**base)


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def req(topic: str = "T", queue_id: int = 0, body: bytes = b"hello", tags: str | None = None,
        keys: str | None = None, uniq: str | None = None, **kw) -> PutRequest:
    props: dict[str, str] = {}
    if tags:
        props["TAGS"] = tags
    if keys:
        props["KEYS"] = keys
    if uniq:
        props["UNIQ_KEY"] = uniq
    props.update(kw.pop("props", {}))
    return PutRequest(topic, queue_id, body, props, **kw)


def open_store(cfg: StoreConfig, **kw) -> MessageStore:
    s = MessageStore(cfg, **kw)
    s.load()
    return s


def read_queue(store: MessageStore, topic: str, queue_id: int, start: int | None = None) -> list[MessageExt]:
    """Every message of a queue from ``start`` (default: its min offset), via get_messages."""
    out: list[MessageExt] = []
    off = store.min_offset(topic, queue_id) if start is None else start
    while True:
        r = store.get_messages(topic, queue_id, off, 32, None)
        if r.status is not GetStatus.FOUND:
            return out
        out.extend(decode_record(rec) for rec in r.records)
        off = r.next_begin_offset
