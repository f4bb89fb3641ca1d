"""Request-reply: a replier's reply is pushed to the requester, then stored.

The reply is checked like a send (write permission, topic name, topic exists and is writable,
queue id in range, body size), then handed to the requester found by its ``REPLY_TO_CLIENT``
client id through a :class:`ReplyChannel` (the wire front-end's push, which must be answered
within ``reply_push_timeout``); the pushed properties gain ``PUSH_REPLY_TIME``. Then, with
``store_reply_message`` (default on, as RocketMQ's storeReplyMessageEnable), the reply is also
stored in its topic. The result is SUCCESS when the push succeeded, else SYSTEM_ERROR with a
remark naming the client id (not connected, or the push failed), as in RocketMQ's
ReplyMessageProcessor.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tidemq.broker.messaging.context import Caller, refused
from tidemq.broker.store.results import PutRequest, PutStatus
from tidemq.broker.topics import NOT_ALLOWED_SEND, validate_topic_name
from tidemq.message import Prop, decode_properties
from tidemq.remoting.codes import Perm, ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.store.store import MessageStore
    from tidemq.broker.topics import TopicConfigManager

log = logging.getLogger(__name__)

_WRITE = int(Perm.WRITE)


@dataclass(frozen=True, slots=True)
class ReplyRequest:
    caller: Caller
    born_host: tuple[str, int]
    topic: str
    queue_id: int  # -1: the broker picks a writable queue
    body: bytes
    properties: str  # encoded
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    reconsume_times: int = 0
    # Repeated to the requester only (RocketMQ's ReplyMessageRequestHeader):
    producer_group: str = ""
    default_topic: str = ""
    default_topic_queue_nums: int = 4
    unit_mode: bool = False


@dataclass(frozen=True, slots=True)
class PushedReply:
    """What the requester receives: the reply, its properties with PUSH_REPLY_TIME, and where and
    when the broker took it."""

    request: ReplyRequest
    properties: dict[str, str]
    store_host: str  # the broker's advertised "host:port"
    store_timestamp: int  # ms


class ReplyChannel(Protocol):
    """The wire front-end's way to the requester: None once it took the reply, else why not."""

    async def push(self, client_id: str, reply: PushedReply, timeout: float) -> str | None: ...


@dataclass(frozen=True, slots=True)
class ReplyResult:
    code: int  # SUCCESS: pushed; SYSTEM_ERROR: not pushed (``remark`` says why)
    msg_id: str  # of the stored copy, "0" when not stored
    queue_id: int
    queue_offset: int
    remark: str | None = None


class ReplyService:
    def __init__(self, *, settings: Callable[[], "BrokerConfig"], store: "MessageStore",
                 topics: "TopicConfigManager", channel: ReplyChannel, store_host: tuple[str, int],
                 clock: Callable[[], float], on_put: Callable[[str, int, int], None]) -> None:
        self._settings = settings
        self._store = store
        self._topics = topics
        self._channel = channel
        self._store_host = store_host
        self._clock = clock
        self._on_put = on_put

    async def reply(self, req: ReplyRequest) -> ReplyResult:
        cfg = self._settings()
        queue_id = self._check(req, cfg)
        props = decode_properties(req.properties)
        remark = await self._push(req, props, cfg)
        msg_id, queue_offset = "0", 0
        if cfg.store_reply_message:
            stored = self._store_reply(req, props, queue_id)
            if stored is not None:
                msg_id, queue_offset = stored
        code = ResponseCode.SUCCESS if remark is None else ResponseCode.SYSTEM_ERROR
        return ReplyResult(code, msg_id, queue_id, queue_offset, remark)

    def _check(self, req: ReplyRequest, cfg: "BrokerConfig") -> int:
        """The queue the reply goes to; raises the refusal of a reply that cannot be taken."""
        topic = req.topic
        if not cfg.broker_permission & _WRITE:
            raise refused(ResponseCode.NO_PERMISSION, f"the broker[{cfg.broker_name}] sending message is forbidden")
        problem = validate_topic_name(topic)
        if problem:
            raise refused(ResponseCode.SYSTEM_ERROR, f"{problem}; fix the topic name")
        if topic in NOT_ALLOWED_SEND:
            raise refused(ResponseCode.NO_PERMISSION, f"sending message to topic[{topic}] is forbidden")
        tc = self._topics.get(topic)
        if tc is None:
            raise refused(ResponseCode.TOPIC_NOT_EXIST,
                          f"topic[{topic}] not exist, apply first please! (replies go to "
                          f"{cfg.cluster_name}_REPLY_TOPIC)")
        if not tc.writable:
            raise refused(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        queue_id = req.queue_id
        if queue_id >= tc.queue_nums:
            raise refused(ResponseCode.SYSTEM_ERROR,
                          f"request queueId[{queue_id}] is illegal, topic {topic} has {tc.queue_nums} queues")
        if queue_id < 0:
            queue_id = random.randrange(tc.write_queue_nums or 1)
        size = len(req.body)
        max_size = cfg.store.max_message_size
        if not size or size > max_size:
            raise refused(ResponseCode.MESSAGE_ILLEGAL, f"reply body is {size} bytes; it must be 1..{max_size}")
        return queue_id

    async def _push(self, req: ReplyRequest, props: dict[str, str], cfg: "BrokerConfig") -> str | None:
        """None once the requester took the reply, else why it did not."""
        client_id = props.get(Prop.REPLY_TO_CLIENT)
        if not client_id:
            return f"reply message properties[{Prop.REPLY_TO_CLIENT}] is null"
        now_ms = int(self._clock() * 1000)
        pushed = dict(props)
        pushed[Prop.PUSH_REPLY_TIME] = str(now_ms)
        return await self._channel.push(client_id, PushedReply(req, pushed, cfg.advertise_addr, now_ms),
                                        cfg.reply_push_timeout)

    def _store_reply(self, req: ReplyRequest, props: dict[str, str], queue_id: int) -> tuple[str, int] | None:
        stored_props = dict(props)
        stored_props.pop(Prop.WAIT, None)
        put = PutRequest(req.topic, queue_id, req.body, stored_props, req.flag, req.sys_flag, req.born_timestamp,
                         req.born_host, self._store_host, req.reconsume_times)
        result = self._store.put(put)
        if result.status is not PutStatus.PUT_OK:
            log.warning("storing a reply in %s failed: %s %s", put.topic, result.status.name, result.remark)
            return None
        self._on_put(put.topic, result.count, len(req.body))
        return result.msg_ids[0] if result.msg_ids else "0", result.queue_offset
