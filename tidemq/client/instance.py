"""ClientInstance: the connections, routes and background work that producers, consumers and
admins share.

One instance exists per (ClientConfig, event loop): :meth:`ClientInstance.acquire` hands out the
shared one and counts users; the last :meth:`release` closes it. An instance owns

* a :class:`tidemq.remoting.RemotingClient` (one connection per broker / name server address);
* the :class:`~tidemq.client.route_cache.RouteCache` (topic routes, broker name -> addresses);
* two background tasks, route refresh and heartbeat, cancelled on close;
* the :class:`~tidemq.client.route_refresh.FaultRefresher`: a failed send or pull re-reads its
  topic's route at once (bounded per topic), so clients follow a broker group's failover; a
  lookup that finds no master (or nothing to read from) goes through the same bound, and while
  the route names no master, reads go to the group's lowest-id follower (:meth:`queue_read_addr`);
* the group registry a heartbeat reports (producer groups, consumer groups + subscriptions).

Name servers are tried in turn: a request that cannot reach one (connect error or timeout) moves
on to the next, and the next request starts from the one that last answered. Brokers' requests
to the client (NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE, ...) go to the handler
registered for their code (:meth:`ClientInstance.register_request_handler`); without one they are
ignored, and sync ones answered REQUEST_CODE_NOT_SUPPORTED so the broker never waits.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Protocol

from tidemq.client.config import ClientConfig
from tidemq.client.heartbeat import ConsumerData, build_heartbeat, build_unregister
from tidemq.client.ids import UniqIdGenerator, make_client_id
from tidemq.client.response import check
from tidemq.client.route import MessageQueue, TopicRouteData
from tidemq.client.route_cache import RouteCache
from tidemq.client.route_refresh import BURST as REFRESH_BURST, FaultRefresher
from tidemq.client.tasks import cancel_all, keep
from tidemq.errors import ClientError, CodecError, ConnectError, RemotingError, TideMQError
from tidemq.message import local_ip_bytes
from tidemq.remoting import Connection, RemotingClient, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.tls import ClientTlsConfig, client_context
from tidemq.remoting.acl import AclSigner

log = logging.getLogger(__name__)

UNREGISTER_TIMEOUT = 1.0


class ConsumerMember(Protocol):
    group: str

    def consumer_data(self) -> ConsumerData: ...


# A handler of a broker -> client request: returns a response, None (not mine / oneway), or an
# awaitable of one. Several handlers may share a code (e.g. two consumers); the first answer wins.
ServerRequestHandler = Callable[[Connection, RemotingCommand], "RemotingCommand | Awaitable[RemotingCommand | None] | None"]


class ClientInstance:
    _registry: dict[tuple[ClientConfig, asyncio.AbstractEventLoop], "ClientInstance"] = {}
    # Threads with loops of their own (Spark's reading threads, one per partition) share the
    # registry: every look-up and change holds this lock.
    _registry_lock = threading.Lock()

    def __init__(self, config: ClientConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        signer = (AclSigner(config.access_key, config.secret_key)
                  if config.access_key is not None and config.secret_key is not None else None)
        tls = ClientTlsConfig(config.tls, config.tls_ca_file, config.tls_server_name, config.tls_verify_hostname)
        self.remoting = RemotingClient(handler=self, connect_timeout=config.connect_timeout,
                                       rpc_hook=signer, ssl_context=client_context(tls),
                                       server_name=config.tls_server_name)
        self.routes = RouteCache()
        self.client_id = ""
        self._uniq: UniqIdGenerator | None = None
        self._ns_index = random.randrange(len(config.name_servers))
        self._producers: Counter[str] = Counter()
        self._consumers: list[ConsumerMember] = []
        self._tasks: set[asyncio.Task] = set()
        self._route_lock = asyncio.Lock()
        self.fault_refresher = FaultRefresher(
            lambda topic: self.get_route(topic, refresh=True), config.fault_route_refresh_interval,
            spawn=self._spawn, burst=REFRESH_BURST)
        self._users = 0
        self._state = "new"  # new -> started -> closed
        self._start_task: asyncio.Future[None] | None = None
        self._key: tuple[ClientConfig, asyncio.AbstractEventLoop] | None = None
        self._request_handlers: dict[int, list[ServerRequestHandler]] = {}

    # lifecycle ---------------------------------------------------------------------------------
    @classmethod
    async def acquire(cls, config: ClientConfig) -> "ClientInstance":
        """The shared instance for ``config`` in the running loop, started; count one user."""
        inst = cls._register(config, asyncio.get_running_loop())
        try:
            await inst.start()
        except BaseException:
            await inst.release()
            raise
        return inst

    @classmethod
    def _register(cls, config: ClientConfig, loop: asyncio.AbstractEventLoop) -> "ClientInstance":
        """The instance for ``(config, loop)``, made if missing, with one more user; entries of
        closed loops are dropped."""
        with cls._registry_lock:
            for key in [k for k in cls._registry if k[1].is_closed()]:
                del cls._registry[key]
            key = (config, loop)
            inst = cls._registry.get(key)
            if inst is None:
                inst = cls(config)
                inst._key = key
                cls._registry[key] = inst
            inst._users += 1
            return inst

    def _drop_user(self) -> bool:
        """One user less; True when that was the last one (the instance left the registry)."""
        with self._registry_lock:
            self._users -= 1
            if self._users > 0:
                return False
            if self._key is not None and self._registry.get(self._key) is self:
                del self._registry[self._key]
            return True

    async def release(self) -> None:
        if self._drop_user():
            await self.close()

    async def start(self) -> None:
        """Start once; concurrent callers wait for the same start."""
        if self._state == "closed":
            raise ClientError("client instance is closed; create a new producer/consumer")
        if self._start_task is None:
            self._start_task = asyncio.ensure_future(self._start())
        await asyncio.shield(self._start_task)

    async def _start(self) -> None:
        ip = await asyncio.to_thread(local_ip_bytes)
        self.client_id = make_client_id(socket.inet_ntoa(ip), self.config.instance_name)
        self._uniq = UniqIdGenerator(ip, self.clock)
        self._state = "started"
        self._spawn(self._every(self.config.route_refresh_interval, self.refresh_routes, "route refresh"))
        self._spawn(self._every(self.config.heartbeat_interval, self.send_heartbeat, "heartbeat"))
        log.debug("client instance %s started (name servers %s)", self.client_id,
                  ";".join(self.config.name_servers))

    async def close(self) -> None:
        if self._state == "closed":
            return
        self._state = "closed"
        if self._start_task is not None and not self._start_task.done():
            self._start_task.cancel()
        await cancel_all(list(self._tasks))
        self._tasks.clear()
        await self.remoting.close()
        log.debug("client instance %s closed", self.client_id)

    @property
    def started(self) -> bool:
        return self._state == "started"

    def _spawn(self, coro: Awaitable[object]) -> asyncio.Task:
        return keep(self._tasks, coro)

    async def _every(self, interval: float, fn: Callable[[], Awaitable[object]], name: str) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await fn()
            except TideMQError as exc:
                log.warning("%s of client %s failed: %s", name, self.client_id, exc)
            except Exception:
                log.exception("%s of client %s failed", name, self.client_id)

    def next_uniq_id(self) -> str:
        if self._uniq is None:
            raise ClientError("client instance not started")
        return self._uniq.next_id()

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # group registry ----------------------------------------------------------------------------
    def add_producer(self, group: str) -> None:
        self._producers[group] += 1

    async def remove_producer(self, group: str) -> None:
        self._producers[group] -= 1
        if self._producers[group] <= 0:
            del self._producers[group]
            await self._unregister(producer_group=group)

    def add_consumer(self, consumer: ConsumerMember) -> None:
        self._consumers.append(consumer)

    async def remove_consumer(self, consumer: ConsumerMember) -> None:
        if consumer in self._consumers:
            self._consumers.remove(consumer)
        if not any(c.group == consumer.group for c in self._consumers):
            await self._unregister(consumer_group=consumer.group)

    async def _unregister(self, producer_group: str | None = None,
                          consumer_group: str | None = None) -> None:
        addrs = self.routes.all_addrs() if consumer_group else set(self.routes.master_addrs().values())

        async def one(addr: str) -> None:
            cmd = build_unregister(self.client_id, producer_group, consumer_group)
            try:
                await self.remoting.invoke(addr, cmd, UNREGISTER_TIMEOUT)
            except RemotingError as exc:
                log.debug("unregister of %s from %s failed: %s", producer_group or consumer_group,
                          addr, exc)

        await asyncio.gather(*(one(a) for a in sorted(addrs)))

    # heartbeats --------------------------------------------------------------------------------
    async def send_heartbeat(self) -> int:
        """Send the heartbeat to every master (every broker when consumers exist).

        Returns the number of brokers that acknowledged it. Failures are logged, not raised.
        """
        if not self._producers and not self._consumers:
            return 0
        consumers = [c.consumer_data() for c in self._consumers]
        producers = sorted(self._producers)
        addrs = self.routes.all_addrs() if consumers else set(self.routes.master_addrs().values())

        async def one(addr: str) -> bool:
            cmd = build_heartbeat(self.client_id, producers, consumers)
            try:
                resp = await self.remoting.invoke(addr, cmd, self.config.request_timeout)
                check(resp, "heartbeat", addr)
                return True
            except TideMQError as exc:
                log.warning("heartbeat of client %s to %s failed: %s", self.client_id, addr, exc)
                return False

        results = await asyncio.gather(*(one(a) for a in sorted(addrs)))
        return sum(results)

    def schedule_heartbeat(self) -> None:
        if self.started and (self._producers or self._consumers):
            self._spawn(self.send_heartbeat())

    # name servers ------------------------------------------------------------------------------
    async def invoke_namesrv(self, cmd_factory: Callable[[], RemotingCommand],
                             timeout: float | None = None) -> RemotingCommand:
        """Send a request to the name servers in turn until one answers."""
        timeout = timeout or self.config.request_timeout
        servers = self.config.name_servers
        errors: list[str] = []
        for step in range(len(servers)):
            index = (self._ns_index + step) % len(servers)
            addr = servers[index]
            try:
                resp = await self.remoting.invoke(addr, cmd_factory(), timeout)
            except RemotingError as exc:
                errors.append(str(exc))
                log.info("name server %s failed, trying the next: %s", addr, exc)
                self.remoting.close_connection(addr)
                continue
            self._ns_index = index
            return resp
        raise ConnectError(
            "no name server answered (" + "; ".join(errors) + "): check name_servers "
            f"{';'.join(servers)} and that the name server is running"
        )

    async def fetch_route(self, topic: str) -> TopicRouteData | None:
        """Ask the name servers for ``topic``'s route; None if they do not know the topic."""
        resp = await self.invoke_namesrv(
            lambda: RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        )
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        check(resp, f"route lookup of topic {topic}")
        body = resp.body_bytes()
        if not body:
            return None
        try:
            return TopicRouteData.from_json(body)
        except CodecError as exc:
            raise ClientError(f"route of topic {topic} is malformed: {exc}") from None

    async def get_route(self, topic: str, refresh: bool = False) -> TopicRouteData | None:
        """The cached route, fetched when missing (or when ``refresh``). None: no such topic.

        A route once learned survives a failed or empty refresh (as in RocketMQ's clients).
        """
        cached = self.routes.get(topic)
        if cached is not None and not refresh:
            return cached
        async with self._route_lock:
            cached = self.routes.get(topic)
            if cached is not None and not refresh:
                return cached
            try:
                route = await self.fetch_route(topic)
            except TideMQError:
                if cached is None:
                    raise
                log.warning("route refresh of topic %s failed; keeping the cached route", topic)
                return cached
            if route is None:
                if cached is not None:
                    log.info("name servers no longer know topic %s; keeping its cached route", topic)
                return cached
            new_addrs = self.routes.update(topic, route)
        if new_addrs:
            log.debug("client %s learned brokers %s", self.client_id, sorted(new_addrs))
            self.schedule_heartbeat()
        return route

    async def refresh_routes(self) -> None:
        for topic in self.routes.topics():
            await self.get_route(topic, refresh=True)

    def refresh_route_after_fault(self, topic: str) -> "asyncio.Future[None] | None":
        """Re-read ``topic``'s route now because a request to one of its brokers failed: the
        refresh in flight or a new one, None when one started too recently (FaultRefresher)."""
        if not self.started:
            return None
        return self.fault_refresher.request(topic)

    async def master_addr(self, topic: str, broker_name: str) -> str:
        """The master address of ``broker_name``; when the route names none, ``topic``'s route is
        re-read once through the bounded fault-driven refresh (during a failover every request
        to the group lands here, and must not each ask the name servers)."""
        addr = self.routes.master_addr(broker_name)
        if addr is None:
            await self.fault_refresher.refresh(topic, self.config.request_timeout)
            addr = self.routes.master_addr(broker_name)
        if addr is None:
            raise ClientError(
                f"broker {broker_name} of topic {topic} has no master address in the route; "
                "is the broker running and registered with the name server? (a replicated "
                "group names one within its lease after losing its master)"
            )
        return addr

    async def queue_master_addr(self, mq: MessageQueue) -> str:
        """The master address serving ``mq``. Its topic's route is fetched first when not cached
        (so the route refresh keeps it current); :meth:`master_addr` then finds the broker."""
        await self._ensure_route(mq.topic)
        return await self.master_addr(mq.topic, mq.broker_name)

    async def queue_read_addr(self, mq: MessageQueue) -> str:
        """Where pulls and queue offsets of ``mq`` go: its group's master, else (no master
        registered, as during a failover) the follower with the lowest brokerId, which serves
        what it holds replicated (RocketMQ's findBrokerAddressInSubscribe falls back alike).
        Commits and locks go to the master only (:meth:`queue_master_addr`). While it answers a
        follower, each call also asks for a bounded route refresh (no wait), so reads return to
        the master as soon as one registers rather than at the next periodic route poll."""
        if self.routes.get(mq.topic) is None:  # hot path (bench/produce_consume.py pull): cached
            await self._ensure_route(mq.topic)
        addr = self.routes.master_addr(mq.broker_name)
        if addr is not None:
            return addr
        addr = self.routes.read_addr(mq.broker_name)
        if addr is None:
            await self.fault_refresher.refresh(mq.topic, self.config.request_timeout)
            addr = self.routes.read_addr(mq.broker_name)
        elif self.started:
            self.fault_refresher.request(mq.topic)
        if addr is None:
            raise ClientError(
                f"broker {mq.broker_name} of topic {mq.topic} has no address in the route; is "
                "any of its brokers running and registered with the name server?"
            )
        return addr

    async def _ensure_route(self, topic: str) -> None:
        """Fetch ``topic``'s route when it is not cached; ClientError when there is none."""
        if self.routes.get(topic) is None and await self.get_route(topic) is None:
            raise ClientError(f"no route for topic {topic}: create the topic first")

    # brokers -----------------------------------------------------------------------------------
    def invoke(self, addr: str, cmd: RemotingCommand, timeout: float | None = None) -> Awaitable[RemotingCommand]:
        """The broker's answer to ``cmd`` (an awaitable; a plain function to save a coroutine
        frame per request on the hot path, bench/produce_consume.py)."""
        return self.remoting.invoke(addr, cmd, timeout or self.config.request_timeout)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        await self.remoting.invoke_oneway(addr, cmd)

    # requests from servers (RequestHandler) ----------------------------------------------------
    def register_request_handler(self, code: int, handler: ServerRequestHandler) -> None:
        self._request_handlers.setdefault(int(code), []).append(handler)

    def unregister_request_handler(self, code: int, handler: ServerRequestHandler) -> None:
        handlers = self._request_handlers.get(int(code), [])
        if handler in handlers:
            handlers.remove(handler)

    def handle(self, conn: Connection, cmd: RemotingCommand) -> "RemotingCommand | Awaitable[RemotingCommand | None] | None":
        for handler in list(self._request_handlers.get(cmd.code, ())):
            result = handler(conn, cmd)
            if result is not None:
                return result
        if self._request_handlers.get(cmd.code):
            return None
        try:
            name = RequestCode(cmd.code).name
        except ValueError:
            name = str(cmd.code)
        log.debug("client %s ignores request %s from %s (%s)", self.client_id, name, conn.peer,
                  cmd.ext_fields)
        if cmd.is_oneway:
            return None
        return cmd.response(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            f" request type {cmd.code} not supported by the TideMQ Python client",
        )

    def connection_lost(self, conn: Connection) -> None:
        log.debug("client %s lost connection to %s", self.client_id, conn.peer)
