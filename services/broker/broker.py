"""The broker: a composition of the store, metadata managers, client registry, long-poll holds,
one messaging service per request family (tidemq.broker.messaging) and its remoting adapter
(tidemq.broker.processors), served over RocketMQ remoting with hooks around dispatch (ACL, flow
control, metrics: tidemq.broker.hooks).

This module is the composition root: it alone builds the services with the collaborators each
uses and the adapters with their services; nothing else imports it but the CLI and tests.

Lifecycle: ``start()`` loads (and recovers) the store and metadata, starts serving, registers with
every name server; ``stop()`` stops accepting, unregisters, flushes offsets and the store.

With ``config.replica`` (``--coordination``) the broker is one replica of its group
(tidemq.broker.ha.replica): it registers with the brokerId of its role, and a write request is
answered SERVICE_NOT_AVAILABLE unless it is the master and may acknowledge. Without it,
``self.replica`` is None and the send path pays one attribute read.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable

from tidemq.broker.acl import AclService
from tidemq.broker.advertise import store_host_of
from tidemq.broker.clients import ClientRegistry
from tidemq.broker.config import BrokerConfig
from tidemq.broker.creation import ImplicitCreation
from tidemq.broker.delay import parse_delay_levels
from tidemq.broker.groups import SubscriptionGroupManager
from tidemq.broker.ha.metalog import Managers, MetadataLog
from tidemq.broker.ha.replica import ReplicaService
from tidemq.broker.hooks import AclHook, Dispatcher, FlowControlHook, MetricsHook
from tidemq.broker.locks import RebalanceLockManager
from tidemq.broker.longpoll import PullHoldService
from tidemq.broker.messaging.admin import AdminService
from tidemq.broker.messaging.brokerconfig import BrokerConfigService
from tidemq.broker.messaging.consumers import ConsumerService
from tidemq.broker.messaging.offsets import OffsetService
from tidemq.broker.messaging.pull import PullService
from tidemq.broker.messaging.query import QueryService
from tidemq.broker.messaging.reply import ReplyService
from tidemq.broker.messaging.runtime import RuntimeService
from tidemq.broker.messaging.send import SendService
from tidemq.broker.messaging.sendback import SendBackService
from tidemq.broker.messaging.transaction import EndTransactionService
from tidemq.broker.metrics import BrokerMetrics
from tidemq.broker.offsets import ConsumerOffsetManager
from tidemq.broker.processors.admin import AdminProcessor
from tidemq.broker.processors.brokerconfig import BrokerConfigProcessor
from tidemq.broker.processors.common import Answer, Callers, Handler
from tidemq.broker.processors.consumers import ConsumerProcessor, notify_consumer_ids_changed
from tidemq.broker.processors.offsets import OffsetProcessor
from tidemq.broker.processors.pull import PullProcessor
from tidemq.broker.processors.query import QueryProcessor
from tidemq.broker.processors.reply import ConnectedRequesters, ReplyProcessor
from tidemq.broker.processors.delayprogress import DelayProgressProcessor
from tidemq.broker.processors.runtime import RuntimeProcessor
from tidemq.broker.processors.send import SendProcessor
from tidemq.broker.processors.sendback import SendBackProcessor
from tidemq.broker.processors.transaction import EndTransactionProcessor, ask_transaction_state
from tidemq.broker.quota import CreationQuota
from tidemq.broker.register import NamesrvRegistrar
from tidemq.broker.schedule import ScheduleMessageService
from tidemq.broker.store.config import FlushMode
from tidemq.broker.store.jsonfile import write_json_atomic
from tidemq.broker.store.observer import StoreObserver
from tidemq.broker.store.store import MessageStore
from tidemq.broker.store.tasks import cancel_and_wait
from tidemq.broker.transaction.checker import TransactionChecker
from tidemq.broker.transaction.service import TransactionConfig, TransactionService
from tidemq.broker.topics import TopicConfigManager
from tidemq.remoting import Connection, RemotingCommand, RemotingServer, RequestCode
from tidemq.remoting.limits import ServerLimits, raise_open_file_limit

log = logging.getLogger(__name__)

PERSIST_RETRY = 5.0  # s before a failed topics.json write is tried again
# Requests that store messages: a replica that is not an acknowledging master refuses them.
WRITE_CODES = frozenset({
    RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
    RequestCode.CONSUMER_SEND_MSG_BACK, RequestCode.END_TRANSACTION,
    RequestCode.SEND_REPLY_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2,
})
# Of those, the sends: RocketMQ clients decode a send header for SUCCESS and the not-replicated
# codes (SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT) alike, so those are answered after storing.
SEND_CODES = frozenset({
    RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
    RequestCode.SEND_REPLY_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2,
})


class Broker:
    def __init__(self, config: BrokerConfig, clock: Callable[[], float] = time.time,
                 observer: StoreObserver | None = None) -> None:  # used for testing
        self.config = config
        self.clock = clock
        root = config.store.root
        self.delay_levels = parse_delay_levels(config.delay_levels)
        self.store = MessageStore(config.store, clock=clock, schedule_tags_code=self.delay_levels.tags_code,
                                  observer=observer)  # fault-injection tests (tidemq.broker.faults)
        self.topics = TopicConfigManager(root / "config" / "topics.json", clock)
        self.groups = SubscriptionGroupManager(root / "config" / "subscriptionGroup.json", clock)
        self.offsets = ConsumerOffsetManager(root / "config" / "consumerOffset.json")
        self.quota = CreationQuota(config.creation_limits)
        self.creation = ImplicitCreation(self.topics, self.groups, self.quota,
                                         lambda: self.config.auto_create_subscription_group, self.topics_changed)
        self.clients: ClientRegistry[Connection] = ClientRegistry(config.client_channel_expiry,
                                                                  notify=notify_consumer_ids_changed)
        self.clients.notify_enabled = self._notify_enabled
        self.locks = RebalanceLockManager()
        self.holds = PullHoldService()
        self.metrics = BrokerMetrics(config.cluster_name, config.broker_name, config.metrics_queue_lag)
        self.replica: ReplicaService | None = None
        if config.replica is not None:
            self.replica = ReplicaService(config.replica, cluster=config.cluster_name,
                                          broker_name=config.broker_name, store=self.store,
                                          register=self._register_for_replica)
        self.registrar = NamesrvRegistrar(
            settings=self._settings, topics=self.topics,
            broker_id=None if self.replica is None else self._replica_broker_id)
        # An IP literal (a name is resolved once, here; ConfigError when it does not resolve).
        self.store_host = store_host_of(config.advertise_host, config.advertise_port)
        self.schedule = ScheduleMessageService(
            self.store, self.delay_levels, root / "config" / "delayOffset.json", self.store_host, clock,
            may_write=self._may_write,
        )
        self.transactions = TransactionService(
            self.store,
            TransactionConfig(config.transaction_timeout, config.transaction_check_interval,
                              config.transaction_check_max, config.store.file_reserved_hours),
            self.store_host, root / "config" / "transactionProgress.json", clock,
        )
        self.tx_checker = TransactionChecker(
            self.transactions, lambda g: [ch.conn for ch in self.clients.producers.get(g, {}).values()],
            ask_transaction_state, may_write=self._may_write,
        )
        # Replicated: topics, groups, offsets and progress ride the replicated log (issue 17).
        self.metadata: MetadataLog | None = None
        if self.replica is not None:
            self.metadata = MetadataLog(
                self.store, Managers(self.topics, self.groups, self.offsets, self.schedule, self.transactions,
                                     self.topics_changed, self.persist_topics, self.persist_groups,
                                     self.persist_offsets),
                root / "config" / "metadataApplied.json", store_host=self.store_host, clock=clock,
                may_record=self.replica.may_write, refusal=self.replica.write_refusal,
                replicated=self.replica.replicated)
            self.replica.truncate = self.metadata.truncate
        self.server = RemotingServer(self, config.max_frame, tls=config.tls, limits=ServerLimits(
            config.idle_timeout, config.max_connections, config.max_buffered_bytes,
            frame_read_timeout=config.frame_read_timeout))
        self.address: tuple[str, int] | None = None
        self._tasks: list[asyncio.Task] = []
        self._register_soon: asyncio.Task | None = None
        self._persist_locks = {"topics": asyncio.Lock(), "groups": asyncio.Lock(), "offsets": asyncio.Lock()}
        self._topics_dirty = False
        self._topics_persist = False
        self._ready = False
        # RocketMQ plain ACL (None = off); a bad file raises ConfigError here, at start.
        self.acl = AclService(config.acl_file, config.acl_reload_interval) if config.acl_file else None
        callers = Callers(self.acl is not None)  # with ACL on, the verified access key names a caller
        settings = self._settings  # each request reads the config of the moment (UPDATE_BROKER_CONFIG)
        replicated = self.replica.replicated if self.replica is not None else None  # the acknowledgement gate
        self.handlers: dict[int, Handler] = {}
        for proc in (  # sending and pulling: the hot paths
            SendProcessor(SendService(
                settings=settings, store=self.store, topics=self.topics, groups=self.groups, creation=self.creation,
                schedule=self.schedule, transactions=self.transactions, store_host=self.store_host,
                on_put=self.metrics.on_put,
                replicated=self.replica.when_replicated if self.replica is not None else None),
                callers=callers, region=config.region),
            PullProcessor(PullService(
                settings=settings, store=self.store, topics=self.topics, groups=self.groups, creation=self.creation,
                clients=self.clients, offsets=self.offsets, holds=self.holds, on_get=self.metrics.on_get,
                is_master=None if self.replica is None else self.replica.may_write), callers=callers),
            SendBackProcessor(SendBackService(
                settings=settings, store=self.store, creation=self.creation, schedule=self.schedule,
                store_host=self.store_host, access=self.acl, replicated=replicated), callers=callers),
            ReplyProcessor(ReplyService(
                settings=settings, store=self.store, topics=self.topics, channel=ConnectedRequesters(self.clients),
                store_host=self.store_host, clock=clock, on_put=self.metrics.on_put), callers=callers,
                region=config.region),
        ):
            self.handlers.update(proc.handlers())
        for family in (  # the families beside sending and pulling, each over its service
            ConsumerProcessor(ConsumerService(
                clients=self.clients, groups=self.groups, topics=self.topics, creation=self.creation,
                locks=self.locks, auto_create_group=self.creation.auto_create_group,
                registration=lambda: self.registration), callers=callers),
            OffsetProcessor(OffsetService(offsets=self.offsets, store=self.store, topics=self.topics,
                                          creation=self.creation, metadata=self.metadata), callers=callers),
            AdminProcessor(AdminService(
                topics=self.topics, groups=self.groups, offsets=self.offsets, store=self.store, quota=self.quota,
                reserved_names=(config.cluster_name, config.broker_name), persist_topics=self.persist_topics,
                topics_changed=self.topics_changed, persist_groups=self.persist_groups, metadata=self.metadata),
                broker_name=config.broker_name),
            QueryProcessor(QueryService(store=self.store, stored_access=self.acl, clock=clock), callers=callers),
            EndTransactionProcessor(EndTransactionService(
                transactions=self.transactions, store=self.store, stored_access=self.acl,
                sync_flush=self.sync_flush, replicated=replicated), callers=callers),
            BrokerConfigProcessor(BrokerConfigService(
                settings=settings, replace=self._replace_config,
                reregister=lambda: self.topics_changed(persist=False)), callers=callers),
            RuntimeProcessor(RuntimeService(broker_name=config.broker_name, store=self.store,
                                            totals=self.metrics.totals, replica=self.replica, clock=clock,
                                            half_progress=lambda: self.transactions.half_progress)),
            DelayProgressProcessor(self.schedule.progress),
        ):
            self.handlers.update(family.handlers())
        # Hooks around dispatch, in order: ACL (when on) refuses first, then flow control; metrics
        # sees every outcome, refusals included.
        self.flow_control = FlowControlHook(settings)
        hooks = [self.flow_control, MetricsHook(self.metrics)]
        if self.acl is not None:
            hooks.insert(0, AclHook(self.acl))
        self.dispatcher = Dispatcher(self.handlers, hooks)

    def _settings(self) -> BrokerConfig:
        return self.config

    @property
    def sync_flush(self) -> bool:
        return self.config.store.flush_mode is FlushMode.SYNC

    @property
    def connection_count(self) -> int:
        return len(self.server.connections)

    @property
    def ready(self) -> bool:
        """Started and registered with a name server (the /readyz answer; see NamesrvRegistrar.announced)."""
        return self._ready and self.registrar.announced

    # lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> tuple[str, int]:
        cfg = self.config
        if self.sync_flush:
            log.info("flush mode SYNC_FLUSH: a send is acknowledged once it is on disk")
        else:
            log.info(
                "flush mode ASYNC_FLUSH: acknowledged messages written in the last %g s may be lost on power failure",
                cfg.store.async_flush_interval,
            )
        raise_open_file_limit()  # before the store fits its mapped-file bound to the limit
        await asyncio.to_thread(self._load)
        replica = self.replica
        if replica is None:
            self.store.add_dispatch_listener(self.holds.on_dispatch)
        else:
            # Consumers read below the replicated high-water mark only, and their long polls
            # are woken for a record once it is below it.
            self.store.visible_end = replica.high_water
            on_dispatch = self.holds.on_dispatch
            self.store.add_dispatch_listener(
                lambda topic, queue_id, offset, tags: replica.defer(
                    functools.partial(on_dispatch, topic, queue_id, offset, tags)))
        self.store.add_dispatch_listener(self.schedule.on_dispatch)
        if self.metadata is not None:
            self.metadata.attach()
        await self.store.start()
        self.transactions.rebuild()
        await self.schedule.start()
        if self.metadata is not None:  # the changes the log holds past the applied position
            await self.metadata.start()
        self.address = await self.server.start(cfg.listen_host, cfg.listen_port)
        log.info(
            "broker %s of cluster %s listening on %s:%d, advertised as %s, store %s",
            cfg.broker_name, cfg.cluster_name, *self.address, cfg.advertise_addr, cfg.store.root,
        )
        await self.registrar.register_all()
        if self.replica is not None:
            await self.replica.start()
        self._tasks = [
            asyncio.create_task(self.registrar.run(cfg.register_interval), name="register"),
            asyncio.create_task(self._every(cfg.offset_flush_interval, self.persist_offsets), name="offsets"),
            asyncio.create_task(self._every(10.0, self._scan_clients), name="clients"),
            asyncio.create_task(self.tx_checker.run(), name="transaction-check"),
        ]
        if self.acl is not None:
            self._tasks.append(asyncio.create_task(self.acl.watch(), name="acl-reload"))
        self._ready = True
        return self.address

    def _load(self) -> None:
        cfg = self.config
        (cfg.store.root / "config").mkdir(parents=True, exist_ok=True)
        self.store.load()
        self.topics.load()
        self.topics.ensure_system_topics(
            cfg.cluster_name, cfg.broker_name, cfg.auto_create_topic, cfg.default_topic_queue_nums
        )
        self.topics.persist()
        self.groups.load()
        self.offsets.load()
        self.transactions.load()
        self.schedule.load()
        if self.metadata is not None:
            self.metadata.load()

    async def stop(self) -> None:
        if self.replica is not None:
            # While still registered and serving: a master hands over first, so that producers
            # find the new master at their next route read and no send fails.
            await self.replica.prepare_stop()
        self._ready = False
        await cancel_and_wait(*self._tasks)
        await cancel_and_wait(self._register_soon)
        self.holds.wake_all()
        await self.registrar.unregister_all()  # under the brokerId of the role still held
        if self.replica is not None:
            await self.replica.stop()
        await self.server.stop()
        if self.metadata is not None:
            await self.metadata.stop()
        await self.persist_offsets()
        await self.persist_topics()
        await self.persist_groups()
        await self.transactions.persist()
        await self.schedule.stop()
        await self.store.shutdown()
        log.info("broker %s stopped cleanly", self.config.broker_name)

    async def _every(self, interval: float, fn: Callable) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                result = fn()
                if asyncio.iscoroutine(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic task %s failed", getattr(fn, "__name__", fn))

    def _scan_clients(self) -> None:
        self.clients.scan_expired()

    # persistence and registration ------------------------------------------------------------
    async def persist_offsets(self) -> None:
        # One writer at a time, the snapshot taken inside the lock: an older one never lands last.
        async with self._persist_locks["offsets"]:
            if self.offsets.dirty:
                snap = self.offsets.snapshot()
                await asyncio.to_thread(ConsumerOffsetManager.write, self.offsets.path, snap)

    async def persist_topics(self) -> None:
        # One writer per file at a time, the snapshot taken inside the lock: the newest wins.
        async with self._persist_locks["topics"]:
            snap = self.topics.wrapper()
            await asyncio.to_thread(write_json_atomic, self.topics.path, snap)

    async def persist_groups(self) -> None:
        async with self._persist_locks["groups"]:
            snap = self.groups.wrapper()
            await asyncio.to_thread(write_json_atomic, self.groups.path, snap)

    def topics_changed(self, persist: bool = True) -> asyncio.Task:
        """Topics changed (auto-create, retry topic, admin): persist and re-register soon.

        Changes made while a round runs trigger another round, so none is left unpersisted
        or unregistered. Returns the task doing it (done once this change was registered)."""
        self._topics_dirty = True
        self._topics_persist = self._topics_persist or persist
        if self._register_soon is None or self._register_soon.done():
            self._register_soon = asyncio.get_running_loop().create_task(self._persist_and_register())
        return self._register_soon

    async def _persist_and_register(self) -> None:
        while self._topics_dirty:
            self._topics_dirty = False
            await asyncio.sleep(0)
            failed = False
            if self._topics_persist:
                self._topics_persist = False
                try:
                    await self.persist_topics()
                except OSError as exc:  # e.g. a full disk: keep serving, try again
                    log.error("writing %s failed (%s); retrying in %.0f s", self.topics.path, exc, PERSIST_RETRY)
                    failed = self._topics_persist = self._topics_dirty = True
            await self.registrar.register_all()
            if failed:
                await asyncio.sleep(PERSIST_RETRY)

    def _replace_config(self, config: BrokerConfig) -> None:
        """UPDATE_BROKER_CONFIG's change: every reader of ``self.config`` sees it at its next request."""
        self.config = config

    @property
    def registration(self) -> "asyncio.Task | None":
        """The persist-and-register round started by ``topics_changed``, while it runs."""
        task = self._register_soon
        return task if task is not None and not task.done() else None

    def _may_write(self) -> bool:
        """Whether this broker may append on its own (delayed deliveries, transaction checks):
        always without replication, else only as its group's acknowledging master."""
        return self.replica is None or self.replica.may_write()

    def _replica_broker_id(self) -> int:
        return self.replica.broker_id if self.replica is not None else self.config.broker_id

    async def _register_for_replica(self) -> str:
        """Register now (a role change); the master's HA address the name servers named."""
        await self.registrar.register_all()
        return self.registrar.master_ha_addr

    def _notify_enabled(self, group: str) -> bool:
        g = self.groups.get(group)
        return g is None or g.notify_consumer_ids_changed_enable

    # remoting handler -------------------------------------------------------------------------
    def handle(self, conn: Connection, cmd: RemotingCommand) -> Answer:
        # Hot path (bench/hot_path.py): without replication, one attribute read.
        if self.replica is not None and cmd.code in WRITE_CODES:
            # RocketMQ answers a send to a slave SERVICE_NOT_AVAILABLE (its store's putMessage
            # refuses on BrokerRole.SLAVE); clients then refresh the route and retry the master.
            # Too few replicas in sync: a send is stored and answered SLAVE_NOT_AVAILABLE at once
            # (RocketMQ's answer, with the header its clients decode); other writes are refused.
            refusal = self.replica.master_refusal() if cmd.code in SEND_CODES else self.replica.write_refusal()
            if refusal is not None:
                return cmd.response(refusal[0], f"broker {self.config.broker_name}: {refusal[1]}")
        return self.dispatcher.handle(conn, cmd)

    def connection_lost(self, conn: Connection) -> None:
        self.clients.connection_closed(conn)
