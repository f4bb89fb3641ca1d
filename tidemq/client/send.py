"""The producer's wire side: SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE requests and their answers.

Pure functions, no I/O. Headers use RocketMQ's V2 one-letter names (``a`` producerGroup, ``b``
topic, ``c`` defaultTopic, ``d`` defaultTopicQueueNums, ``e`` queueId, ``f`` sysFlag, ``g``
bornTimestamp, ``h`` flag, ``i`` properties, ``j`` reconsumeTimes, ``k`` unitMode, ``l``
maxReconsumeTimes, ``m`` batch) and every value is a string. A message is prepared once per send
(UNIQ_KEY, WAIT, compression) so that retries resend exactly the same bytes and id.
"""

from __future__ import annotations

import enum
import zlib
from dataclasses import dataclass

from tidemq.client.response import broker_error
from tidemq.client.route import MessageQueue
from tidemq.client.validation import AUTO_CREATE_TOPIC, RETRY_GROUP_TOPIC_PREFIX, check_properties_size
from tidemq.errors import BrokerError
from tidemq.message import Message, Prop, SysFlag, encode_batch, encode_properties
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.codes import FLAG_ONEWAY
from tidemq.remoting.command import field_int

DEFAULT_TOPIC_QUEUE_NUMS = 4
_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


# Codes that mean "stored" (the last three are non-OK successes clients report, not raise).
SEND_STATUS_BY_CODE = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}

# Codes after which a producer tries another queue (RocketMQ DefaultMQProducer's retry set).
RETRYABLE_SEND_CODES = frozenset(
    {
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.NO_PERMISSION,
    }
)


# Answers of a broker that may no longer be (or no longer fully be) its group's master, after
# which the producer re-reads the topic's route at once to follow a failover (issue 17):
# SLAVE_NOT_AVAILABLE / FLUSH_SLAVE_TIMEOUT (stored by the master, not acknowledged by its
# replicas), SERVICE_NOT_AVAILABLE (what a slave or a stopping broker answers a send) and
# NO_PERMISSION (a broker whose write permission was wiped, as before a switchover).
ROUTE_FAULT_CODES = frozenset(
    {
        ResponseCode.SLAVE_NOT_AVAILABLE,
        ResponseCode.FLUSH_SLAVE_TIMEOUT,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.NO_PERMISSION,
    }
)
# Stored, but not replicated as the group promises: a producer that has retries left sends again
# (to the group's new master when the route changed), as RocketMQ's retryAnotherBrokerWhenNotStoreOK.
NOT_STORE_OK_CODES = frozenset({ResponseCode.SLAVE_NOT_AVAILABLE, ResponseCode.FLUSH_SLAVE_TIMEOUT})


@dataclass(frozen=True, slots=True)
class SendResult:
    """``msg_id`` is the client UNIQ_KEY (comma-joined for a batch); ``offset_msg_id`` the
    broker's offset id(s); ``queue_offset`` the logical offset of the (first) message."""

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    message_queue: MessageQueue
    queue_offset: int


@dataclass(slots=True)
class OutgoingMessage:
    """A message ready for the wire: body possibly compressed, properties encoded.

    Treat it as immutable (retries resend it unchanged). Not ``frozen``: a frozen dataclass's
    constructor costs about twice as much, and one is built per message (hot path:
    bench/produce_consume.py batch)."""

    topic: str
    body: bytes
    sys_flag: int
    flag: int
    properties: str
    uniq_key: str
    reconsume_times: int | None = None
    max_reconsume_times: int | None = None


def prepare_message(
    msg: Message, uniq_key: str, compress_threshold: int | None, compress_level: int = 5,
    props: dict[str, str] | None = None,
) -> OutgoingMessage:
    """Set UNIQ_KEY (unless the caller set one) and WAIT=true (unless set); compress large bodies.

    ``compress_threshold`` None disables compression (batches are never compressed). ``props``:
    ``msg.all_properties()`` when the caller made it already (a fresh dict: it is changed here).
    """
    if props is None:
        props = msg.all_properties()
    uniq = props.setdefault(Prop.UNIQ_KEY, uniq_key)
    props.setdefault(Prop.WAIT, "true")
    reconsume = max_reconsume = None
    if msg.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        # Java moves these two into the header for sends into retry topics.
        rt = props.pop(PROPERTY_RECONSUME_TIME, None)
        mrt = props.pop(Prop.MAX_RECONSUME_TIMES, None)
        reconsume = int(rt) if rt and rt.isdigit() else None
        max_reconsume = int(mrt) if mrt and mrt.isdigit() else None
    encoded = encode_properties(props)
    check_properties_size(encoded)
    body = bytes(msg.body)
    sys_flag = 0
    if compress_threshold is not None and len(body) >= compress_threshold:
        body = zlib.compress(body, compress_level)
        sys_flag |= SysFlag.COMPRESSED
    return OutgoingMessage(msg.topic, body, sys_flag, msg.flag, encoded, uniq, reconsume,
                           max_reconsume)


def send_header(
    group: str,
    topic: str,
    queue_id: int,
    sys_flag: int,
    born_timestamp: int,
    flag: int,
    properties: str,
    *,
    batch: bool = False,
    reconsume_times: int | None = None,
    max_reconsume_times: int | None = None,
) -> dict[str, str]:
    """The SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE header, short names, string values."""
    header = {
        "a": group,
        "b": topic,
        "c": AUTO_CREATE_TOPIC,
        "d": str(DEFAULT_TOPIC_QUEUE_NUMS),
        "e": str(queue_id),
        "f": str(sys_flag),
        "g": str(born_timestamp),
        "h": str(flag),
        "i": properties,
        "j": str(reconsume_times or 0),
        "k": "false",
        "m": "true" if batch else "false",
    }
    if max_reconsume_times is not None:
        header["l"] = str(max_reconsume_times)
    return header


def build_send_request(
    group: str, out: OutgoingMessage, queue_id: int, born_timestamp: int, oneway: bool = False
) -> RemotingCommand:
    header = send_header(
        group, out.topic, queue_id, out.sys_flag, born_timestamp, out.flag, out.properties,
        reconsume_times=out.reconsume_times, max_reconsume_times=out.max_reconsume_times,
    )
    # == RemotingCommand.request(SEND_MESSAGE_V2, header, body, oneway): every header value is a
    # str already, so the copy that request() makes to stringify them is skipped (hot path).
    return RemotingCommand(_SEND_V2, flag=FLAG_ONEWAY if oneway else 0, ext_fields=header,
                           body=out.body)


def build_batch_request(
    group: str, topic: str, items: list[OutgoingMessage], queue_id: int, born_timestamp: int
) -> RemotingCommand:
    """One SEND_BATCH_MESSAGE. The batch-level properties carry only WAIT: a broker appends them
    to every element, so a batch-level UNIQ_KEY would shadow each element's own."""
    body = encode_batch([(o.flag, o.body, o.properties) for o in items])
    header = send_header(
        group, topic, queue_id, 0, born_timestamp, 0,
        encode_properties({Prop.WAIT: "true"}), batch=True,
    )
    return RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, header, body)


def parse_send_response(
    resp: RemotingCommand, topic: str, broker_name: str, msg_id: str, addr: str | None = None,
    sent_to: MessageQueue | None = None,
) -> SendResult:
    """A SendResult for a stored message; BrokerError for every other answer. ``sent_to``: the
    queue the request named, reused as the result's queue when the broker kept it."""
    status = SEND_STATUS_BY_CODE.get(resp.code)  # type: ignore[call-overload]
    if status is None:
        raise broker_error(resp, f"send to topic {topic}", addr)
    # hot path (bench/compare.py row 1): the fields read in place, the error text made on error only
    fields = resp.ext_fields
    try:
        queue_id = field_int(fields.get("queueId"), "queueId")
        queue_offset = field_int(fields.get("queueOffset"), "queueOffset")
    except ValueError as exc:
        raise BrokerError(f"send to topic {topic}: malformed response ({exc})", resp.code) from None
    offset_msg_id = fields.get("msgId")
    if not offset_msg_id:
        raise BrokerError(f"send to topic {topic}: response without msgId", resp.code)
    if (sent_to is None or sent_to.queue_id != queue_id or sent_to.topic != topic
            or sent_to.broker_name != broker_name):
        sent_to = MessageQueue(topic, broker_name, queue_id)
    return SendResult(status, msg_id, offset_msg_id, sent_to, queue_offset)
