"""Request-reply over messages (RocketMQ 4.6+): the requester's side and the replier's helper.

A request is a normal message carrying ``CORRELATION_ID`` (unique), ``REPLY_TO_CLIENT`` (the
requester's client id) and ``TTL`` (ms); the broker stores it and adds ``CLUSTER``. A replier
builds the answer with :func:`create_reply_message` (topic ``<CLUSTER>_REPLY_TOPIC``,
``MSG_TYPE=reply``, the same correlation properties) and sends it with a Producer, which uses
SEND_REPLY_MESSAGE_V2 for it. The broker pushes the reply to the requester's connection as
PUSH_REPLY_MESSAGE_TO_CLIENT, whose header carries the message fields (RocketMQ's
ReplyMessageRequestHeader) and whose body is the reply body.

:class:`ReplyRouter` is the requester's table, one per :class:`ClientInstance` (replies are
addressed to a client id, which producers of one instance share): correlation id -> waiting
future. Invariants: at most ``max_pending`` entries; an entry lives from just before its request
is sent until its reply, timeout, failure or cancellation, whichever comes first (the waiter
removes it in a ``finally``), and entries past their deadline are swept before the table is
declared full. Every push is answered SUCCESS, matched or not (as Java's ClientRemotingProcessor
does); only an undecodable push is answered SYSTEM_ERROR.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from tidemq.client.instance import ClientInstance
from tidemq.errors import ClientError, CodecError, RequestTimeoutError
from tidemq.message import Message, MessageExt, Prop, SysFlag, body_crc, decode_properties, inflate
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode

log = logging.getLogger(__name__)

REPLY_TOPIC_SUFFIX = "_REPLY_TOPIC"
REPLY_MESSAGE_FLAG = "reply"
MAX_PENDING_REQUESTS = 65_536


def reply_topic(cluster: str) -> str:
    return cluster + REPLY_TOPIC_SUFFIX


def new_correlation_id() -> str:
    return str(uuid.uuid4())


def is_reply(msg: Message) -> bool:
    return msg.properties.get(Prop.MSG_TYPE) == REPLY_MESSAGE_FLAG


def request_properties(client_id: str, ttl_ms: int, correlation_id: str | None = None) -> dict[str, str]:
    """The properties that make a message a request."""
    return {
        Prop.CORRELATION_ID: correlation_id or new_correlation_id(),
        Prop.REPLY_TO_CLIENT: client_id,
        Prop.TTL: str(ttl_ms),
    }


def create_reply_message(request: MessageExt | Message, body: bytes) -> Message:
    """The reply to ``request`` (a received request message) carrying ``body``.

    Raises ClientError when ``request`` is not a request (no CORRELATION_ID / REPLY_TO_CLIENT) or
    did not come from a broker (no CLUSTER property).
    """
    props = request.properties
    cluster = props.get(Prop.CLUSTER)
    if not cluster:
        raise ClientError(
            "cannot create a reply: the request message has no CLUSTER property (pass the "
            "message as received from the broker, not the one you sent)"
        )
    correlation_id = props.get(Prop.CORRELATION_ID)
    reply_to = props.get(Prop.REPLY_TO_CLIENT)
    if not correlation_id or not reply_to:
        raise ClientError(
            f"cannot create a reply: message {getattr(request, 'msg_id', '')} is not a request "
            "(it lacks CORRELATION_ID or REPLY_TO_CLIENT; send requests with Producer.request)"
        )
    reply_props = {
        Prop.MSG_TYPE: REPLY_MESSAGE_FLAG,
        Prop.CORRELATION_ID: correlation_id,
        Prop.REPLY_TO_CLIENT: reply_to,
    }
    ttl = props.get(Prop.TTL)
    if ttl:
        reply_props[Prop.TTL] = ttl
    return Message(reply_topic(cluster), bytes(body), properties=reply_props)


def _int_field(cmd: RemotingCommand, name: str, default: int | None = None, bits: int = 64) -> int:
    try:
        return cmd.get_int(name, default, bits)
    except ValueError as exc:
        raise CodecError(f"reply push: {exc}") from None


def decode_reply(cmd: RemotingCommand, arrive_ms: int) -> MessageExt:
    """The reply message of a PUSH_REPLY_MESSAGE_TO_CLIENT: header fields + body (inflated if
    compressed), with ``ARRIVE_TIME`` added. Raises CodecError when malformed."""
    topic = cmd.get_str("topic")
    if not topic:
        raise CodecError("reply push without topic")
    sys_flag = _int_field(cmd, "sysFlag", 0, 32)
    body = cmd.body_bytes()
    if sys_flag & SysFlag.COMPRESSED:  # the flag stays as sent (RocketMQ's decoder keeps it too)
        body = inflate(body)  # bounded; CodecError when not zlib
    props = decode_properties(cmd.get_str("properties") or "")
    props[Prop.ARRIVE_TIME] = str(arrive_ms)
    return MessageExt(
        topic=topic,
        body=body,
        queue_id=_int_field(cmd, "queueId", 0, 32),
        queue_offset=0,
        commit_log_offset=0,
        store_size=0,
        flag=_int_field(cmd, "flag", 0, 32),
        sys_flag=sys_flag,
        born_timestamp=_int_field(cmd, "bornTimestamp", 0),
        born_host=cmd.get_str("bornHost") or "",
        store_timestamp=_int_field(cmd, "storeTimestamp", 0),
        store_host=cmd.get_str("storeHost") or "",
        reconsume_times=_int_field(cmd, "reconsumeTimes", 0, 32),
        prepared_transaction_offset=0,
        properties=props,
        body_crc=body_crc(body),
        offset_msg_id="",
    )


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[MessageExt]
    topic: str
    deadline: float  # loop time


class ReplyRouter:
    """Correlation id -> waiting request, for one client instance."""

    def __init__(self, max_pending: int = MAX_PENDING_REQUESTS,
                 clock: Callable[[], float] = time.time) -> None:
        self.max_pending = max_pending
        self.clock = clock
        self._waiting: dict[str, _Waiter] = {}
        self.unmatched = 0

    def __len__(self) -> int:
        return len(self._waiting)

    def register(self, correlation_id: str, topic: str, timeout: float) -> asyncio.Future[MessageExt]:
        loop = asyncio.get_running_loop()
        if correlation_id in self._waiting:
            raise ClientError(f"a request with correlation id {correlation_id} is already waiting")
        if len(self._waiting) >= self.max_pending:
            self._sweep(loop.time())
            if len(self._waiting) >= self.max_pending:
                raise ClientError(
                    f"{len(self._waiting)} requests are waiting for replies (the limit); wait for "
                    "some to finish before sending more"
                )
        fut: asyncio.Future[MessageExt] = loop.create_future()
        self._waiting[correlation_id] = _Waiter(fut, topic, loop.time() + timeout)
        return fut

    def discard(self, correlation_id: str) -> None:
        self._waiting.pop(correlation_id, None)

    def fail(self, correlation_id: str, exc: BaseException) -> None:
        waiter = self._waiting.pop(correlation_id, None)
        if waiter is not None and not waiter.future.done():
            waiter.future.set_exception(exc)

    def _sweep(self, now: float) -> None:
        for cid in [c for c, w in self._waiting.items() if w.deadline <= now or w.future.done()]:
            waiter = self._waiting.pop(cid)
            if not waiter.future.done():
                waiter.future.set_exception(RequestTimeoutError(
                    f"request to topic {waiter.topic} got no reply before its deadline "
                    f"(correlation id {cid})"))
                waiter.future.exception()  # retrieved here: its waiter may be gone

    def complete(self, reply: MessageExt) -> bool:
        """Hand ``reply`` to its waiter; False if nobody waits for it (late or foreign)."""
        cid = reply.properties.get(Prop.CORRELATION_ID, "")
        waiter = self._waiting.pop(cid, None)
        if waiter is None or waiter.future.done():
            self.unmatched += 1
            log.warning("reply %s from %s matches no waiting request (timed out or unknown)",
                        cid or "<no CORRELATION_ID>", reply.born_host or "?")
            return False
        waiter.future.set_result(reply)
        return True

    # ClientInstance request handler for PUSH_REPLY_MESSAGE_TO_CLIENT
    def handle(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        try:
            reply = decode_reply(cmd, int(self.clock() * 1000))
        except CodecError as exc:
            log.warning("undecodable reply push from %s: %s", conn.peer, exc)
            return cmd.response(ResponseCode.SYSTEM_ERROR, "process reply message fail")
        self.complete(reply)
        return cmd.response(ResponseCode.SUCCESS)


_routers: "weakref.WeakKeyDictionary[ClientInstance, ReplyRouter]" = weakref.WeakKeyDictionary()


def reply_router(inst: ClientInstance) -> ReplyRouter:
    """The instance's router, created and registered for PUSH_REPLY_MESSAGE_TO_CLIENT on first use."""
    router = _routers.get(inst)
    if router is None:
        router = ReplyRouter(clock=inst.clock)
        inst.register_request_handler(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, router.handle)
        _routers[inst] = router
    return router


def timeout_error(topic: str, timeout: float, correlation_id: str) -> RequestTimeoutError:
    return RequestTimeoutError(
        f"request to topic {topic} got no reply within {timeout:g} s (correlation id "
        f"{correlation_id}); check that a consumer of {topic} answers with "
        "create_reply_message + Producer.send, or raise the timeout"
    )
