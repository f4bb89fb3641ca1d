"""The name server: RocketMQ remoting requests in, route answers out.

Wires a :class:`tidemq.remoting.RemotingServer` to a :class:`RouteInfoManager` and a
:class:`KvConfigStore`. Invariants: every request gets exactly one answer unless it is oneway (the
transport drops answers to oneway requests); a malformed header or body is answered with
SYSTEM_ERROR and a remark naming the request and the field, never by closing the connection; an
unknown code is answered REQUEST_CODE_NOT_SUPPORTED. Handlers are synchronous and O(routes),
except that a registration body over :data:`DECODE_IN_THREAD_ABOVE` bytes is decoded in a worker
thread; its route change still happens on the loop, and not at all when the broker's connection
closed meanwhile (the close already dropped the broker). The expiry scan (and the ACL reload loop) are tasks owned by the server
and cancelled by :meth:`NamesrvServer.stop`; a closed broker connection drops that broker's routes
at once.

Readiness (:attr:`NamesrvServer.ready`, the /readyz answer): a name server is useful once it
holds the routes of every live broker. Name servers know no broker list, but every broker
registers once per registration period, so the server is ready once ``ready_delay`` seconds (a
period) have passed since start and a broker's registration was accepted, or once
``ready_grace`` seconds passed without one (a new cluster, or every broker down: an empty table
is then the truth); with both 0 it is ready as soon as it listens. Readiness never goes back to
false while the server runs: brokers expiring later is not the name server's fault, and a
rollout must not stall on it.

Write protection (:mod:`tidemq.namesrv.acl`): given an account source, every handled request
whose code is not in :data:`READ_CODES` must be signed by an admin account, before its handler
runs; reads stay open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import Awaitable, Callable

from tidemq.errors import TideMQError
from tidemq.namesrv.acl import AccountSource, WriteGuard
from tidemq.namesrv.bodies import RegisterBody, dumps, parse_data_version, parse_register_body
from tidemq.namesrv.config import NamesrvConfig
from tidemq.namesrv.kvconfig import NAMESPACE_ORDER_TOPIC_CONFIG, KvConfigStore
from tidemq.namesrv.routes import RouteInfoManager
from tidemq.remoting import Connection, RemotingCommand, RemotingServer, RequestCode, ResponseCode

log = logging.getLogger(__name__)

# Name-server request codes not (yet) in tidemq.remoting.codes.RequestCode.
PUT_KV_CONFIG = 100
GET_KV_CONFIG = 101
DELETE_KV_CONFIG = 102
GET_KVLIST_BY_NAMESPACE = 219

_CODE_NAMES = {
    PUT_KV_CONFIG: "PUT_KV_CONFIG",
    GET_KV_CONFIG: "GET_KV_CONFIG",
    DELETE_KV_CONFIG: "DELETE_KV_CONFIG",
    GET_KVLIST_BY_NAMESPACE: "GET_KVLIST_BY_NAMESPACE",
}

# Requests anyone may send, also with write protection on: they only read. Every other code the
# name server serves changes its state (routes, liveness, write permissions, KV config).
READ_CODES = frozenset({
    RequestCode.GET_ROUTEINFO_BY_TOPIC,
    RequestCode.GET_BROKER_CLUSTER_INFO,
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
    RequestCode.GET_TOPICS_BY_CLUSTER,
    GET_KV_CONFIG,
    GET_KVLIST_BY_NAMESPACE,
})
# A registration body larger than this is decoded in a worker thread (a 16 MiB JSON body takes
# a few hundred ms to parse).
DECODE_IN_THREAD_ABOVE = 256 * 1024

Handler = Callable[[Connection, RemotingCommand], "RemotingCommand | Awaitable[RemotingCommand]"]


def _code_name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return _CODE_NAMES.get(code, str(code))


def _required(cmd: RemotingCommand, name: str) -> str:
    value = cmd.get_str(name)
    if value is None or value == "":
        raise ValueError(f"missing header field {name!r}")
    return value


class NamesrvServer:
    """A RocketMQ 4.x compatible name server (a remoting RequestHandler).

    Counters for metrics are plain attributes: ``registrations``, ``unregistrations``,
    ``route_lookups``, ``route_not_found``, ``brokers_expired``, ``brokers_dropped_on_close``,
    ``requests``, ``request_errors``, ``acl_refused``; gauges are the properties
    ``brokers_alive`` and ``topics``.

    ``write_acl``: the accounts that may change state (see :mod:`tidemq.namesrv.acl`); None leaves
    every request open, as RocketMQ 4.x name servers.
    """

    def __init__(self, config: NamesrvConfig, clock: Callable[[], float] = time.time,
                 write_acl: AccountSource | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._monotonic = monotonic  # the readiness grace (wall-clock jumps must not shorten it)
        self._started_at: float | None = None
        self._broker_seen = False  # a registration was accepted since start
        self._acl = WriteGuard(write_acl) if write_acl is not None else None
        self._acl_task: asyncio.Task | None = None
        self.routes = RouteInfoManager(clock, config.broker_expiry)
        self.kv = KvConfigStore()
        self._remoting = RemotingServer(self, config.max_frame, tls=config.tls)
        self._scan_task: asyncio.Task | None = None
        self.address: tuple[str, int] | None = None
        self.registrations = 0
        self.unregistrations = 0
        self.route_lookups = 0
        self.route_not_found = 0
        self.brokers_expired = 0
        self.brokers_dropped_on_close = 0
        self.requests = 0
        self.request_errors = 0
        self._handlers: dict[int, Handler] = {
            RequestCode.REGISTER_BROKER: self._register_broker,
            RequestCode.UNREGISTER_BROKER: self._unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._get_route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._all_topics,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self._delete_topic,
            RequestCode.GET_TOPICS_BY_CLUSTER: self._topics_by_cluster,
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: self._wipe_write_perm,
            RequestCode.ADD_WRITE_PERM_OF_BROKER: self._add_write_perm,
            RequestCode.QUERY_DATA_VERSION: self._query_data_version,
            PUT_KV_CONFIG: self._put_kv,
            GET_KV_CONFIG: self._get_kv,
            DELETE_KV_CONFIG: self._delete_kv,
            GET_KVLIST_BY_NAMESPACE: self._get_kv_list,
        }

    # lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> tuple[str, int]:
        """Listen and start the expiry scan. Returns the bound (host, port); port 0 picks one."""
        if self.address is not None:
            raise RuntimeError("name server already started")
        self.address = await self._remoting.start(self.config.listen_host, self.config.listen_port)
        self._started_at = self._monotonic()
        self._scan_task = asyncio.create_task(self._scan_loop(), name="namesrv-expiry-scan")
        if self._acl is not None:
            self._acl_task = asyncio.create_task(self._acl.source.watch(), name="namesrv-acl-reload")
        log.info(
            "name server listening on %s:%d (broker expiry %g s, scan every %g s, writes %s)",
            self.address[0],
            self.address[1],
            self.config.broker_expiry,
            self.config.scan_interval,
            "signed by admin accounts only" if self._acl is not None else "open to anyone",
        )
        return self.address

    async def stop(self) -> None:
        """Stop scanning, close every connection and stop listening."""
        for task in (self._scan_task, self._acl_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._scan_task = self._acl_task = None
        self._started_at = None
        await self._remoting.stop()
        if self.address is not None:
            log.info("name server on %s:%d stopped", *self.address)
        self.address = None

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.scan_interval)
            try:
                self.brokers_expired += len(self.routes.scan_expired())
            except Exception:  # a bug in one scan must not end liveness checking
                log.exception("broker expiry scan failed")

    @property
    def ready(self) -> bool:
        """Listening for ``ready_delay`` seconds, and a broker registered since start or
        ``ready_grace`` seconds passed."""
        if self._started_at is None:
            return False
        elapsed = self._monotonic() - self._started_at
        return elapsed >= self.config.ready_delay and (self._broker_seen or elapsed >= self.config.ready_grace)

    # metrics ------------------------------------------------------------------------------------
    @property
    def brokers_alive(self) -> int:
        return self.routes.broker_count

    @property
    def topics(self) -> int:
        return self.routes.topic_count

    @property
    def acl_refused(self) -> int:
        return self._acl.refused if self._acl is not None else 0

    # RequestHandler -----------------------------------------------------------------------------
    def handle(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        self.requests += 1
        handler = self._handlers.get(cmd.code)
        if handler is None:
            self.request_errors += 1
            return cmd.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported"
            )
        if self._acl is not None and cmd.code not in READ_CODES:
            refusal = self._acl.check(conn, cmd, _code_name(cmd.code))
            if refusal is not None:
                return refusal
        try:
            return handler(conn, cmd)
        except (ValueError, TideMQError) as exc:
            return self._bad_request(conn, cmd, exc)

    def _bad_request(self, conn: Connection, cmd: RemotingCommand, exc: Exception) -> RemotingCommand:
        self.request_errors += 1
        remark = f"{_code_name(cmd.code)}: {exc}"
        log.warning("bad request from %s: %s", conn.peer, remark)
        return cmd.response(ResponseCode.SYSTEM_ERROR, remark)

    def connection_lost(self, conn: Connection) -> None:
        self.brokers_dropped_on_close += len(self.routes.on_connection_closed(conn))

    # brokers ------------------------------------------------------------------------------------
    def _register_broker(
        self, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | Awaitable[RemotingCommand]:
        who = (_required(cmd, "clusterName"), _required(cmd, "brokerName"),
               _required(cmd, "brokerAddr"), cmd.get_int("brokerId"))
        crc = cmd.get_int("bodyCrc32", 0)
        body = cmd.body_bytes()
        if crc != 0 and (zlib.crc32(body) & 0x7FFFFFFF) != (crc & 0x7FFFFFFF):
            self.request_errors += 1
            log.warning(
                "register of broker %s (%s) from %s: body crc32 does not match", who[1], who[2], conn.peer
            )
            return cmd.response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        compressed = cmd.get_bool("compressed")
        if len(body) <= DECODE_IN_THREAD_ABOVE:
            return self._apply_registration(conn, cmd, who, parse_register_body(body, compressed))
        return self._register_large(conn, cmd, who, body, compressed)

    async def _register_large(self, conn: Connection, cmd: RemotingCommand, who: tuple[str, str, str, int],
                              body: bytes, compressed: bool) -> RemotingCommand:
        try:
            reg = await asyncio.to_thread(parse_register_body, body, compressed)
            if not conn.is_open:
                return cmd.response(ResponseCode.SYSTEM_ERROR, "connection closed during registration")
            return self._apply_registration(conn, cmd, who, reg)
        except (ValueError, TideMQError) as exc:
            return self._bad_request(conn, cmd, exc)

    def _apply_registration(self, conn: Connection, cmd: RemotingCommand, who: tuple[str, str, str, int],
                            reg: RegisterBody) -> RemotingCommand:
        cluster, name, addr, broker_id = who
        info = self.routes.register_broker(
            cluster,
            name,
            addr,
            broker_id,
            reg.topic_configs,
            reg.data_version,
            conn_key=conn,
            ha_server_addr=cmd.get_str("haServerAddr") or "",
        )
        self.registrations += 1
        self._broker_seen = True
        order_conf = self.kv.namespace(NAMESPACE_ORDER_TOPIC_CONFIG)
        return cmd.response(
            ResponseCode.SUCCESS,
            None,
            {k: v for k, v in info.items() if v},
            dumps({"table": order_conf}) if order_conf else None,
        )

    def _unregister_broker(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        cluster = _required(cmd, "clusterName")
        name = _required(cmd, "brokerName")
        addr = _required(cmd, "brokerAddr")
        broker_id = cmd.get_int("brokerId")
        if self.routes.unregister_broker(cluster, name, addr, broker_id):
            self.unregistrations += 1
        return cmd.response(ResponseCode.SUCCESS)

    def _query_data_version(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        addr = _required(cmd, "brokerAddr")
        changed, stored = self.routes.query_data_version(addr, parse_data_version(cmd.body_bytes()))
        return cmd.response(
            ResponseCode.SUCCESS,
            None,
            {"changed": changed},
            dumps(stored) if stored is not None else None,
        )

    # routes -------------------------------------------------------------------------------------
    def _get_route(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = _required(cmd, "topic")
        self.route_lookups += 1
        route = self.routes.pickup_topic_route(topic)
        if route is None:
            self.route_not_found += 1
            return cmd.response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {topic}",
            )
        return cmd.response(ResponseCode.SUCCESS, None, None, dumps(route))

    def _cluster_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(ResponseCode.SUCCESS, None, None, dumps(self.routes.cluster_info()))

    def _all_topics(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(
            ResponseCode.SUCCESS, None, None, dumps({"topicList": self.routes.all_topics()})
        )

    def _topics_by_cluster(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        cluster = _required(cmd, "cluster")
        body = dumps({"topicList": self.routes.topics_by_cluster(cluster)})
        return cmd.response(ResponseCode.SUCCESS, None, None, body)

    def _delete_topic(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        topic = _required(cmd, "topic")
        self.routes.delete_topic(topic, cmd.get_str("clusterName") or None)
        return cmd.response(ResponseCode.SUCCESS)

    def _wipe_write_perm(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        count = self.routes.wipe_write_perm(_required(cmd, "brokerName"))
        return cmd.response(ResponseCode.SUCCESS, None, {"wipeTopicCount": count})

    def _add_write_perm(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        count = self.routes.add_write_perm(_required(cmd, "brokerName"))
        return cmd.response(ResponseCode.SUCCESS, None, {"addTopicCount": count})

    # kv config ----------------------------------------------------------------------------------
    def _put_kv(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        ns, key = _required(cmd, "namespace"), _required(cmd, "key")
        value = cmd.get_str("value")
        if value is None:
            raise ValueError("missing header field 'value'")
        self.kv.put(ns, key, value)
        return cmd.response(ResponseCode.SUCCESS)

    def _get_kv(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        ns, key = _required(cmd, "namespace"), _required(cmd, "key")
        value = self.kv.get(ns, key)
        if value is None:
            return cmd.response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {ns} Key: {key}"
            )
        return cmd.response(ResponseCode.SUCCESS, None, {"value": value})

    def _delete_kv(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self.kv.delete(_required(cmd, "namespace"), _required(cmd, "key"))
        return cmd.response(ResponseCode.SUCCESS)

    def _get_kv_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        ns = _required(cmd, "namespace")
        table = self.kv.namespace(ns)
        if not table:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {ns}")
        return cmd.response(ResponseCode.SUCCESS, None, None, dumps({"table": table}))
