"""Admin: topics, subscription groups, cluster info, stats and message queries (mqadmin's calls).

Every operation that targets "the cluster" goes to each master broker of it, found through
GET_BROKER_CLUSTER_INFO, as ``mqadmin ... -c CLUSTER`` does. Errors are AdminError (what cannot be
done and why) or BrokerError (a server refused, with its remark and a hint).

Signing: every request is signed with the config's ACL account when it has one. Name servers
started with ``--acl-file`` require their state-changing requests (here DELETE_TOPIC_IN_NAMESRV)
to be signed by one of *their* admin accounts; ``namesrv_credentials`` signs those requests with
another account than the brokers' (the operator's per-Cluster key), over a connection of their own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import orjson

from tidemq.client.admin_protocol import (
    ConsumerProgress,
    QueueProgress,
    TopicOffset,
    create_topic_request,
    parse_consume_stats,
    parse_kv_table,
    parse_string_list,
    parse_topic_stats,
    query_message_request,
)
from tidemq.bodies import SubscriptionGroupConfig
from tidemq.client.base import ClientBase
from tidemq.client.config import ClientConfig, make_config, namesrv_arg
from tidemq.client.instance import ClientInstance
from tidemq.client.response import broker_error, check, header_int
from tidemq.client.route import ClusterInfo, Perm, TopicRouteData
from tidemq.client.validation import check_group, check_topic_name
from tidemq.errors import AdminError, ClientError, CodecError, RemotingError, TideMQError
from tidemq.message import MessageExt, Prop, decode_offset_msg_id, decode_records
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode, fastjson
from tidemq.remoting.acl import AclSigner
from tidemq.remoting.headers.replica import SwitchoverHeader, decode_switchover_answer
from tidemq.remoting.tls import ClientTlsConfig, client_context

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_QUERY_MAX_NUM = 32


class Admin(ClientBase):
    """An asyncio admin client. Use ``async with Admin("127.0.0.1:9876") as admin:``."""

    _not_started = ("admin is not started: call `await admin.start()` or use "
                    "`async with Admin(...)`")

    def __init__(
        self, name_servers: str | Sequence[str] | None = None, config: ClientConfig | None = None,
        namesrv_credentials: tuple[str, str] | None = None,
    ) -> None:
        self.config = make_config(name_servers, config)
        # (access key, secret key) for name-server writes; None: the config's account signs them.
        self._ns_signer = AclSigner(*namesrv_credentials) if namesrv_credentials else None
        self._ns_client: RemotingClient | None = None

    async def _detach(self, inst: ClientInstance) -> None:
        client, self._ns_client = self._ns_client, None
        if client is not None:
            await client.close()

    async def _namesrv_write(self, addr: str, cmd: RemotingCommand) -> RemotingCommand:
        """Send a state-changing request to one name server, signed for it."""
        inst = self._require()
        if self._ns_signer is None:
            return await inst.invoke(addr, cmd)
        cfg = inst.config
        if self._ns_client is None:
            tls = ClientTlsConfig(cfg.tls, cfg.tls_ca_file, cfg.tls_server_name, cfg.tls_verify_hostname)
            self._ns_client = RemotingClient(connect_timeout=cfg.connect_timeout, rpc_hook=self._ns_signer,
                                             ssl_context=client_context(tls), server_name=cfg.tls_server_name)
        return await self._ns_client.invoke(addr, cmd, cfg.request_timeout)

    # helpers -----------------------------------------------------------------------------------
    async def _namesrv(self, code: RequestCode, fields: dict | None, what: str) -> RemotingCommand:
        inst = self._require()
        resp = await inst.invoke_namesrv(lambda: RemotingCommand.request(code, fields))
        return check(resp, what)

    async def _broker(self, addr: str, cmd: RemotingCommand, what: str,
                      ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        return check(await self._require().invoke(addr, cmd), what, addr, ok)

    async def _targets(self, cluster: str | None, broker_addr: str | None) -> list[str]:
        """Master addresses for an operation given exactly one of cluster / broker_addr."""
        if (cluster is None) == (broker_addr is None):
            raise ClientError("give exactly one of cluster= or broker_addr=")
        if broker_addr is not None:
            return [broker_addr]
        info = await self.cluster_info()
        if cluster not in info.cluster_addr_table:
            known = ", ".join(sorted(info.cluster_addr_table)) or "none"
            raise AdminError(
                f"cluster {cluster!r} is not known to the name server (known clusters: {known}); "
                "check the cluster name and that its brokers are running"
            )
        addrs = sorted(info.master_addrs(cluster).values())
        if not addrs:
            raise AdminError(f"cluster {cluster!r} has no running master broker")
        return addrs

    async def _gather_brokers(self, addrs: Sequence[str], call: Callable[[str], Awaitable[T]]) -> list[T]:
        return list(await asyncio.gather(*(call(a) for a in addrs)))

    # cluster -----------------------------------------------------------------------------------
    async def cluster_info(self) -> ClusterInfo:
        resp = await self._namesrv(RequestCode.GET_BROKER_CLUSTER_INFO, None, "cluster info")
        try:
            return ClusterInfo.from_json(resp.body_bytes() or b"{}")
        except CodecError as exc:
            raise AdminError(f"cluster info from the name server is malformed: {exc}") from None

    async def get_broker_runtime_info(self, addr: str) -> dict[str, str]:
        """One broker's GET_BROKER_RUNTIME_INFO table (RocketMQ's KVTable): its version, message
        totals and store offsets, and for a replica of a replicated group the ``ha*`` keys of
        tidemq.remoting.headers.replica (role, epoch, master, in-sync set, lag)."""
        resp = await self._broker(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO),
                                  "broker runtime info")
        try:
            return parse_kv_table(resp.body_bytes() or b"{}", "broker runtime info")
        except CodecError as exc:
            raise AdminError(f"runtime info from {addr} is malformed: {exc}") from None

    async def switchover(self, addr: str, broker_name: str, to: int | None = None) -> int:
        """Ask the master at ``addr`` to hand group ``broker_name``'s mastership to replica ``to``
        (None: the in-sync follower furthest ahead); the id of the replica that takes over. The
        new master registers as brokerId 0 itself; watch :meth:`cluster_info` to see it. Raises
        BrokerError with the master's sentence when it cannot (not the master, target not in
        sync, no in-sync follower)."""
        try:
            header = SwitchoverHeader(broker_name, to).fields()
        except ValueError as exc:
            raise ClientError(str(exc)) from None
        resp = await self._broker(addr, RemotingCommand.request(RequestCode.SWITCHOVER, header),
                                  f"switchover of {broker_name}")
        try:
            return decode_switchover_answer(resp.ext_fields)
        except ValueError as exc:
            raise AdminError(f"switchover answer from {addr} is malformed: {exc}") from None

    # topics ------------------------------------------------------------------------------------
    async def create_topic(
        self,
        topic: str,
        read_queues: int = 8,
        write_queues: int = 8,
        perm: int = 6,
        order: bool = False,
        cluster: str | None = None,
        broker_addr: str | None = None,
        attributes: Mapping[str, str | None] | None = None,
    ) -> list[str]:
        """Create or update ``topic`` on one broker or on every master of ``cluster``.

        Returns the broker addresses updated. The brokers register the topic with the name
        servers themselves. ``attributes`` sets topic attributes (None as a value removes one),
        e.g. ``{"message.type": "FIFO"}``; those not named keep their value.
        """
        check_topic_name(topic)
        if read_queues < 0 or write_queues < 0 or read_queues + write_queues == 0:
            raise ClientError("read_queues and write_queues must be >= 0 and not both 0")
        if perm & ~int(Perm.INHERIT | Perm.WRITE | Perm.READ | Perm.PRIORITY):
            raise ClientError(f"perm {perm} is not a combination of 2 (write), 4 (read), 1, 8")
        addrs = await self._targets(cluster, broker_addr)

        async def one(addr: str) -> str:
            cmd = create_topic_request(topic, read_queues, write_queues, perm, order, attributes)
            await self._broker(addr, cmd, f"create topic {topic}")
            return addr

        return await self._gather_brokers(addrs, one)

    async def delete_topic(self, topic: str, cluster: str) -> list[str]:
        """Delete ``topic`` on every master of ``cluster``, then from every name server."""
        check_topic_name(topic)
        addrs = await self._targets(cluster, None)

        async def one(addr: str) -> str:
            cmd = RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
            await self._broker(addr, cmd, f"delete topic {topic}")
            return addr

        done = await self._gather_brokers(addrs, one)
        inst = self._require()
        for ns in inst.config.name_servers:
            cmd = RemotingCommand.request(
                RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic, "clusterName": cluster}
            )
            check(await self._namesrv_write(ns, cmd), f"delete topic {topic} from name server", ns)
        inst.routes.forget(topic)
        return done

    async def topic_list(self) -> list[str]:
        resp = await self._namesrv(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, None, "topic list")
        try:
            return sorted(parse_string_list(resp.body_bytes(), "topicList", "topic list"))
        except CodecError as exc:
            raise AdminError(str(exc)) from None

    async def topic_route(self, topic: str) -> TopicRouteData:
        check_topic_name(topic)
        inst = self._require()
        route = await inst.fetch_route(topic)
        if route is None:
            raise AdminError(
                f"topic {topic} does not exist on the name server: create it with "
                f"`tidemq admin updateTopic -n {namesrv_arg(inst.config.name_servers)} -c DefaultCluster "
                f"-t {topic}`"
            )
        inst.routes.update(topic, route)
        return route

    async def topic_status(self, topic: str) -> list[TopicOffset]:
        """(queue, min offset, max offset, last update ms) of every queue of ``topic``."""
        route = await self.topic_route(topic)
        addrs = sorted(set(route.master_addrs().values()))

        async def one(addr: str) -> list[TopicOffset]:
            cmd = RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic})
            resp = await self._broker(addr, cmd, f"status of topic {topic}")
            try:
                return parse_topic_stats(resp.body_bytes())
            except CodecError as exc:
                raise AdminError(f"topic stats from {addr} are malformed: {exc}") from None

        parts = await self._gather_brokers(addrs, one)
        return sorted(t for part in parts for t in part)

    # subscription groups -----------------------------------------------------------------------
    async def update_subscription_group(
        self,
        group: str,
        cluster: str | None = None,
        broker_addr: str | None = None,
        consume_enable: bool = True,
        consume_broadcast_enable: bool = True,
        retry_max_times: int = 16,
        retry_queue_nums: int = 1,
        consume_from_min_enable: bool = True,
    ) -> list[str]:
        check_group(group)
        config = SubscriptionGroupConfig(
            group_name=group,
            consume_enable=consume_enable,
            consume_from_min_enable=consume_from_min_enable,
            consume_broadcast_enable=consume_broadcast_enable,
            retry_queue_nums=retry_queue_nums,
            retry_max_times=retry_max_times,
        )
        addrs = await self._targets(cluster, broker_addr)

        async def one(addr: str) -> str:
            cmd = RemotingCommand.request(
                RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, orjson.dumps(config.to_json())
            )
            await self._broker(addr, cmd, f"update subscription group {group}")
            return addr

        return await self._gather_brokers(addrs, one)

    async def consumer_progress(self, group: str, topic: str | None = None,
                                broker_addrs: Sequence[str] | None = None) -> ConsumerProgress:
        """Per-queue broker offset, consumer offset and last consume time; ``.total_lag``.

        With a topic, asks that topic's brokers about it; without, asks every master of every
        cluster about all topics the group has offsets for (``broker_addrs``: these masters, for
        a caller that knows them already; the operator asks for many groups at once).
        """
        check_group(group)
        if broker_addrs is not None:
            addrs = sorted(set(broker_addrs))
        elif topic is not None:
            route = await self.topic_route(topic)
            addrs = sorted(set(route.master_addrs().values()))
        else:
            addrs = sorted(set((await self.cluster_info()).all_master_addrs().values()))

        async def one(addr: str) -> tuple[list[QueueProgress], float]:
            cmd = RemotingCommand.request(
                RequestCode.GET_CONSUME_STATS, {"consumerGroup": group, "topic": topic}
            )
            resp = await self._require().invoke(addr, cmd)
            if resp.code in (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                             ResponseCode.CONSUMER_NOT_ONLINE):
                return [], 0.0
            check(resp, f"consumer progress of group {group}", addr)
            try:
                return parse_consume_stats(resp.body_bytes())
            except CodecError as exc:
                raise AdminError(f"consume stats from {addr} are malformed: {exc}") from None

        parts = await self._gather_brokers(addrs, one)
        queues = sorted(q for qs, _ in parts for q in qs)
        return ConsumerProgress(group, tuple(queues), sum(tps for _, tps in parts))

    async def get_consumer_list(self, group: str, topic: str) -> list[str]:
        """Client ids of the group's consumers, as a broker of ``topic`` knows them."""
        check_group(group)
        route = await self.topic_route(topic)
        addrs = sorted(set(route.master_addrs().values()))
        if not addrs:
            raise AdminError(f"topic {topic} has no running master broker")
        cmd = RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        resp = await self._broker(addrs[0], cmd, f"consumer list of group {group}")
        try:
            return sorted(parse_string_list(resp.body_bytes(), "consumerIdList", "consumer list"))
        except CodecError as exc:
            raise AdminError(str(exc)) from None

    async def broker_topic_configs(self, broker_addr: str) -> dict[str, dict]:
        """The broker's own topic table (GET_ALL_TOPIC_CONFIG): topic -> TopicConfig JSON
        (readQueueNums, writeQueueNums, perm, order ...), fresher than any route."""
        cmd = RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG)
        resp = await self._broker(broker_addr, cmd, "topic configs")
        try:
            doc: Any = fastjson.loads(resp.body_bytes() or b"{}")  # not an object: AttributeError
            table = doc.get("topicConfigTable") or {}
        except (TideMQError, ValueError, AttributeError) as exc:
            raise AdminError(f"topic configs from {broker_addr} are malformed: {exc}") from None
        return {str(k): v for k, v in table.items() if isinstance(v, dict)}

    async def queue_offset_range(self, broker_addr: str, topic: str, queue_id: int) -> tuple[int, int]:
        """(min offset, max offset) of one queue on one broker, whatever its write count."""
        out = []
        for code, what in ((RequestCode.GET_MIN_OFFSET, "min offset"),
                           (RequestCode.GET_MAX_OFFSET, "max offset")):
            cmd = RemotingCommand.request(code, {"topic": topic, "queueId": queue_id})
            resp = await self._broker(broker_addr, cmd, f"{what} of {topic}:{queue_id}")
            out.append(header_int(resp, "offset", f"{what} of {topic}:{queue_id}"))
        return out[0], out[1]

    async def topic_consumer_groups(self, topic: str) -> list[str]:
        """Groups that have committed offsets for ``topic`` on any of its master brokers
        (from GET_ALL_CONSUMER_OFFSET, whose table keys are ``topic@group``)."""
        route = await self.topic_route(topic)

        async def one(addr: str) -> set[str]:
            cmd = RemotingCommand.request(RequestCode.GET_ALL_CONSUMER_OFFSET)
            resp = await self._broker(addr, cmd, f"consumer offsets of topic {topic}")
            try:
                doc: Any = fastjson.loads(resp.body_bytes() or b"{}")  # not an object: AttributeError
                table = doc.get("offsetTable") or {}
            except (TideMQError, ValueError, AttributeError) as exc:
                raise AdminError(f"consumer offsets from {addr} are malformed: {exc}") from None
            return {str(k).rpartition("@")[2] for k in table if str(k).rpartition("@")[0] == topic}

        parts = await self._gather_brokers(sorted(set(route.master_addrs().values())), one)
        return sorted(set().union(*parts))

    async def broker_consumer_offsets(self, broker_addr: str) -> dict[str, dict[str, dict[int, int]]]:
        """topic -> group -> queue id -> committed offset, as one broker stores them
        (GET_ALL_CONSUMER_OFFSET; RocketMQ keeps a queue's offsets on the queue's broker)."""
        cmd = RemotingCommand.request(RequestCode.GET_ALL_CONSUMER_OFFSET)
        resp = await self._broker(broker_addr, cmd, "consumer offsets")
        out: dict[str, dict[str, dict[int, int]]] = {}
        try:
            doc: Any = fastjson.loads(resp.body_bytes() or b"{}")  # not an object: AttributeError
            for key, queues in (doc.get("offsetTable") or {}).items():
                topic, _, group = str(key).rpartition("@")
                out.setdefault(topic, {})[group] = {int(q): int(o) for q, o in queues.items()}
        except (TideMQError, ValueError, TypeError, AttributeError) as exc:
            raise AdminError(f"consumer offsets from {broker_addr} are malformed: {exc}") from None
        return out

    async def broker_delay_progress(self, broker_addr: str) -> tuple[dict[int, int], int | None]:
        """How far one broker has delivered the messages it holds for later (GET_ALL_DELAY_OFFSET):
        delay level -> next offset of its ``SCHEDULE_TOPIC_XXXX`` queue ``level - 1``, and the lowest
        undelivered offset of the timer queue (None from a broker that reports none, RocketMQ's)."""
        cmd = RemotingCommand.request(RequestCode.GET_ALL_DELAY_OFFSET)
        resp = await self._broker(broker_addr, cmd, "delay offsets")
        try:
            doc: Any = fastjson.loads(resp.body_bytes() or b"{}")  # not an object: AttributeError
            levels = {int(k): int(v) for k, v in (doc.get("offsetTable") or {}).items()}
            timer = doc.get("timerOffset")
            return levels, None if timer is None else int(timer)
        except (TideMQError, ValueError, TypeError, AttributeError) as exc:
            raise AdminError(f"delay offsets from {broker_addr} are malformed: {exc}") from None

    # broker config (mqadmin getBrokerConfig / updateBrokerConfig) -------------------------------
    async def broker_config(self, broker_addr: str) -> dict[str, str]:
        """One broker's GET_BROKER_CONFIG: RocketMQ key -> value (``brokerPermission`` ...)."""
        resp = await self._broker(broker_addr, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG),
                                  "broker config")
        try:
            text = resp.body_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise AdminError(f"the broker config from {broker_addr} is not UTF-8 text") from None
        pairs = (line.strip().partition("=") for line in text.splitlines())
        return {k.strip(): v.strip() for k, sep, v in pairs if sep and k.strip() and k.strip()[0] not in "#!"}

    async def update_broker_config(self, broker_addr: str, changes: Mapping[str, str]) -> None:
        """UPDATE_BROKER_CONFIG of one broker, e.g. ``{"brokerPermission": "4"}`` to stop its
        writes (mqadmin updateBrokerConfig -k brokerPermission -v 4, how RocketMQ retires a
        broker). Brokers take only the keys they allow at runtime, and none of them persists."""
        if not changes or any("\n" in f"{k}{v}" or "=" in k for k, v in changes.items()):
            raise ClientError(f"broker config changes must be key=value pairs without newlines, got {dict(changes)!r}")
        body = "".join(f"{k}={v}\n" for k, v in changes.items()).encode()
        await self._broker(broker_addr, RemotingCommand.request(RequestCode.UPDATE_BROKER_CONFIG, body=body),
                           f"update broker config {', '.join(changes)}")

    # messages ----------------------------------------------------------------------------------
    async def _query(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int,
                     unique_key: bool) -> list[MessageExt]:
        route = await self.topic_route(topic)
        addrs = sorted(set(route.master_addrs().values()))

        async def one(addr: str) -> list[MessageExt]:
            cmd = query_message_request(topic, key, max_num, begin_ms, end_ms, unique_key)
            resp = await self._require().invoke(addr, cmd)
            if resp.code == ResponseCode.QUERY_NOT_FOUND:
                return []
            check(resp, f"query of topic {topic} for key {key}", addr)
            try:
                return decode_records(resp.body_bytes())
            except CodecError as exc:
                raise AdminError(f"query answer from {addr} is malformed: {exc}") from None

        parts = await self._gather_brokers(addrs, one)
        msgs = [m for part in parts for m in part if m.topic == topic]
        msgs.sort(key=lambda m: (m.store_timestamp, m.offset_msg_id))
        return msgs

    async def query_msg_by_key(
        self, topic: str, key: str, max_num: int = DEFAULT_QUERY_MAX_NUM, begin_ms: int = 0,
        end_ms: int | None = None,
    ) -> list[MessageExt]:
        """Messages of ``topic`` whose KEYS contain ``key`` (from the brokers' index)."""
        check_topic_name(topic)
        if not key:
            raise ClientError("key is blank")
        end = end_ms if end_ms is not None else self._require().now_ms()
        msgs = await self._query(topic, key, max_num, begin_ms, end, unique_key=False)
        return [m for m in msgs if key in m.keys][:max_num]

    async def query_msg_by_id(self, topic: str | None, msg_id: str) -> MessageExt:
        """Find a message by offset message id or by its UNIQ_KEY (client message id).

        An offset id names its broker, so ``topic`` may be None for it; a UNIQ_KEY is looked up
        in the index of every master of ``topic``.
        """
        msg_id = msg_id.strip().upper()
        decoded = _decode_offset_id(msg_id)
        if topic is None:
            if decoded is None:
                raise ClientError(
                    f"{msg_id!r} is not an offset message id; give the topic to look it up as a "
                    "unique key (client message id)"
                )
            found = await self._view(*decoded)
            if found is None:
                raise AdminError(f"message {msg_id} not found at broker {decoded[0]}")
            return found
        check_topic_name(topic)
        inst = self._require()
        route = await self.topic_route(topic)
        known = {a for bd in route.broker_datas for a in bd.broker_addrs.values()}
        if decoded is not None and decoded[0] in known:
            found = await self._view(*decoded)
            if found is not None:
                return found
        msgs = await self._query(topic, msg_id, DEFAULT_QUERY_MAX_NUM, 0, inst.now_ms(),
                                 unique_key=True)
        for m in msgs:
            if m.properties.get(Prop.UNIQ_KEY) == msg_id:
                return m
        if decoded is not None and decoded[0] not in known:
            # The store host inside the id may be an address the route spells differently.
            found = await self._view(*decoded)
            if found is not None and found.topic == topic:
                return found
        raise AdminError(f"message {msg_id} not found in topic {topic}")

    async def _view(self, addr: str, offset: int) -> MessageExt | None:
        cmd = RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
        try:
            resp = await self._require().invoke(addr, cmd)
        except RemotingError as exc:
            log.info("view message at %s offset %d failed: %s", addr, offset, exc)
            return None
        if resp.code != ResponseCode.SUCCESS:
            log.info("%s", broker_error(resp, f"view message at offset {offset}", addr))
            return None
        try:
            msgs = decode_records(resp.body_bytes())
        except CodecError as exc:
            raise AdminError(f"message at {addr} offset {offset} is malformed: {exc}") from None
        return msgs[0] if msgs else None


def _decode_offset_id(msg_id: str) -> tuple[str, int] | None:
    """(broker address, commit-log offset) if ``msg_id`` can be an offset id, else None."""
    if len(msg_id) not in (32, 56):
        return None
    try:
        addr, offset = decode_offset_msg_id(msg_id)
    except CodecError:
        return None
    port = int(addr.rsplit(":", 1)[1])
    if not 0 < port < 65536 or offset < 0:
        return None
    return addr, offset

