"""Remoting adapter of the consumer registry family: HEART_BEAT, UNREGISTER_CLIENT,
GET_CONSUMER_LIST_BY_GROUP, GET_CONSUMER_CONNECTION_LIST, LOCK_BATCH_MQ and UNLOCK_BATCH_MQ.

Decodes the header or JSON body, calls :class:`tidemq.broker.messaging.consumers.ConsumerService`
and encodes its answer; :func:`notify_consumer_ids_changed` is the client registry's notifier.
Bodies are read leniently, as RocketMQ's clients of every language send them: entries without a
group or topic and values of the wrong type are skipped, enums arrive as names (Java) or ordinals
(C++); a body that is not a JSON object is a bad request.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

import orjson

from tidemq.broker.messaging.consumers import (
    ConsumerData,
    ConsumerService,
    Heartbeat,
    QueueLocks,
    QueueRef,
    SubscriptionData,
)
from tidemq.broker.processors.common import Callers, Handler
from tidemq.errors import BrokerError, FrameError
from tidemq.remoting import (
    Connection,
    LanguageCode,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    fastjson,
)
from tidemq.remoting.headers.consumer import (
    CONSUME_FROM,
    CONSUME_TYPES,
    MESSAGE_MODELS,
    decode_consumer_group_header,
    decode_unregister_client_header,
    enum_name,
)

log = logging.getLogger(__name__)


class ConsumerProcessor:
    def __init__(self, service: ConsumerService, *, callers: Callers) -> None:
        self.service = service
        self.callers = callers

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.HEART_BEAT: self.heartbeat,
            RequestCode.UNREGISTER_CLIENT: self.unregister,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list,
            RequestCode.LOCK_BATCH_MQ: self.lock,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: self.connection_list,
        }

    def heartbeat(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        hb = decode_heartbeat(cmd)
        try:
            pending = self.service.heartbeat(self.callers(conn, cmd), conn, hb)
        except BrokerError as exc:
            log.info("heartbeat from %s refused: %s", conn.peer, exc.remark)
            return cmd.response(exc.code or ResponseCode.SYSTEM_ERROR, exc.remark)
        if pending is None:
            return cmd.response(ResponseCode.SUCCESS)
        return _success_after(cmd, pending)

    def unregister(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = decode_unregister_client_header(cmd.ext_fields)
        self.service.unregister(conn, h.producer_group, h.consumer_group)
        return cmd.response(ResponseCode.SUCCESS)

    def consumer_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = decode_consumer_group_header(cmd.ext_fields)
        ids = self.service.consumer_ids(h.consumer_group)
        return cmd.response(body=orjson.dumps({"consumerIdList": ids}))

    def lock(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        locked = self.service.lock(decode_queue_locks(cmd))
        body = {"lockOKMQSet": [{"topic": q.topic, "brokerName": q.broker_name, "queueId": q.queue_id}
                                for q in locked]}
        return cmd.response(body=orjson.dumps(body))

    def unlock(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self.service.unlock(decode_queue_locks(cmd))
        return cmd.response(ResponseCode.SUCCESS)

    def connection_list(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = decode_consumer_group_header(cmd.ext_fields)
        info = self.service.connections(h.consumer_group)
        body = {
            "connectionSet": [
                {"clientId": c.client_id, "clientAddr": c.client_addr, "language": _lang(c.language),
                 "version": c.version}
                for c in info.connections
            ],
            "subscriptionTable": {s.topic: s.to_json() for s in info.subscriptions},
            "consumeType": info.consume_type,
            "messageModel": info.message_model,
            "consumeFromWhere": info.consume_from_where,
        }
        return cmd.response(body=orjson.dumps(body))


def notify_consumer_ids_changed(conn: Connection, group: str) -> None:
    """The registry's notifier over remoting: a oneway NOTIFY_CONSUMER_IDS_CHANGED, after which
    the member rebalances at once instead of at its next periodic rebalance."""
    conn.invoke_oneway(RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                               {"consumerGroup": group}, oneway=True))


async def _success_after(cmd: RemotingCommand, pending: Awaitable[None]) -> RemotingCommand:
    await pending
    return cmd.response(ResponseCode.SUCCESS)


def decode_heartbeat(cmd: RemotingCommand) -> Heartbeat:
    """HEART_BEAT's body (RocketMQ's HeartbeatData) with the request's language and version."""
    data = _json_body(cmd)
    consumers = []
    for cd in _list(data.get("consumerDataSet")):
        if not isinstance(cd, dict) or not cd.get("groupName"):
            continue
        listed = _list(cd.get("subscriptionDataSet"))
        consumers.append(ConsumerData(
            group=str(cd["groupName"]),
            consume_type=enum_name(cd.get("consumeType"), CONSUME_TYPES, "CONSUME_PASSIVELY"),
            message_model=enum_name(cd.get("messageModel"), MESSAGE_MODELS, "CLUSTERING"),
            consume_from_where=enum_name(cd.get("consumeFromWhere"), CONSUME_FROM, "CONSUME_FROM_LAST_OFFSET"),
            subscriptions=tuple(
                SubscriptionData(
                    topic=str(sd["topic"]),
                    expression=str(sd.get("subString") or "*"),
                    sub_version=_as_int(sd.get("subVersion"), 0),
                    expression_type=str(sd.get("expressionType") or "TAG"),
                )
                for sd in listed if isinstance(sd, dict) and sd.get("topic")
            ),
            listed=len(listed),
        ))
    producers = tuple(str(pd["groupName"]) for pd in _list(data.get("producerDataSet"))
                      if isinstance(pd, dict) and pd.get("groupName"))
    return Heartbeat(str(data.get("clientID") or ""), cmd.language, cmd.version, tuple(consumers), producers)


def decode_queue_locks(cmd: RemotingCommand) -> QueueLocks:
    """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ's body (RocketMQ's LockBatchRequestBody)."""
    data = _json_body(cmd)
    queues = tuple(
        QueueRef(str(mq.get("topic")), str(mq.get("brokerName")), _as_int(mq.get("queueId"), -1))
        for mq in _list(data.get("mqSet")) if isinstance(mq, dict)
    )
    return QueueLocks(str(data.get("consumerGroup") or ""), str(data.get("clientId") or ""), queues)


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
    """A JSON number or numeric string as an int, else ``default``."""
    if not isinstance(v, (int, float, str)):
        return default
    try:
        return int(v)
    except ValueError:
        return default


def _lang(code: int) -> str:
    try:
        return LanguageCode(code).name
    except ValueError:
        return "OTHER"
