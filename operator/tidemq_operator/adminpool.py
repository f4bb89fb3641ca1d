"""One admin connection per Cluster, and what its brokers report, shared by every pass.

Every Topic, ConsumerGroup and Cluster pass talks to a Cluster's name servers and brokers through
:class:`tidemq.client.Admin`. Opening one per pass made the cost of a timer round grow with the
number of resources twice over: a new connection to every name server and broker per resource,
and (Topics) every broker's whole topic table fetched per Topic, O(N^2) bytes per round. Here:

- :class:`AdminPool` keeps one started Admin per (name servers, client config, name-server
  credentials), i.e. per Cluster and signing account; passes borrow it with :meth:`AdminPool.use`.
  An entry no pass used for ``idle`` seconds is closed (the sweep runs as passes borrow and from a
  task the pool owns), and :meth:`AdminPool.discard` closes a deleted Cluster's at once; an entry
  in use is closed only when its last borrower gives it back.
- :class:`ClusterView` (one per entry) caches the Cluster's master brokers and each master's topic
  table (GET_BROKER_CLUSTER_INFO, GET_ALL_TOPIC_CONFIG). A reader says how old a copy it accepts;
  one fetch serves every reader waiting for it (a lock per key), so a timer round of N Topics
  fetches each table once, not N times. The operator's own writes update the cached table (so the
  next pass does not undo or redo them), and a failed call drops the entry's copies.

Invariants: the pool is bounded by the Clusters in use (entries are per key, idle ones close);
a view holds one table per master broker, each bounded by the broker's own topic limit. Time is
injected (``clock``), so tests drive expiry without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tidemq.client.admin import Admin
from tidemq.client.config import ClientConfig
from tidemq.errors import TideMQError
from tidemq.operator.brokers import masters

log = logging.getLogger(__name__)

Clock = Callable[[], float]

IDLE = 300.0  # seconds an unused entry stays open (default; the operator passes its own)


@dataclass(frozen=True, slots=True)
class PoolKey:
    """What makes two passes able to share an Admin: where it connects and how it signs."""

    servers: tuple[str, ...]
    config: ClientConfig
    namesrv_credentials: tuple[str, str] | None = None


class ClusterView:
    """A Cluster's masters and their topic tables, each fetched at most once per ``max_age``
    a reader gives. ``clock`` is monotonic seconds."""

    def __init__(self, admin: Admin, clock: Clock = time.monotonic) -> None:
        self.admin = admin
        self._clock = clock
        self._masters: tuple[float, dict[str, str]] | None = None
        self._tables: dict[str, tuple[float, dict[str, dict]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}  # one per key ("" = masters): one fetch at a time

    def _lock(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def _fresh(self, fetched: float, max_age: float) -> bool:
        return self._clock() - fetched < max_age

    async def masters(self, max_age: float) -> dict[str, str]:
        """broker name -> master address over every cluster the name servers know (a copy at
        most ``max_age`` seconds old). Raises ClusterNotReady when there is none."""
        async with self._lock(""):
            if self._masters is None or not self._fresh(self._masters[0], max_age):
                started = self._clock()
                self._masters = (started, await masters(self.admin))
            return dict(self._masters[1])

    async def topic_configs(self, addr: str, max_age: float) -> Mapping[str, dict]:
        """The broker's topic table (topic -> TopicConfig JSON), a copy at most ``max_age``
        seconds old, with this operator's later writes applied."""
        async with self._lock(addr):
            held = self._tables.get(addr)
            if held is None or not self._fresh(held[0], max_age):
                started = self._clock()  # the copy is as old as the moment it was asked for
                held = self._tables[addr] = (started, await self.admin.broker_topic_configs(addr))
            return held[1]

    def wrote(self, addr: str, topic: str, config: dict) -> None:
        """This operator set ``topic`` on ``addr`` to ``config`` (the broker answered success)."""
        held = self._tables.get(addr)
        if held is not None:
            held[1][topic] = config

    def deleted(self, topic: str) -> None:
        """``topic`` was deleted from every broker."""
        for _, table in self._tables.values():
            table.pop(topic, None)

    def forget(self) -> None:
        """Drop every copy (a call failed: the Cluster may have changed under it)."""
        self._masters = None
        self._tables.clear()


@dataclass(slots=True)
class _Entry:
    admin: Admin
    view: ClusterView
    users: int = 0
    last_used: float = 0.0
    discarded: bool = False


@dataclass(slots=True)
class AdminPool:
    """Started Admins by :class:`PoolKey`. Use from one event loop; :meth:`close` at the end."""

    idle: float = IDLE
    clock: Clock = time.monotonic
    _entries: dict[PoolKey, _Entry] = field(default_factory=dict)
    _sweeper: asyncio.Task | None = None

    @contextlib.asynccontextmanager
    async def use(self, servers: Sequence[str], config: ClientConfig,
                  namesrv_credentials: tuple[str, str] | None = None) -> AsyncIterator[ClusterView]:
        """Borrow the entry of these name servers and account (started on first use); a call
        that fails inside drops the view's cached copies."""
        key = PoolKey(tuple(servers), config, namesrv_credentials)
        await self.sweep()
        entry = self._entries.get(key)
        if entry is None:
            admin = Admin(list(servers), config, namesrv_credentials=namesrv_credentials)
            await admin.start()
            entry = self._entries.get(key)  # another pass may have started one meanwhile
            if entry is None:
                entry = self._entries[key] = _Entry(admin, ClusterView(admin, self.clock))
                log.info("admin connection for name servers %s opened (%d in the pool)",
                         ";".join(servers), len(self._entries))
            else:
                await admin.close()
        self._start_sweeper()
        entry.users += 1
        try:
            yield entry.view
        except (TideMQError, TimeoutError):
            entry.view.forget()
            raise
        finally:
            entry.users -= 1
            entry.last_used = self.clock()
            if entry.discarded and entry.users == 0:
                await entry.admin.close()

    async def sweep(self) -> int:
        """Close every entry no pass used for ``idle`` seconds; returns how many closed."""
        now = self.clock()
        idle = [k for k, e in self._entries.items() if e.users == 0 and now - e.last_used >= self.idle]
        for key in idle:
            await self._entries.pop(key).admin.close()
            log.info("admin connection for name servers %s closed (idle %.0f s)",
                     ";".join(key.servers), self.idle)
        return len(idle)

    async def discard(self, servers: Sequence[str]) -> int:
        """Close the entries of these name servers (their Cluster is gone); one in use closes
        when its last borrower is done. Returns how many entries went."""
        keys = [k for k in self._entries if k.servers == tuple(servers)]
        for key in keys:
            entry = self._entries.pop(key)
            entry.discarded = True
            if entry.users == 0:
                await entry.admin.close()
        return len(keys)

    def __len__(self) -> int:
        return len(self._entries)

    def _start_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever(),
                                                                   name="tidemq-adminpool-sweep")

    async def _sweep_forever(self) -> None:
        while self._entries:
            await asyncio.sleep(max(self.idle / 2, 1.0))
            try:
                await self.sweep()
            except Exception as exc:  # noqa: BLE001 (a close that fails must not end the sweeping)
                log.warning("closing idle admin connections failed: %s", exc)

    async def close(self) -> None:
        """Close every entry and stop the sweeper (the operator's cleanup)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            entry.discarded = True
            if entry.users == 0:
                await entry.admin.close()


@contextlib.asynccontextmanager
async def borrow(pool: AdminPool | None, servers: Sequence[str], config: ClientConfig,
                 namesrv_credentials: tuple[str, str] | None = None) -> AsyncIterator[ClusterView]:
    """The pool's view when there is a pool; otherwise a connection (and view) for this pass only
    (direct callers of a pass, such as tests, that run no operator)."""
    if pool is not None:
        async with pool.use(servers, config, namesrv_credentials) as view:
            yield view
        return
    async with Admin(list(servers), config, namesrv_credentials=namesrv_credentials) as admin:
        yield ClusterView(admin)
