"""The broker as one replica of its group (issue 17, step 4a): election wired to replication and
to registration with the name servers.

:class:`ReplicaService` starts the coordination store and the :class:`~.election.Elector`, then
follows its roles one at a time:

- **master** of epoch E: serves the CommitLog on ``--ha-listen`` (:class:`ReplicationMaster`,
  its epoch history starting E at the log end of the moment) and registers with the name servers
  as brokerId 0 at once, so clients route sends to it at their next route read;
- **follower**: registers as brokerId ``replica_id + 1`` (RocketMQ: slaves have brokerId > 0);
  each answer of a name server names the master's HA address (RocketMQ's RegisterBrokerResult
  ``haServerAddr``, which the master registered), and the replication follower streams from it,
  restarted whenever that address changes;
- **none** (no live master, or this replica's lease is lost): neither.

A master adds a follower to the record's in-sync set (``Elector.grow``) once the follower has
acked the master's log end of one check earlier (:data:`IN_SYNC_INTERVAL`): only in-sync
replicas may be elected, so without this a dead master would have no successor.

Invariants:
- :meth:`may_write` is True only while this replica is master and the Elector says it may
  acknowledge (its lease renewal deadline has not passed), so a master that lost its lease stops
  acknowledging at the next send, before any other replica can win.
- Only one role is applied at a time (one task reads ``Elector.roles()``), and the previous
  role's master or follower is closed before the next one starts.
- The HA address is found through the name servers, not a new coordination-store key: the
  store's values are group records only.

Not yet (see docs/replication.md): the sync acknowledgement wait on followers' acked offsets,
the epoch history and this replica's epoch persisted across restarts, metadata replication.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from tidemq.broker.config import ReplicaConfig
from tidemq.broker.store.store import MessageStore
from tidemq.broker.store.tasks import cancel_and_wait

from .coordination import CoordinationError, CoordinationStore, group_key
from .election import ElectionConfig, Elector, ReplicaPosition, Role, RoleKind
from .etcd import EtcdConfig, EtcdStore
from .kubernetes import KubernetesLeaseStore
from .replication import EpochStart, ReplicationConfig, ReplicationFollower, ReplicationMaster

log = logging.getLogger(__name__)

# A follower re-reads the master's HA address from the name servers (by registering) this often
# (seconds) until it has acked a frame from it: the first answer may still name the old master
# when the new one has not registered yet. Once streaming, it re-checks at the slower interval.
RESOLVE_INTERVAL = 0.5
RESOLVE_STREAMING_INTERVAL = 5.0
# A master checks its followers' acked offsets this often (seconds) to grow the in-sync set.
IN_SYNC_INTERVAL = 0.2


def open_store(config: ReplicaConfig) -> CoordinationStore:
    """The coordination store ``--coordination`` names."""
    if isinstance(config.coordination, EtcdConfig):
        return EtcdStore(config.coordination)
    return KubernetesLeaseStore(config.coordination)


def parse_addr(addr: str) -> tuple[str, int] | None:
    host, sep, port = addr.rpartition(":")
    return (host.strip("[]"), int(port)) if sep and host and port.isdigit() else None


class ReplicaService:
    """This broker's part in its replicated group (see the module docstring).

    ``register`` registers with every name server and returns the master's HA address the
    answers named ("" when none did); ``store_factory`` is a test seam for the coordination store.
    """

    def __init__(self, config: ReplicaConfig, *, cluster: str, broker_name: str, store: MessageStore,
                 register: Callable[[], Awaitable[str]],
                 store_factory: Callable[[ReplicaConfig], CoordinationStore] = open_store) -> None:
        self.config = config
        self.store = store
        self._register = register
        self._coordination = store_factory(config)
        self._replication = ReplicationConfig(cluster, broker_name)
        self.elector = Elector(
            self._coordination, group_key(cluster, broker_name), config.replica_id, self._position,
            ElectionConfig(lease_seconds=config.lease_seconds, allow_unclean=config.allow_unclean_election,
                           min_in_sync=config.min_in_sync))
        self.role: Role = self.elector.role
        self.epoch = 0  # the highest epoch this replica has seen (in memory until it is persisted)
        self.master: ReplicationMaster | None = None
        self.follower: ReplicationFollower | None = None
        self._roles_task: asyncio.Task[None] | None = None
        self._resolve_task: asyncio.Task[None] | None = None
        self._in_sync_task: asyncio.Task[None] | None = None

    @property
    def broker_id(self) -> int:
        """The brokerId to register: 0 as master, ``replica_id + 1`` otherwise (RocketMQ: slaves > 0)."""
        return 0 if self.role.kind is RoleKind.MASTER else self.config.replica_id + 1

    def may_write(self) -> bool:
        """True while this replica may store and acknowledge a send (the send path asks)."""
        return self.role.kind is RoleKind.MASTER and \
            self.elector.may_acknowledge(asyncio.get_running_loop().time())

    def _position(self) -> ReplicaPosition:
        return ReplicaPosition(self.store.commitlog_max_offset, self.epoch)

    async def start(self) -> None:
        await self.elector.start()
        self._roles_task = asyncio.create_task(self._follow_roles(), name="replica-roles")
        log.info("replica %d of %s/%s: election started (lease %g s, %s replication, min in-sync %d)",
                 self.config.replica_id, self._replication.cluster, self._replication.broker_name,
                 self.config.lease_seconds, self.config.replication.value, self.config.min_in_sync)

    async def stop(self) -> None:
        await cancel_and_wait(self._roles_task)
        await self._leave_role()
        await self.elector.close()  # revokes the lease: the others elect without waiting for it
        self.role = self.elector.role
        await self._coordination.close()

    async def _follow_roles(self) -> None:
        async for role in self.elector.roles():
            try:
                await self._apply(role)
            except (OSError, asyncio.TimeoutError) as exc:
                # e.g. --ha-listen in use: this replica cannot serve as master. It keeps its
                # lease; the send path refuses writes until the next role change.
                log.error("replica %d could not become %s of epoch %d: %s", self.config.replica_id,
                          role.kind.value, role.epoch, exc)

    async def _apply(self, role: Role) -> None:
        await self._leave_role()
        self.epoch = max(self.epoch, role.epoch)
        cfg = self.config
        if role.kind is RoleKind.MASTER:
            start = self.store.commitlog_max_offset
            master = ReplicationMaster(self.store, self._replication, role.epoch, [EpochStart(role.epoch, start)])
            await master.start(cfg.ha_host, cfg.ha_port)
            self.master = master
            self.role = role
            log.warning("replica %d is MASTER of epoch %d (log end %d); registering as brokerId 0",
                        cfg.replica_id, role.epoch, start)
            self._in_sync_task = asyncio.create_task(self._grow_in_sync(master), name="replica-in-sync")
            await self._register()
        elif role.kind is RoleKind.FOLLOWER:
            self.role = role
            log.warning("replica %d FOLLOWS replica %s at epoch %d; registering as brokerId %d",
                        cfg.replica_id, role.master, role.epoch, self.broker_id)
            self._resolve_task = asyncio.create_task(self._resolve_master(role), name="replica-resolve")
        else:
            self.role = role
            log.warning("replica %d has no role (no live master, or its lease is lost): refusing sends",
                        cfg.replica_id)
            with contextlib.suppress(Exception):  # best effort: the periodic round retries
                await self._register()

    async def _resolve_master(self, role: Role) -> None:
        """As follower: register, learn the master's HA address from the answers, follow it."""
        following = ""
        while True:
            try:
                addr = await self._register()
            except Exception:  # noqa: BLE001 (a failed round is logged by the registrar; retried)
                log.exception("replica %d: registration failed", self.config.replica_id)
                addr = ""
            target = parse_addr(addr) if addr and addr != self.config.ha_advertise else None
            if target is not None and addr != following:
                if self.follower is not None:
                    await self.follower.close()
                self.follower = ReplicationFollower(self.store, self._replication, self.config.replica_id,
                                                    role.epoch, target)
                self.follower.start()
                following = addr
                log.info("replica %d replicates from the master's HA address %s (epoch %d)",
                         self.config.replica_id, addr, role.epoch)
            streaming = self.follower is not None and self.follower.acked >= 0
            await asyncio.sleep(RESOLVE_STREAMING_INTERVAL if streaming else RESOLVE_INTERVAL)

    async def _grow_in_sync(self, master: ReplicationMaster) -> None:
        """As master: add each follower that has caught up to the in-sync set (see the docstring)."""
        end = self.store.commitlog_max_offset
        while True:
            await asyncio.sleep(IN_SYNC_INTERVAL)
            known = self.elector.known
            in_sync = known.in_sync if known is not None else ()
            for state in master.followers().values():
                if state.replica_id not in in_sync and state.acked >= end:
                    try:
                        grown = await self.elector.grow(state.replica_id)
                    except (CoordinationError, TimeoutError) as exc:
                        log.warning("replica %d could not add replica %d to the in-sync set (%s); "
                                    "retrying", self.config.replica_id, state.replica_id, exc)
                        continue
                    if grown:
                        log.info("replica %d is in sync at offset %d (epoch %d)", state.replica_id,
                                 state.acked, master.epoch)
            end = self.store.commitlog_max_offset

    async def _leave_role(self) -> None:
        await cancel_and_wait(self._resolve_task, self._in_sync_task)
        self._resolve_task = self._in_sync_task = None
        follower, self.follower = self.follower, None
        if follower is not None:
            self.epoch = max(self.epoch, follower.epoch)
            await follower.close()
        master, self.master = self.master, None
        if master is not None:
            await master.close()
