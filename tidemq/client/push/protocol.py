"""The push/lite-pull consumers' wire side: offset requests, consumer lists, queue locks and the
consume-failure send-back, plus the message rewrites around retry topics.

Pure functions, no I/O. Field names and rules follow PROTOCOL-REFERENCE 2.3 and 6.3-6.7:
QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15), GET_MAX_OFFSET (30), GET_MIN_OFFSET (31),
SEARCH_OFFSET_BY_TIMESTAMP (29), GET_CONSUMER_LIST_BY_GROUP (38), LOCK_BATCH_MQ (41),
UNLOCK_BATCH_MQ (42), CONSUMER_SEND_MSG_BACK (36).
"""

from __future__ import annotations

import orjson

from tidemq.client.route import MessageQueue
from tidemq.client.send import PROPERTY_RECONSUME_TIME
from tidemq.client.validation import RETRY_GROUP_TOPIC_PREFIX
from tidemq.errors import CodecError, FrameError
from tidemq.message import Message, MessageExt, Prop
from tidemq.remoting import RemotingCommand, RequestCode, fastjson

CONSUME_START_TIME = "CONSUME_START_TIME"
TRANSACTION_PREPARED = "TRAN_MSG"
MAX_LOCK_REPLY_QUEUES = 100_000


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def build_query_offset(group: str, mq: MessageQueue) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.QUERY_CONSUMER_OFFSET,
        {"consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id},
    )


def build_update_offset(group: str, mq: MessageQueue, offset: int,
                        oneway: bool = False) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": group, "topic": mq.topic, "queueId": mq.queue_id,
         "commitOffset": offset},
        oneway=oneway,
    )


def build_offset_request(code: RequestCode, mq: MessageQueue, **extra: object) -> RemotingCommand:
    """GET_MAX_OFFSET / GET_MIN_OFFSET / SEARCH_OFFSET_BY_TIMESTAMP (``timestamp=``)."""
    return RemotingCommand.request(code, {"topic": mq.topic, "queueId": mq.queue_id, **extra})


def build_consumer_list(group: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})


def parse_consumer_list(body: bytes) -> list[str]:
    """The sorted ``consumerIdList`` of a GET_CONSUMER_LIST_BY_GROUP answer."""
    obj = _json(body, "consumer list")
    ids = obj.get("consumerIdList") if isinstance(obj, dict) else None
    if not isinstance(ids, list):
        raise CodecError("consumer list body has no consumerIdList array")
    return sorted({str(i) for i in ids if i})


def _mq_set_body(group: str, client_id: str, mqs: list[MessageQueue]) -> bytes:
    return orjson.dumps({"consumerGroup": group, "clientId": client_id,
                         "mqSet": [mq.as_json() for mq in sorted(mqs)]})


def build_lock_batch(group: str, client_id: str, mqs: list[MessageQueue]) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, None,
                                   _mq_set_body(group, client_id, mqs))


def parse_lock_result(body: bytes) -> set[MessageQueue]:
    obj = _json(body, "lock answer")
    raw = obj.get("lockOKMQSet") if isinstance(obj, dict) else None
    if raw is None:
        return set()
    if not isinstance(raw, list) or len(raw) > MAX_LOCK_REPLY_QUEUES:
        raise CodecError("lock answer lockOKMQSet is not a list of queues")
    return {MessageQueue.from_json(item) for item in raw}


def build_unlock_batch(group: str, client_id: str, mqs: list[MessageQueue],
                       oneway: bool = False) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.UNLOCK_BATCH_MQ, None,
                                   _mq_set_body(group, client_id, mqs), oneway=oneway)


def origin_msg_id(msg: MessageExt) -> str:
    """The id of the first incarnation of a (possibly re-delivered) message."""
    return msg.properties.get(Prop.ORIGIN_MESSAGE_ID) or msg.msg_id


def build_send_back(msg: MessageExt, group: str, delay_level: int,
                    max_reconsume_times: int) -> RemotingCommand:
    """CONSUMER_SEND_MSG_BACK for a message the listener failed on. ``delay_level`` 0 lets the
    broker pick ``3 + reconsumeTimes``; -1 sends the message straight to the group's DLQ."""
    return RemotingCommand.request(
        RequestCode.CONSUMER_SEND_MSG_BACK,
        {
            "offset": msg.commit_log_offset,
            "group": group,
            "delayLevel": delay_level,
            "originMsgId": msg.msg_id,
            "originTopic": msg.topic,
            "unitMode": False,
            "maxReconsumeTimes": max_reconsume_times,
        },
    )


def build_retry_message(msg: MessageExt, group: str, max_reconsume_times: int) -> Message:
    """The fallback when a send-back fails: the message itself, re-sent to ``%RETRY%<group>`` with
    the retry bookkeeping a broker would have added (RETRY_TOPIC, reconsume count + 1, origin id,
    delay level ``3 + reconsumeTimes``). The broker moves it to the DLQ once the count reaches
    the maximum."""
    props = dict(msg.properties)
    for k in (Prop.MIN_OFFSET, Prop.MAX_OFFSET, CONSUME_START_TIME, TRANSACTION_PREPARED):
        props.pop(k, None)
    props.setdefault(Prop.RETRY_TOPIC, msg.topic)
    props[Prop.ORIGIN_MESSAGE_ID] = origin_msg_id(msg)
    props[PROPERTY_RECONSUME_TIME] = str(msg.reconsume_times + 1)
    props[Prop.MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    props[Prop.DELAY] = str(3 + msg.reconsume_times)
    return Message(retry_topic(group), msg.body, properties=props, flag=msg.flag)


def reset_retry_topic(msgs: list[MessageExt], group: str) -> None:
    """Messages pulled from ``%RETRY%<group>`` carry their real topic in RETRY_TOPIC: restore it
    before the listener sees them (RocketMQ's resetRetryAndNamespace)."""
    rt = retry_topic(group)
    for m in msgs:
        real = m.properties.get(Prop.RETRY_TOPIC)
        if real and m.topic == rt:
            m.topic = real


def _json(body: bytes, what: str) -> object:
    try:
        return fastjson.loads(body or b"{}")
    except (FrameError, TypeError, ValueError) as exc:
        raise CodecError(f"{what} body is not valid JSON: {exc}") from None
