"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320).

One send path for all three: V2's one-letter header names are mapped to the long ones first. A
batch is also recognised on code 10 with ``batch`` "1"/"true" (the RocketMQ C++ client 1.2.3 sends
batches that way and zlib-compresses a whole batch of 4 KiB or more: such a body is inflated and
split, so consumers get the individual messages). Nothing is stored unless the whole request is
valid. Every response carries msgId/queueId/queueOffset as strings, whatever its code.

Hot path (guarded by bench/produce_consume.py): no JSON, one properties parse per message.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING

from tidemq.broker.delay import TIMER_TOPIC, has_timer, strip_delay
from tidemq.broker.processors.common import refused
from tidemq.broker.processors.retry import find_group, max_reconsume_times
from tidemq.broker.store.store import PutRequest, PutResult, PutStatus
from tidemq.broker.transaction.half import is_transactional
from tidemq.broker.topics import (
    DLQ_PREFIX,
    NOT_ALLOWED_SEND,
    RETRY_PREFIX,
    Perm,
    TopicConfig,
    group_of,
    loggable,
    validate_topic_name,
)
from tidemq.errors import BrokerError, CodecError
from tidemq.message import Prop, SysFlag, count_batch, decode_batch, decode_properties, inflate
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.command import field_int

if TYPE_CHECKING:
    from tidemq.broker.broker import Broker

log = logging.getLogger(__name__)

V2_NAMES = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
    "n": "bname",
}

_PUT_CODES = {
    PutStatus.PUT_OK: ResponseCode.SUCCESS,
    PutStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
}


_WRITE = int(Perm.WRITE)
_VALID_TOPICS_MAX = 10_000
_COMPRESSED = int(SysFlag.COMPRESSED)


def long_names(fields: dict[str, str]) -> dict[str, str]:
    """A V2 send header with its one-letter names replaced by the long ones. Where a header has
    both (``b`` and ``topic``), the one-letter value wins, as everywhere else a V2 header is read
    (the ACL included): a second name can never point a check and a write at different topics."""
    out = dict(fields)
    for short, long in V2_NAMES.items():
        if short in fields:
            out[long] = out.pop(short)
    return out


# Header names by long name, for SEND_MESSAGE (long) and V2/batch (one letter): the hot path
# reads the fields it needs under either name instead of renaming the whole header.
_LONG = {v: v for v in V2_NAMES.values()}
_SHORT = {v: k for k, v in V2_NAMES.items()}
_INT32 = 1 << 31
_INT64 = 1 << 63


def send_fields(msg_id: str, queue_id: int, queue_offset: int, region: str) -> dict[str, str]:
    """The header of every answer to a send (and to a reply send)."""
    return {
        "msgId": msg_id,
        "queueId": str(queue_id),
        "queueOffset": str(queue_offset),
        "MSG_REGION": region,
        "TRACE_ON": "true",
    }


def _namesrv_arg(addrs: tuple[str, ...]) -> str:
    """The ``-n`` argument of a `tidemq admin` hint: this broker's name servers, quoted when a list
    (a shell ends an unquoted command at the ``;``)."""
    joined = ";".join(addrs) or "NAMESRV_ADDR"
    return f'"{joined}"' if ";" in joined else joined


def _error(cmd: RemotingCommand, code: int, remark: str) -> RemotingCommand:
    return cmd.response(code, remark, send_fields("", 0, 0, "DefaultRegion"))


class SendProcessor:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        self.messages_in = 0
        self.bytes_in = 0
        self.errors = 0
        self._valid_topics: set[str] = set()
        self._big_batches = asyncio.Lock()  # one batch of more than BATCH_SLICE messages at a time

    def handlers(self) -> dict[int, object]:
        return {
            RequestCode.SEND_MESSAGE: self.send,
            RequestCode.SEND_MESSAGE_V2: self.send,
            RequestCode.SEND_BATCH_MESSAGE: self.send,
        }

    def send(self, conn: Connection, cmd: RemotingCommand):
        try:
            return self._send(conn, cmd)
        except BrokerError as exc:
            self.errors += 1
            log.debug("send from %s refused (%s): %s", conn.peer, exc.code, exc.remark)
            return _error(cmd, exc.code or ResponseCode.SYSTEM_ERROR, exc.remark)
        except ValueError as exc:
            self.errors += 1
            return _error(cmd, ResponseCode.SYSTEM_ERROR, f"bad send request header: {exc}")
        except CodecError as exc:
            self.errors += 1
            return _error(cmd, ResponseCode.MESSAGE_ILLEGAL, f"bad message body: {exc}")

    def _send(self, conn: Connection, cmd: RemotingCommand):
        f = cmd.ext_fields
        names = _LONG if cmd.code == RequestCode.SEND_MESSAGE else _SHORT
        b = self.broker
        cfg = b.config
        topic = f.get(names["topic"]) or ""
        if not cfg.broker_permission & _WRITE:
            raise refused(ResponseCode.NO_PERMISSION, f"the broker[{cfg.broker_name}] sending message is forbidden")
        if topic not in self._valid_topics:  # hot path: validate each name once (bounded cache)
            problem = validate_topic_name(topic)
            if problem:
                raise refused(ResponseCode.SYSTEM_ERROR, f"{problem}; fix the topic name")
            if len(self._valid_topics) >= _VALID_TOPICS_MAX:
                self._valid_topics.clear()
            self._valid_topics.add(topic)
        if topic in NOT_ALLOWED_SEND or topic == TIMER_TOPIC:
            raise refused(ResponseCode.NO_PERMISSION, f"sending message to topic[{topic}] is forbidden")
        tc = self._topic_config(conn, cmd, topic)
        if not tc.writable:
            raise refused(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        queue_id = field_int(f.get(names["queueId"]), "queueId", -1, _INT32)
        if queue_id >= tc.queue_nums:
            raise refused(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, topic {topic} has {tc.queue_nums} queues",
            )
        if queue_id < 0:
            queue_id = random.randrange(tc.write_queue_nums or 1)
        sys_flag = field_int(f.get(names["sysFlag"]), "sysFlag", 0, _INT32)
        born_ts = field_int(f.get(names["bornTimestamp"]), "bornTimestamp", 0, _INT64)
        flag = field_int(f.get(names["flag"]), "flag", 0, _INT32)
        reconsume = field_int(f.get(names["reconsumeTimes"]), "reconsumeTimes", 0, _INT32)
        header_props = decode_properties(f.get(names["properties"]) or "")
        transactional = is_transactional(sys_flag, header_props)  # half message (transaction/)
        header_props[Prop.CLUSTER] = cfg.cluster_name
        host = peer_host(conn)
        body = cmd.body_bytes()
        batch = f.get(names["batch"])
        is_batch = cmd.code == RequestCode.SEND_BATCH_MESSAGE or (
            batch is not None and batch.lower() in ("true", "1"))

        if topic.startswith(RETRY_PREFIX):
            if names is _SHORT:
                cmd.ext_fields = long_names(f)  # the retry rules read the long names
            topic, tc, queue_id = self._maybe_dlq(conn, cmd, topic, tc, queue_id, reconsume, header_props)

        if not is_batch:
            if len(body) > cfg.store.max_message_size:
                raise refused(
                    ResponseCode.MESSAGE_ILLEGAL,
                    f"message body is {len(body)} bytes, larger than the broker's maximum "
                    f"{cfg.store.max_message_size}",
                )
            if not body:
                raise refused(ResponseCode.MESSAGE_ILLEGAL, "message body is empty")
            wait = header_props.pop(Prop.WAIT, "true").lower() != "false"
            req = PutRequest(
                topic=topic,
                queue_id=queue_id,
                body=body,
                properties=header_props,
                flag=flag,
                sys_flag=sys_flag,
                born_timestamp=born_ts,
                born_host=host,
                store_host=b.store_host,
                reconsume_times=reconsume,
            )
            if transactional:
                return self._respond(cmd, b.transactions.prepare(req), queue_id, wait, len(body), topic)
            req = b.schedule.prepare_put(req)  # DELAY / delivery time -> schedule or timer topic
            result = b.store.put(req)
            return self._respond(cmd, result, queue_id, wait, len(body), topic)

        if transactional:
            raise refused(ResponseCode.MESSAGE_ILLEGAL, "a batch cannot hold transactional messages")
        compressed = bool(sys_flag & _COMPRESSED)
        put = _BatchPut(topic, queue_id, header_props, sys_flag & ~_COMPRESSED, born_ts, host, b.store_host,
                        reconsume, cfg.store.max_message_size)
        if compressed or (len(body) > _SLICE_BYTES and count_batch(body, BATCH_SLICE) > BATCH_SLICE):
            # A big batch (or one whose size is unknown until inflated) is decoded and prepared
            # off this loop turn, in slices: frames read together must not stall it together.
            return self._send_big_batch(cmd, put, body, compressed)
        items = decode_batch(body)
        put.add(items)
        return self._respond(cmd, b.store.put_batch(put.reqs), queue_id, put.wait, put.size, topic)

    async def _send_big_batch(self, cmd: RemotingCommand, put: "_BatchPut", body: bytes,
                              compressed: bool) -> RemotingCommand:
        """A compressed batch or one of more than BATCH_SLICE messages: inflated, decoded, checked
        and prepared for the store one step per loop turn, one such batch at a time (others wait
        without using the loop), then appended whole. Other requests are served between steps."""
        store = self.broker.store
        pending: list = []
        total = 0
        async with self._big_batches:
            try:
                await asyncio.sleep(0)
                if compressed:
                    body = inflate(body, self.broker.config.store.max_message_size * 4)
                    await asyncio.sleep(0)
                items = decode_batch(body)
                for i in range(0, len(items), BATCH_SLICE):
                    if i:
                        await asyncio.sleep(0)
                    start = len(put.reqs)
                    put.add(items[i:i + BATCH_SLICE])
                    prepared = store.prepare_batch(put.reqs[start:])
                    if isinstance(prepared, PutResult):
                        return self._respond(cmd, prepared, put.queue_id, put.wait, put.size, put.topic)
                    pending += prepared[0]
                    total += prepared[1]
            except BrokerError as exc:
                self.errors += 1
                return _error(cmd, exc.code or ResponseCode.SYSTEM_ERROR, exc.remark)
            except CodecError as exc:
                self.errors += 1
                return _error(cmd, ResponseCode.MESSAGE_ILLEGAL, f"bad message body: {exc}")
            result = store.put_prepared(pending, total)  # one append: all of the batch or nothing
        answer = self._respond(cmd, result, put.queue_id, put.wait, put.size, put.topic)
        return await answer if isinstance(answer, asyncio.Future) else answer

    def _topic_config(self, conn: Connection, cmd: RemotingCommand, topic: str) -> TopicConfig:
        b = self.broker
        tc = b.topics.get(topic)
        if tc is not None:
            return tc
        if cmd.code != RequestCode.SEND_MESSAGE and "defaultTopic" not in cmd.ext_fields:
            cmd.ext_fields = long_names(cmd.ext_fields)  # rare path: read the long names below
        principal = b.principal(conn, cmd)
        group = group_of(topic)
        if group is not None:  # %RETRY%<group> of a group that exists (or may be made); %DLQ%<group> of one that exists
            if topic.startswith(RETRY_PREFIX):
                find_group(b, group, principal)
            elif b.groups.get(group) is None:
                raise refused(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                              f"subscription group [{loggable(group)}] of {loggable(topic)} does not exist")
            tc = b.creation.retry_topic(topic, principal)
        elif b.config.auto_create_topic:
            default = cmd.get_str("defaultTopic") or ""
            tc = b.creation.topic_from_default(topic, default, cmd.get_int("defaultTopicQueueNums", 4), principal)
        if tc is None:
            raise refused(
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{topic}] not exist, apply first please! (create it with `tidemq admin updateTopic "
                f"-n {_namesrv_arg(b.config.namesrv_addrs)} -c {b.config.cluster_name} -t {topic}`)",
            )
        return tc

    def _maybe_dlq(self, conn, cmd, topic, tc, queue_id, reconsume, props):
        # Same rule as CONSUMER_SEND_MSG_BACK (processors/retry.py).
        group = topic[len(RETRY_PREFIX):]
        b = self.broker
        principal = b.principal(conn, cmd)
        g = find_group(b, group, principal)
        if reconsume < max_reconsume_times(g, cmd):
            return topic, tc, queue_id
        dlq = DLQ_PREFIX + group
        dtc = b.creation.retry_topic(dlq, principal)
        strip_delay(props)
        return dlq, dtc, 0

    def _respond(self, cmd: RemotingCommand, result: PutResult, queue_id: int, wait: bool, size: int,
                 topic: str):
        code = _PUT_CODES.get(result.status, ResponseCode.SYSTEM_ERROR)
        if code not in (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT):
            self.errors += 1
            return _error(cmd, code, result.remark or f"store refused the message: {result.status.name}")
        self.messages_in += result.count
        self.bytes_in += size
        self.broker.metrics.on_put(topic, result.count, size)
        fields = send_fields(",".join(result.msg_ids), queue_id, result.queue_offset, self.broker.config.region)
        if not self.broker.sync_flush:
            return cmd.response(code, None, fields)
        if not wait:
            return cmd.response(code, None, fields)
        durable = self.broker.store.durable(result.end_offset)
        if durable is None:
            return cmd.response(code, None, fields)
        # A future, not a coroutine (no task per send): answered when the group commit covers it.
        answer: asyncio.Future[RemotingCommand] = durable.get_loop().create_future()
        durable.add_done_callback(lambda f: _answer_durable(answer, f, cmd, result.end_offset, fields))
        return answer


def _answer_durable(answer: asyncio.Future, durable: asyncio.Future, cmd: RemotingCommand, end_offset: int,
                    fields: dict) -> None:
    if answer.done():  # the connection went away (its pending answers are cancelled)
        return
    if not durable.cancelled() and durable.result():
        answer.set_result(cmd.response(ResponseCode.SUCCESS, None, fields))
        return
    log.warning("SYNC_FLUSH did not complete within the flush timeout (offset %d)", end_offset)
    answer.set_result(cmd.response(ResponseCode.FLUSH_DISK_TIMEOUT,
                                   "flush to disk timed out; the message is stored", fields))


BATCH_SLICE = 2048  # messages of a batch prepared between two yields to the event loop
_SLICE_BYTES = BATCH_SLICE * 22  # a body this short cannot hold more than BATCH_SLICE messages


class _BatchPut:
    """The store requests of one batch, built slice by slice; nothing is stored unless every
    message is valid."""

    __slots__ = ("topic", "queue_id", "header_items", "sys_flag", "born_ts", "host", "store_host", "reconsume",
                 "max_size", "reqs", "wait", "size")

    def __init__(self, topic: str, queue_id: int, header_props: dict[str, str], sys_flag: int, born_ts: int,
                 host: tuple[str, int], store_host: tuple[str, int], reconsume: int, max_size: int) -> None:
        self.topic, self.queue_id, self.sys_flag, self.born_ts = topic, queue_id, sys_flag, born_ts
        self.header_items = list(header_props.items())
        self.host, self.store_host, self.reconsume, self.max_size = host, store_host, reconsume, max_size
        self.reqs: list[PutRequest] = []
        self.wait = True
        self.size = 0

    # Hot path (bench/produce_consume.py batch): one tight loop, lookups hoisted.
    def add(self, items: list) -> None:
        max_size = self.max_size
        header_items = self.header_items
        topic, queue_id, sys_flag, born_ts = self.topic, self.queue_id, self.sys_flag, self.born_ts
        host, store_host, reconsume = self.host, self.store_host, self.reconsume
        append = self.reqs.append
        size = 0
        for item in items:
            item_body = item.body
            if len(item_body) > max_size:
                raise refused(ResponseCode.MESSAGE_ILLEGAL, f"a message of the batch is {len(item_body)} bytes, "
                              f"larger than the broker's maximum {max_size}; nothing of the batch was stored")
            props = decode_properties(item.properties)
            if Prop.DELAY in props or has_timer(props):
                raise refused(ResponseCode.MESSAGE_ILLEGAL, "batch messages may not use a delay level or delivery time")
            for k, v in header_items:
                if k not in props:
                    props[k] = v
            if props.pop(Prop.WAIT, "true").lower() == "false":
                self.wait = False
            size += len(item_body)
            append(PutRequest(topic, queue_id, item_body, props, item.flag, sys_flag, born_ts, host,
                              store_host, reconsume))
        self.size += size


def peer_host(conn: Connection) -> tuple[str, int]:
    """(host, port) of the peer of ``conn``."""
    host, _, port = conn.peer.rpartition(":")
    try:
        return host, int(port)
    except ValueError:
        return "127.0.0.1", 0
