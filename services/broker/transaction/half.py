"""Pure conversions between a transactional send, its half message, the committed message, op
records and the record a check-back shows the producer (PROTOCOL-REFERENCE 6.9). No I/O, no clock.

Invariants:
- A half message lives in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 with transaction type NOT (so the
  store dispatches it to the half topic's own consume queue and to no real topic) and carries
  ``REAL_TOPIC``, ``REAL_QID`` and the producer group in ``PGROUP``.
- The checker re-appends copies of a half message; every copy carries
  ``TRAN_PREPARED_QUEUE_OFFSET`` = the half-queue offset of the first half (its *root*). A
  transaction is identified by its root everywhere: op records, bookkeeping, de-duplication.
- An op record (``RMQ_SYS_TRANS_OP_HALF_TOPIC``, the half's queue, tag ``d``) marks a root
  resolved; its body is the root's half-queue offset in decimal ASCII.
- A committed message has the real topic and queue, transaction type COMMIT,
  ``preparedTransactionOffset`` = the commit-log offset of the half record it came from, and the
  half's body, flag, born time/host, UNIQ_KEY, keys and tags; the broker-internal properties are
  removed.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from tidemq.broker.store.results import PutRequest, put_again
from tidemq.errors import CodecError
from tidemq.message import (
    TRANSACTION_MASK,
    MessageExt,
    Prop,
    SysFlag,
    encode_properties,
    encode_record,
    pack_host,
    split_host,
)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
HALF_QUEUE_ID = 0
OP_TAG = "d"
PROP_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROP_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROP_ROOT_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROP_NOT_BEFORE = "TRAN_CHECK_NOT_BEFORE"  # broker ms: end of CHECK_IMMUNITY_TIME_IN_SECONDS
MAX_OP_BODY = 20  # digits of a Java long

# Properties of a half message that must not reach the committed message.
_INTERNAL = (Prop.REAL_TOPIC, Prop.REAL_QID, Prop.TRAN_MSG, PROP_CHECK_TIMES, PROP_ROOT_OFFSET,
             PROP_NOT_BEFORE)


class EndType(enum.IntEnum):
    """END_TRANSACTION ``commitOrRollback``: the sysFlag transaction values."""

    NOT = 0
    COMMIT = int(SysFlag.TRANSACTION_COMMIT)
    ROLLBACK = int(SysFlag.TRANSACTION_ROLLBACK)


@dataclass(frozen=True, slots=True)
class HalfInfo:
    """What the checker needs to know about one half record (a root or a copy)."""

    queue_offset: int
    commit_log_offset: int
    root: int
    check_times: int
    not_before_ms: int | None  # end of CHECK_IMMUNITY_TIME_IN_SECONDS, only before the first check
    store_timestamp: int
    born_timestamp: int
    group: str
    real_topic: str
    real_queue_id: int


def is_transactional(sys_flag: int, properties: dict[str, str]) -> bool:
    """A send that asks for the half-message path (property TRAN_MSG=true, or sysFlag PREPARED)."""
    # hot path (bench/produce_consume.py): plain ints, IntFlag arithmetic is slow
    if sys_flag & _PREPARED:
        return True
    tran = properties.get(Prop.TRAN_MSG)
    return tran is not None and tran.lower() == "true"


_PREPARED = int(SysFlag.TRANSACTION_PREPARED)


def _int_prop(props: dict[str, str], name: str, default: int | None) -> int | None:
    v = props.get(name)
    if v is None:
        return default
    try:
        return int(v)
    except ValueError:
        return default


def half_info(msg: MessageExt) -> HalfInfo:
    """Read the checker's view of a half record; CodecError when it is not a usable half."""
    props = msg.properties
    real_topic = props.get(Prop.REAL_TOPIC)
    real_qid = _int_prop(props, Prop.REAL_QID, None)
    if not real_topic or real_qid is None:
        raise CodecError(f"half message at commit-log offset {msg.commit_log_offset} has no "
                         "REAL_TOPIC/REAL_QID")
    check_times = max(0, _int_prop(props, PROP_CHECK_TIMES, 0) or 0)
    immunity = _int_prop(props, PROP_IMMUNITY, None) if check_times == 0 else None
    not_before = None
    if immunity is not None and immunity >= 0:  # measured on the broker's clock from the first store
        not_before = _int_prop(props, PROP_NOT_BEFORE, msg.store_timestamp + immunity * 1000)
    return HalfInfo(
        queue_offset=msg.queue_offset,
        commit_log_offset=msg.commit_log_offset,
        root=_int_prop(props, PROP_ROOT_OFFSET, msg.queue_offset) or 0,
        check_times=check_times,
        not_before_ms=not_before,
        store_timestamp=msg.store_timestamp,
        born_timestamp=msg.born_timestamp,
        group=props.get(Prop.PGROUP, ""),
        real_topic=real_topic,
        real_queue_id=real_qid,
    )


def root_of(msg: MessageExt) -> int:
    return _int_prop(msg.properties, PROP_ROOT_OFFSET, msg.queue_offset) or 0


def to_half(req: PutRequest) -> PutRequest:
    """The half message for a transactional send (real topic and queue kept in properties).

    A delay level is dropped, as the Java client does before sending a transactional message:
    a half message is never scheduled, and the committed message is delivered at once."""
    props = dict(req.properties)
    props[Prop.REAL_TOPIC] = req.topic
    props[Prop.REAL_QID] = str(req.queue_id)
    props.pop(Prop.DELAY, None)
    return dataclasses.replace(
        req,
        topic=HALF_TOPIC,
        queue_id=HALF_QUEUE_ID,
        properties=props,
        sys_flag=req.sys_flag & ~TRANSACTION_MASK,
        tags_code=None,
    )


def to_real(half: MessageExt, store_host: tuple[str, int]) -> PutRequest:
    """The committed message for a half record."""
    props = {k: v for k, v in half.properties.items() if k not in _INTERNAL}
    real_qid = _int_prop(half.properties, Prop.REAL_QID, 0) or 0
    return put_again(half, half.properties.get(Prop.REAL_TOPIC, ""), real_qid, props, store_host,
                     sys_flag=(half.sys_flag & ~TRANSACTION_MASK) | EndType.COMMIT,
                     prepared_transaction_offset=half.commit_log_offset)


def to_copy(half: MessageExt, store_host: tuple[str, int], check_times: int,
            not_before_ms: int | None = None) -> PutRequest:
    """A copy of a half record to re-append at the end of the half queue (same root)."""
    props = dict(half.properties)
    props[PROP_ROOT_OFFSET] = str(root_of(half))
    props[PROP_CHECK_TIMES] = str(check_times)
    if not_before_ms is not None:
        props[PROP_NOT_BEFORE] = str(not_before_ms)
    return put_again(half, HALF_TOPIC, HALF_QUEUE_ID, props, store_host,
                     sys_flag=half.sys_flag & ~TRANSACTION_MASK)


def to_discarded(half: MessageExt, store_host: tuple[str, int]) -> PutRequest:
    """A half message given up on, kept in TRANS_CHECK_MAX_TIME_TOPIC for operators."""
    return put_again(half, CHECK_MAX_TOPIC, 0, dict(half.properties), store_host,
                     sys_flag=half.sys_flag & ~TRANSACTION_MASK)


def op_request(root: int, queue_id: int, store_host: tuple[str, int], now_ms: int) -> PutRequest:
    return PutRequest(
        topic=OP_TOPIC,
        queue_id=queue_id,
        body=str(root).encode("ascii"),
        properties={Prop.TAGS: OP_TAG},
        born_timestamp=now_ms,
        born_host=store_host,
        store_host=store_host,
    )


def parse_op_body(body: bytes) -> int | None:
    """The root offset an op record marks resolved, or None for a body that is not one."""
    if not body or len(body) > MAX_OP_BODY:
        return None
    try:
        value = int(body.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if value >= 0 else None


def check_record(half: MessageExt) -> bytes:
    """The stored record a check-back carries for a half record: its real topic and queue
    restored, so the producer sees the message it sent."""
    props = half.properties
    born_host, born_port = split_host(half.born_host)
    store_host, store_port = split_host(half.store_host)
    return encode_record(
        topic=props.get(Prop.REAL_TOPIC, half.topic).encode("utf-8"),
        body=half.body,
        properties=encode_properties(props).encode("utf-8"),
        queue_id=_int_prop(props, Prop.REAL_QID, half.queue_id) or 0,
        flag=half.flag,
        queue_offset=half.queue_offset,
        physical_offset=half.commit_log_offset,
        sys_flag=half.sys_flag,
        born_timestamp=half.born_timestamp,
        born_host=pack_host(born_host, born_port)[0],
        born_port=born_port,
        store_timestamp=half.store_timestamp,
        store_host=pack_host(store_host, store_port)[0],
        store_port=store_port,
        reconsume_times=half.reconsume_times,
        prepared_transaction_offset=half.prepared_transaction_offset,
        crc=half.body_crc,
    )
