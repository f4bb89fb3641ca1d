"""Client management: HEART_BEAT, UNREGISTER_CLIENT, consumer lists, offsets and queue locks."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import orjson

from tidemq.broker.clients import (
    CONSUME_FROM,
    MAX_HEARTBEAT_GROUPS,
    MAX_HEARTBEAT_SUBSCRIPTIONS,
    CONSUME_TYPES,
    MESSAGE_MODELS,
    Subscription,
    SubscriptionParseError,
    enum_name,
    parse_tag_expression,
)
from tidemq.broker.processors.common import refused
from tidemq.broker.topics import RETRY_PREFIX, loggable
from tidemq.errors import BrokerError, FrameError
from tidemq.remoting import Connection, LanguageCode, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting import fastjson

if TYPE_CHECKING:
    from tidemq.broker.broker import Broker

log = logging.getLogger(__name__)

HEARTBEAT_REGISTER_WAIT = 2.0  # s; clients time a heartbeat out after 3 s


def _json_body(cmd: RemotingCommand) -> dict:
    try:
        obj = fastjson.loads(cmd.body_bytes() or b"{}")
    except FrameError as exc:
        raise ValueError(f"body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("body is not a JSON object")
    return obj


def _list(v: object) -> list:
    """A JSON array from a client body, or nothing (a wrong type is ignored, not fatal)."""
    return v if isinstance(v, list) else []


def _as_int(v: object, default: int = 0) -> int:
    try:
        return int(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default


class ConsumerManageProcessor:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def handlers(self) -> dict[int, object]:
        return {
            RequestCode.HEART_BEAT: self.heartbeat,
            RequestCode.UNREGISTER_CLIENT: self.unregister,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list,
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_offset,
            RequestCode.LOCK_BATCH_MQ: self.lock,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: self.connection_list,
        }

    def heartbeat(self, conn: Connection, cmd: RemotingCommand):
        try:
            return self._heartbeat(conn, cmd)
        except BrokerError as exc:
            log.info("heartbeat from %s refused: %s", conn.peer, exc.remark)
            return cmd.response(exc.code or ResponseCode.SYSTEM_ERROR, exc.remark)

    def _heartbeat(self, conn: Connection, cmd: RemotingCommand):
        b = self.broker
        data = _json_body(cmd)
        client_id = str(data.get("clientID") or conn.peer)
        consumers = [cd for cd in _list(data.get("consumerDataSet")) if isinstance(cd, dict) and cd.get("groupName")]
        producers = [pd for pd in _list(data.get("producerDataSet")) if isinstance(pd, dict) and pd.get("groupName")]
        if len(consumers) + len(producers) > MAX_HEARTBEAT_GROUPS:
            raise refused(ResponseCode.SYSTEM_ERROR, f"a heartbeat names {len(consumers) + len(producers)} groups, "
                          f"more than {MAX_HEARTBEAT_GROUPS}")
        for d in (*consumers, *producers):  # nothing registered or created unless every name is valid
            b.creation.check_group_name(str(d["groupName"]))
        for cd in consumers:
            if len(_list(cd.get("subscriptionDataSet"))) > MAX_HEARTBEAT_SUBSCRIPTIONS:
                raise refused(ResponseCode.SYSTEM_ERROR, f"consumer group {loggable(cd['groupName'])} subscribes "
                              f"more than {MAX_HEARTBEAT_SUBSCRIPTIONS} topics in one heartbeat")
        full = b.clients.room_for(conn, [str(cd["groupName"]) for cd in consumers],
                                  [str(pd["groupName"]) for pd in producers])
        if full is not None:
            raise refused(ResponseCode.SYSTEM_ERROR, full)
        principal = b.principal(conn, cmd)
        created_topic = False
        for cd in consumers:
            group = str(cd["groupName"])
            g = b.groups.get(group)
            if g is None and b.config.auto_create_subscription_group:
                g = b.creation.group(group, principal, ResponseCode.SYSTEM_ERROR)
            retry = RETRY_PREFIX + group
            if g is not None and g.retry_queue_nums > 0 and b.topics.get(retry) is None:
                b.creation.retry_topic(retry, principal)
                created_topic = True
        for cd in consumers:
            group = str(cd["groupName"])
            subs = []
            for sd in _list(cd.get("subscriptionDataSet")):
                if not isinstance(sd, dict) or not sd.get("topic"):
                    continue
                expr = str(sd.get("subString") or "*")
                try:
                    parsed = parse_tag_expression(expr)
                except SubscriptionParseError:
                    parsed = None
                subs.append(
                    Subscription(
                        topic=str(sd["topic"]),
                        expression=expr,
                        sub_version=_as_int(sd.get("subVersion"), 0),
                        tag_codes=parsed[1] if parsed else None,
                        expression_type=str(sd.get("expressionType") or "TAG"),
                    )
                )
            b.clients.register_consumer(
                group,
                conn,
                client_id,
                cmd.language,
                cmd.version,
                enum_name(cd.get("consumeType"), CONSUME_TYPES, "CONSUME_PASSIVELY"),
                enum_name(cd.get("messageModel"), MESSAGE_MODELS, "CLUSTERING"),
                enum_name(cd.get("consumeFromWhere"), CONSUME_FROM, "CONSUME_FROM_LAST_OFFSET"),
                subs,
            )
        for pd in producers:
            b.clients.register_producer(str(pd["groupName"]), conn, client_id, cmd.language, cmd.version)
        if created_topic:  # as Java: answered once the name servers know the new retry topic
            return self._after_registration(cmd)
        return cmd.response(ResponseCode.SUCCESS)

    async def _after_registration(self, cmd: RemotingCommand) -> RemotingCommand:
        b = self.broker
        pending = b.registration
        if pending is not None:
            try:  # shielded: a client that goes away must not cancel the registration round
                await asyncio.wait_for(asyncio.shield(pending), HEARTBEAT_REGISTER_WAIT)
            except asyncio.TimeoutError:
                log.info("heartbeat answered before the name servers confirmed the new retry topic "
                         "(registration still running after %.1f s)", HEARTBEAT_REGISTER_WAIT)
            except Exception as exc:  # the consumer is registered; the next round registers the topic
                log.warning("heartbeat answered although registering its new retry topic failed: %s", exc)
        return cmd.response(ResponseCode.SUCCESS)

    def unregister(self, conn: Connection, cmd: RemotingCommand):
        b = self.broker
        pg = cmd.get_str("producerGroup") or ""
        cg = cmd.get_str("consumerGroup") or ""
        if pg:
            b.clients.unregister_producer(pg, conn)
        if cg:
            b.clients.unregister_consumer(cg, conn)
        return cmd.response(ResponseCode.SUCCESS)

    def consumer_list(self, conn: Connection, cmd: RemotingCommand):
        group = cmd.get_str("consumerGroup") or ""
        info = self.broker.clients.group(group)
        if info is None or not info.channels:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return cmd.response(body=orjson.dumps({"consumerIdList": info.client_ids()}))

    def query_offset(self, conn: Connection, cmd: RemotingCommand):
        b = self.broker
        group = cmd.get_str("consumerGroup") or ""
        try:
            b.creation.check_group_name(group)
        except BrokerError as exc:
            return cmd.response(exc.code, exc.remark)
        topic = cmd.get_str("topic") or ""
        queue_id = cmd.get_int("queueId", bits=32)
        offset = b.offsets.query(group, topic, queue_id)
        if offset is not None and offset >= 0:
            return cmd.response(fields={"offset": offset})
        # RocketMQ answers 0 for a group without an offset on a queue that still starts at 0 and
        # is not far behind, so a new group reads a young queue from its first message.
        if b.store.min_offset(topic, queue_id) <= 0:
            return cmd.response(fields={"offset": 0})
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND,
            "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
        )

    def update_offset(self, conn: Connection, cmd: RemotingCommand):
        b = self.broker
        group = cmd.get_str("consumerGroup") or ""
        topic = cmd.get_str("topic") or ""
        if not group or not topic:
            raise ValueError("consumerGroup and topic are required")
        offset = cmd.get_int("commitOffset")
        queue_id = cmd.get_int("queueId", bits=32)
        try:
            # The offset table only holds queues that exist, of groups that exist (RocketMQ 5).
            b.creation.group(group, b.principal(conn, cmd), ResponseCode.SYSTEM_ERROR)
        except BrokerError as exc:
            return cmd.response(exc.code, exc.remark)
        tc = b.topics.get(topic)
        if tc is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"Topic {loggable(topic)} not exist!")
        if not 0 <= queue_id < tc.queue_nums:
            return cmd.response(ResponseCode.SYSTEM_ERROR,
                                f"queueId[{queue_id}] is illegal, topic {topic} has {tc.queue_nums} queues")
        if offset < 0:  # Java clients commit -1 for a queue they never read: keep what is stored
            if offset != -1:
                log.debug("commitOffset %d of %s on %s/%d ignored", offset, loggable(group), topic, queue_id)
            return cmd.response(ResponseCode.SUCCESS)
        b.offsets.commit(group, topic, queue_id, offset)
        return cmd.response(ResponseCode.SUCCESS)

    def _mq_set(self, cmd: RemotingCommand) -> tuple[str, str, list[tuple[str, str, int]]]:
        """Group, client id and the queues of the request that exist: the lock table only holds
        known groups' locks on queues of known topics, so its size stays bounded."""
        b = self.broker
        data = _json_body(cmd)
        group = str(data.get("consumerGroup") or "")
        mqs = []
        if b.groups.get(group) is not None:
            for mq in _list(data.get("mqSet")):
                if not isinstance(mq, dict):
                    continue
                tc = b.topics.get(str(mq.get("topic")))
                q = _as_int(mq.get("queueId"), -1)
                if tc is not None and 0 <= q < tc.queue_nums:
                    mqs.append((tc.topic_name, str(mq.get("brokerName")), q))
        return group, str(data.get("clientId") or ""), mqs

    def lock(self, conn: Connection, cmd: RemotingCommand):
        group, client_id, mqs = self._mq_set(cmd)
        locked = self.broker.locks.try_lock(group, client_id, mqs)
        body = {"lockOKMQSet": [{"topic": t, "brokerName": bn, "queueId": q} for t, bn, q in locked]}
        return cmd.response(body=orjson.dumps(body))

    def unlock(self, conn: Connection, cmd: RemotingCommand):
        group, client_id, mqs = self._mq_set(cmd)
        self.broker.locks.unlock(group, client_id, mqs)
        return cmd.response(ResponseCode.SUCCESS)

    def connection_list(self, conn: Connection, cmd: RemotingCommand):
        group = cmd.get_str("consumerGroup") or ""
        info = self.broker.clients.group(group)
        if info is None or not info.channels:
            return cmd.response(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        body = {
            "connectionSet": [
                {"clientId": ch.client_id, "clientAddr": ch.conn.peer, "language": _lang(ch.language), "version": ch.version}
                for ch in info.channels.values()
            ],
            "subscriptionTable": {t: s.to_json() for t, s in info.subscriptions.items()},
            "consumeType": info.consume_type,
            "messageModel": info.message_model,
            "consumeFromWhere": info.consume_from_where,
        }
        return cmd.response(body=orjson.dumps(body))


def _lang(code: int) -> str:
    try:
        return LanguageCode(code).name
    except ValueError:
        return "OTHER"
