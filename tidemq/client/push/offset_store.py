"""Where a consumer keeps the next offset to consume of each queue it owns.

* :class:`RemoteOffsetStore` (CLUSTERING): an in-memory table, read from and persisted to the
  broker (QUERY_CONSUMER_OFFSET / UPDATE_CONSUMER_OFFSET).
* :class:`LocalFileOffsetStore` (BROADCASTING): the same table persisted to a JSON file, never
  to the broker. The file is replaced atomically (write temp, fsync, rename) in a thread.

Invariants: offsets are the *next* offset to consume; ``update(increase_only=True)`` never moves
an offset backwards (late acknowledgements of old batches are harmless); ``read`` answers -1 for
"the store has no offset" and -2 for "the store could not be asked" (the caller then leaves the
queue for the next rebalance), as RocketMQ's OffsetStore does.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import orjson

from tidemq.client.push.broker_api import ConsumerBrokerApi
from tidemq.client.push.types import MessageModel
from tidemq.client.route import MessageQueue
from tidemq.errors import ClientError, CodecError, TideMQError

log = logging.getLogger(__name__)

NOT_FOUND = -1
READ_ERROR = -2
MAX_OFFSET_FILE = 64 * 1024 * 1024


class ReadOffsetType(enum.Enum):
    MEMORY = "MEMORY"
    STORE = "STORE"
    MEMORY_THEN_STORE = "MEMORY_THEN_STORE"


class OffsetStore(Protocol):
    async def load(self) -> None: ...
    def update(self, mq: MessageQueue, offset: int, increase_only: bool) -> None: ...
    async def read(self, mq: MessageQueue, how: ReadOffsetType) -> int: ...
    async def persist_all(self, mqs: Iterable[MessageQueue], oneway: bool = True) -> None: ...
    async def persist(self, mq: MessageQueue) -> None: ...
    def remove(self, mq: MessageQueue) -> None: ...
    def snapshot(self) -> dict[MessageQueue, int]: ...


class _Table:
    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}

    def update(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        if offset < 0:
            return
        current = self.table.get(mq)
        if current is None or not increase_only or offset > current:
            self.table[mq] = offset

    def remove(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)

    def snapshot(self) -> dict[MessageQueue, int]:
        return dict(self.table)


class RemoteOffsetStore(_Table):
    """CLUSTERING offsets: memory first, the broker is the store."""

    def __init__(self, api: ConsumerBrokerApi) -> None:
        super().__init__()
        self.api = api

    async def load(self) -> None:
        return None

    async def read(self, mq: MessageQueue, how: ReadOffsetType) -> int:
        if how is not ReadOffsetType.STORE:
            current = self.table.get(mq)
            if current is not None or how is ReadOffsetType.MEMORY:
                return NOT_FOUND if current is None else current
        try:
            offset = await self.api.query_offset(mq)
        except TideMQError as exc:
            log.warning("reading the offset of group %s on %s failed: %s", self.api.group, mq, exc)
            return READ_ERROR
        if offset is None:
            return NOT_FOUND
        self.update(mq, offset, increase_only=False)
        return offset

    async def persist_all(self, mqs: Iterable[MessageQueue], oneway: bool = True) -> None:
        """Send every owned queue's offset (oneway by default, as the cpp client does every 5 s);
        offsets of queues no longer owned are forgotten."""
        owned = set(mqs)
        for mq in [m for m in self.table if m not in owned]:
            del self.table[mq]
        for mq, offset in sorted(self.table.items()):
            try:
                await self.api.update_offset(mq, offset, oneway=oneway)
            except TideMQError as exc:
                log.warning("committing offset %d of group %s on %s failed: %s", offset,
                            self.api.group, mq, exc)

    async def persist(self, mq: MessageQueue) -> None:
        """Commit one queue's offset and wait for the broker (used when a queue is given up)."""
        offset = self.table.get(mq)
        if offset is None:
            return
        try:
            await self.api.update_offset(mq, offset, oneway=False)
        except TideMQError as exc:
            log.warning("committing offset %d of group %s on %s failed: %s", offset,
                        self.api.group, mq, exc)


class LocalFileOffsetStore(_Table):
    """BROADCASTING offsets in ``path`` (JSON), shared by nobody."""

    def __init__(self, path: str | os.PathLike[str], group: str) -> None:
        super().__init__()
        self.path = Path(path)
        self.group = group
        self._stored: dict[MessageQueue, int] = {}
        self._write_lock = asyncio.Lock()

    async def load(self) -> None:
        self._stored = await asyncio.to_thread(read_offset_file, self.path)
        self.table.update(self._stored)
        log.debug("loaded %d offset(s) of group %s from %s", len(self._stored), self.group, self.path)

    async def read(self, mq: MessageQueue, how: ReadOffsetType) -> int:
        if how is not ReadOffsetType.STORE:
            current = self.table.get(mq)
            if current is not None or how is ReadOffsetType.MEMORY:
                return NOT_FOUND if current is None else current
        offset = self._stored.get(mq)
        if offset is None:
            return NOT_FOUND
        self.update(mq, offset, increase_only=False)
        return offset

    async def persist_all(self, mqs: Iterable[MessageQueue], oneway: bool = True) -> None:
        owned = set(mqs)
        merged = dict(self._stored)
        merged.update({mq: off for mq, off in self.table.items() if mq in owned})
        async with self._write_lock:
            try:
                await asyncio.to_thread(write_offset_file, self.path, self.group, merged)
            except OSError as exc:
                log.warning("writing offsets of group %s to %s failed: %s", self.group, self.path, exc)
                return
            self._stored = merged

    async def persist(self, mq: MessageQueue) -> None:
        await self.persist_all([mq, *self.table])


def make_offset_store(model: MessageModel, api: ConsumerBrokerApi,
                      base: str | os.PathLike[str] | None, instance_name: str) -> OffsetStore:
    """The broker for CLUSTERING, a local file for BROADCASTING."""
    if model is MessageModel.CLUSTERING:
        return RemoteOffsetStore(api)
    path = local_offset_path(base, api.inst.client_id, instance_name, api.group)
    return LocalFileOffsetStore(path, api.group)


def local_offset_path(base: str | os.PathLike[str] | None, client_id: str, instance_name: str,
                      group: str) -> Path:
    """``<base>/<ip>@<instance>/<group>.json``; base defaults to ``~/.tidemq/offsets``. The
    instance name (not the per-process client id) keeps the path stable across restarts."""
    root = Path(base) if base else Path("~").expanduser() / ".tidemq" / "offsets"
    ip = client_id.split("@", 1)[0]
    return root / f"{ip}@{instance_name}" / f"{group}.json"


def read_offset_file(path: Path) -> dict[MessageQueue, int]:
    """The offsets in ``path``; {} when it does not exist. A damaged file raises ClientError."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_OFFSET_FILE + 1)
    except FileNotFoundError:
        return {}
    if len(data) > MAX_OFFSET_FILE:
        raise ClientError(f"offset file {path} is larger than {MAX_OFFSET_FILE} bytes")
    try:
        obj = orjson.loads(data)
        out = {}
        for item in obj["offsetTable"]:
            out[MessageQueue.from_json(item)] = int(item["offset"])
        return out
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, CodecError) as exc:
        raise ClientError(
            f"offset file {path} is damaged ({exc}); fix or delete it (the consumer then starts "
            "from its consume_from setting)"
        ) from None


def write_offset_file(path: Path, group: str, offsets: dict[MessageQueue, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = [{**mq.as_json(), "offset": off} for mq, off in sorted(offsets.items())]
    data = orjson.dumps({"group": group, "offsetTable": table}, option=orjson.OPT_INDENT_2)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
