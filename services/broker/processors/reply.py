"""SEND_REPLY_MESSAGE (324) and SEND_REPLY_MESSAGE_V2 (325): request-reply replies.

A replier sends the reply like a message (V2 requests use the one-letter send header names). The
broker checks it (write permission, topic name, topic exists and is writable, queue id in range),
finds the requester among the connected producers by the ``REPLY_TO_CLIENT`` client id and pushes
the reply to it with PUSH_REPLY_MESSAGE_TO_CLIENT (326), a request the requester must answer
within ``reply_push_timeout``; the push header carries the send header plus ``bornHost``,
``storeHost`` and ``storeTimestamp`` (RocketMQ's ReplyMessageRequestHeader), and the properties
gain ``PUSH_REPLY_TIME``. Then, with ``store_reply_message`` (default on, as RocketMQ's
storeReplyMessageEnable), the reply is also stored in its topic.

The replier gets SUCCESS when the push succeeded, else SYSTEM_ERROR with a remark naming the
client id (not connected, or the push failed), as in RocketMQ's ReplyMessageProcessor. Every
answer carries msgId/queueId/queueOffset as strings.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING

from tidemq.broker.processors.common import refused
from tidemq.broker.processors.send import long_names, peer_host, send_fields
from tidemq.broker.store.store import PutRequest, PutStatus
from tidemq.broker.topics import NOT_ALLOWED_SEND, Perm, validate_topic_name
from tidemq.errors import BrokerError, RemotingError
from tidemq.message import Prop, decode_properties, encode_properties
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.broker import Broker

log = logging.getLogger(__name__)

_WRITE = int(Perm.WRITE)
# Send-header fields the push repeats (ReplyMessageRequestHeader), in long names.
PUSHED_FIELDS = (
    "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
    "bornTimestamp", "flag", "reconsumeTimes", "unitMode",
)


def _answer(cmd: RemotingCommand, code: int, remark: str | None, region: str, msg_id: str = "0",
            queue_id: int = 0, queue_offset: int = 0) -> RemotingCommand:
    return cmd.response(code, remark, send_fields(msg_id, queue_id, queue_offset, region))


def build_push(fields: dict[str, str], properties: dict[str, str], body: bytes, born_host: str,
               store_host: str, store_timestamp: int) -> RemotingCommand:
    """The PUSH_REPLY_MESSAGE_TO_CLIENT request for a reply (pure)."""
    header: dict[str, object] = {k: fields[k] for k in PUSHED_FIELDS if fields.get(k) not in (None, "")}
    header["properties"] = encode_properties(properties)
    header["bornHost"] = born_host
    header["storeHost"] = store_host
    header["storeTimestamp"] = store_timestamp
    return RemotingCommand.request(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, header, body)


class ReplyProcessor:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self.pushed = 0
        self.failed = 0

    def handlers(self) -> dict[int, object]:
        return {
            RequestCode.SEND_REPLY_MESSAGE: self.reply,
            RequestCode.SEND_REPLY_MESSAGE_V2: self.reply,
        }

    def find_requester(self, client_id: str) -> Connection | None:
        """The open connection of a producer registered (by heartbeat) with ``client_id``."""
        for channels in self.broker.clients.producers.values():
            for conn, ch in channels.items():
                if ch.client_id == client_id and conn.is_open:
                    return conn
        return None

    async def reply(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        region = self.broker.config.region
        if cmd.code == RequestCode.SEND_REPLY_MESSAGE_V2:
            cmd.ext_fields = long_names(cmd.ext_fields)
        try:
            queue_id = self._check(cmd)
        except BrokerError as exc:
            self.failed += 1
            return _answer(cmd, exc.code, exc.remark, region)
        except ValueError as exc:
            self.failed += 1
            return _answer(cmd, ResponseCode.SYSTEM_ERROR, f"bad reply request header: {exc}", region)
        props = decode_properties(cmd.get_str("properties") or "")
        body = cmd.body_bytes()
        pushed, remark = await self._push(conn, cmd, props, body)
        code = ResponseCode.SUCCESS if pushed else ResponseCode.SYSTEM_ERROR
        if pushed:
            self.pushed += 1
        else:
            self.failed += 1
        msg_id, queue_offset = "0", 0
        if self.broker.config.store_reply_message:
            stored = self._store(conn, cmd, props, body, queue_id)
            if stored is not None:
                msg_id, queue_offset = stored
        return _answer(cmd, code, None if pushed else remark, region, msg_id, queue_id, queue_offset)

    def _check(self, cmd: RemotingCommand) -> int:
        cfg = self.broker.config
        topic = cmd.get_str("topic") or ""
        if not cfg.broker_permission & _WRITE:
            raise refused(ResponseCode.NO_PERMISSION,
                          f"the broker[{cfg.broker_name}] sending message is forbidden")
        problem = validate_topic_name(topic)
        if problem:
            raise refused(ResponseCode.SYSTEM_ERROR, f"{problem}; fix the topic name")
        if topic in NOT_ALLOWED_SEND:
            raise refused(ResponseCode.NO_PERMISSION, f"sending message to topic[{topic}] is forbidden")
        tc = self.broker.topics.get(topic)
        if tc is None:
            raise refused(ResponseCode.TOPIC_NOT_EXIST,
                          f"topic[{topic}] not exist, apply first please! (replies go to "
                          f"{cfg.cluster_name}_REPLY_TOPIC)")
        if not tc.writable:
            raise refused(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        queue_id = cmd.get_int("queueId", -1, bits=32)
        if queue_id >= tc.queue_nums:
            raise refused(ResponseCode.SYSTEM_ERROR,
                          f"request queueId[{queue_id}] is illegal, topic {topic} has {tc.queue_nums} queues")
        if queue_id < 0:
            queue_id = random.randrange(tc.write_queue_nums or 1)
        for name in ("flag", "sysFlag", "reconsumeTimes"):
            cmd.get_int(name, 0, bits=32)  # ValueError now rather than after the push
        cmd.get_int("bornTimestamp", 0)
        body = cmd.body_bytes()
        if not body or len(body) > cfg.store.max_message_size:
            raise refused(ResponseCode.MESSAGE_ILLEGAL,
                          f"reply body is {len(body)} bytes; it must be 1..{cfg.store.max_message_size}")
        return queue_id

    async def _push(self, conn: Connection, cmd: RemotingCommand, props: dict[str, str],
                    body: bytes) -> tuple[bool, str]:
        b = self.broker
        client_id = props.get(Prop.REPLY_TO_CLIENT)
        if not client_id:
            return False, f"reply message properties[{Prop.REPLY_TO_CLIENT}] is null"
        target = self.find_requester(client_id)
        if target is None:
            log.info("reply for client %s from %s: that client is not connected", client_id, conn.peer)
            return False, (f"push reply message fail, channel of <{client_id}> not found: the "
                           "requester is not connected to this broker (gone, or not yet heartbeating)")
        now_ms = int(b.clock() * 1000)
        pushed_props = dict(props)
        pushed_props[Prop.PUSH_REPLY_TIME] = str(now_ms)
        push = build_push(cmd.ext_fields, pushed_props, body, conn.peer, b.config.advertise_addr, now_ms)
        try:
            resp = await target.invoke(push, b.config.reply_push_timeout)
        except RemotingError as exc:
            log.warning("push of a reply to client %s at %s failed: %s", client_id, target.peer, exc)
            return False, f"push reply message to {client_id} fail: {exc}"
        if resp.code != ResponseCode.SUCCESS:
            log.warning("client %s refused a reply push: %s %s", client_id, resp.code, resp.remark)
            return False, f"push reply message to {client_id} fail: code {resp.code} {resp.remark or ''}".rstrip()
        return True, ""

    def _store(self, conn: Connection, cmd: RemotingCommand, props: dict[str, str], body: bytes,
               queue_id: int) -> tuple[str, int] | None:
        b = self.broker
        stored_props = dict(props)
        stored_props.pop(Prop.WAIT, None)
        req = PutRequest(
            topic=cmd.get_str("topic") or "",
            queue_id=queue_id,
            body=body,
            properties=stored_props,
            flag=cmd.get_int("flag", 0, bits=32),
            sys_flag=cmd.get_int("sysFlag", 0, bits=32),
            born_timestamp=cmd.get_int("bornTimestamp", 0),
            born_host=peer_host(conn),
            store_host=b.store_host,
            reconsume_times=cmd.get_int("reconsumeTimes", 0, bits=32),
        )
        result = b.store.put(req)
        if result.status is not PutStatus.PUT_OK:
            log.warning("storing a reply in %s failed: %s %s", req.topic, result.status.name, result.remark)
            return None
        b.metrics.on_put(req.topic, result.count, len(body))
        return result.msg_ids[0] if result.msg_ids else "0", result.queue_offset
