"""Fuzz targets (research matrix row H1): one function per codec, ``check(data: bytes) -> None``.

Each target feeds arbitrary bytes to a decoder and lets only that codec's own error escape
(FrameError for remoting, CodecError for messages); anything else — another exception type, a
failed invariant (AssertionError), a hang or runaway memory — is a finding. Invariants checked:
valid input round-trips through the encoder; frames fed in two pieces decode exactly as fed at
once; the frame decoder never holds more than the bytes it was given.
Used by tests/fuzz/run.py (atheris, N minutes per target) and tests/fuzz/test_fuzz.py (corpus
replay and a short run in the default suite).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

from tidemq.errors import CodecError, FrameError
from tidemq.message import (
    decode_batch,
    decode_offset_msg_id,
    decode_properties,
    decode_record,
    decode_records,
    encode_batch,
    encode_record,
    encode_offset_msg_id,
    encode_properties,
    inflate,
    pack_host,
)
from tidemq.broker.clients import SubscriptionParseError, parse_tag_expression
from tidemq.client.route import TopicRouteData
from tidemq.namesrv.bodies import parse_register_body
from tidemq.remoting import RemotingCommand, RequestCode, fastjson
from tidemq.remoting.frame import (
    decode_json_header,
    decode_rocketmq_header,
    encode_frame,
    encode_json_header,
    encode_rocketmq_header,
    iter_frames,
)

MAX_FRAME = 1 << 16  # small, so the fuzzer reaches the limit checks


def _key(cmd) -> tuple:
    return (cmd.code, cmd.opaque, cmd.flag, cmd.language, cmd.version, cmd.remark, cmd.ext_fields,
            bytes(cmd.body or b""), cmd.serialize_type)


def _decode_all(pieces: list[bytes]) -> tuple[list[tuple], str | None, int]:
    """Feed ``pieces`` to a connection-like buffer; return frames, the error (if any), bytes left."""
    buf = bytearray()
    out: list[tuple] = []
    for piece in pieces:
        buf += piece
        try:
            for cmd in iter_frames(buf, MAX_FRAME):
                out.append(_key(cmd))
        except FrameError as exc:
            return out, type(exc).__name__, len(buf)
        assert len(buf) <= sum(len(p) for p in pieces)
    return out, None, len(buf)


def check_frame(data: bytes) -> None:
    """Split-fed decoding equals one-shot decoding (the split point comes from the first byte)."""
    if not data:
        return
    split = data[0] * len(data) // 256
    body = data[1:]
    whole = _decode_all([body])
    halves = _decode_all([body[:split], body[split:]])
    assert whole[0] == halves[0], "split-fed frames differ from one-shot frames"
    assert (whole[1] is None) == (halves[1] is None), "only one way of feeding failed"
    if whole[1] is None:
        assert whole[2] == halves[2]
    for key in whole[0]:  # every decoded frame re-encodes to something that decodes the same
        cmd = RemotingCommand(*key[:6], dict(key[6]), key[7], key[8])
        again = _decode_all([encode_frame(cmd)])
        assert again[1] is None and again[0] == [_key(cmd)], "frame does not round-trip"


def check_json_header(data: bytes) -> None:
    try:
        cmd = decode_json_header(data)
    except FrameError:
        return
    if not (-(1 << 31) <= cmd.code < (1 << 31) and -(1 << 31) <= cmd.opaque < (1 << 31)):
        return  # Java ints: out-of-range values are refused by the encoder of the other side
    back = decode_json_header(encode_json_header(cmd))
    assert (back.code, back.opaque, back.flag, back.ext_fields) == (cmd.code, cmd.opaque, cmd.flag, cmd.ext_fields)


def check_rocketmq_header(data: bytes) -> None:
    try:
        cmd = decode_rocketmq_header(data)
    except FrameError:
        return
    back = decode_rocketmq_header(encode_rocketmq_header(cmd))
    assert _key(back) == _key(cmd), "binary header does not round-trip"


def check_fastjson(data: bytes) -> None:
    try:
        value = fastjson.loads(data)
    except FrameError:
        return
    try:
        again = fastjson.loads(fastjson.dumps(value))
    except (TypeError, ValueError):  # orjson refuses some values it parsed (e.g. huge ints): fine
        return
    assert type(again) is type(value)


def check_properties(data: bytes) -> None:
    try:
        props = decode_properties(data)
    except CodecError:
        return
    assert decode_properties(encode_properties(props)) == props, "properties do not round-trip"


def check_batch(data: bytes) -> None:
    try:
        items = decode_batch(data)
    except CodecError:
        return
    again = decode_batch(encode_batch([(i.flag, i.body, i.properties) for i in items]))
    assert [(i.flag, i.body, i.properties) for i in again] == [(i.flag, i.body, i.properties) for i in items]


def check_record(data: bytes) -> None:
    """The fast multi-record decoder and the reference single-record decoder agree."""
    try:
        fast = decode_records(data, decompress=True)
    except CodecError:
        fast = None
    pos, ref = 0, []
    try:
        while pos < len(data):
            m = decode_record(data, pos)
            ref.append(m)
            pos += m.store_size
    except CodecError:
        ref = None
    if fast is None or ref is None:
        return  # (fast may also refuse a bomb or bad zlib the reference decoder does not inflate)
    assert [(m.topic, m.queue_id, m.queue_offset, m.commit_log_offset) for m in fast] == \
        [(m.topic, m.queue_id, m.queue_offset, m.commit_log_offset) for m in ref]


def check_msg_id(data: bytes) -> None:
    text = data.decode("latin-1")
    try:
        addr, offset = decode_offset_msg_id(text)
    except CodecError:
        return
    host, _, port = addr.rpartition(":")
    host_bytes, _v6 = pack_host(host.strip("[]"), int(port))
    assert decode_offset_msg_id(encode_offset_msg_id(host_bytes[: 16 if _v6 else 4], int(port), offset)) == \
        (addr, offset)


def check_route(data: bytes) -> None:
    try:
        TopicRouteData.from_json(data)
    except CodecError:
        return


def check_register_body(data: bytes) -> None:
    for compressed in (False, True):
        try:
            parse_register_body(data, compressed)
        except CodecError:
            pass


def check_tag_expression(data: bytes) -> None:
    try:
        parse_tag_expression(data.decode("utf-8", "replace"))
    except SubscriptionParseError:
        return


def check_inflate(data: bytes) -> None:
    limit = 1 << 20
    try:
        out = inflate(data, limit)
    except CodecError:
        return
    assert len(out) <= limit, "inflate produced more than its limit"


TARGETS: dict[str, Callable[[bytes], None]] = {
    "frame": check_frame,
    "json_header": check_json_header,
    "rocketmq_header": check_rocketmq_header,
    "fastjson": check_fastjson,
    "properties": check_properties,
    "batch": check_batch,
    "record": check_record,
    "msg_id": check_msg_id,
    "route": check_route,
    "register_body": check_register_body,
    "tag_expression": check_tag_expression,
    "inflate": check_inflate,
}


def seeds() -> dict[str, list[bytes]]:
    """Valid inputs per target, made with our encoders (written to tests/fuzz/corpus/ by run.py)."""
    send = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": "T", "c": "TBW102", "d": 4,
                                   "e": 0, "f": 0, "g": 1700000000000, "h": 0,
                                   "i": "UNIQ_KEY\x01ABC\x02WAIT\x01true\x02TAGS\x01t", "j": 0},
                                   b"hello")
    pull = RemotingCommand.request(RequestCode.PULL_MESSAGE, {"consumerGroup": "g", "topic": "T", "queueId": 0,
                                   "queueOffset": 0, "maxMsgNums": 32, "sysFlag": 6})
    binary = RemotingCommand.request(RequestCode.HEART_BEAT, {"k": "v"}, b"{}")
    binary.serialize_type = 1
    frames = [encode_frame(send), encode_frame(pull), encode_frame(binary)]
    record = encode_record(topic=b"T", body=b"body", properties=b"TAGS\x01t\x02KEYS\x01k", queue_id=1, flag=0,
                           queue_offset=7, physical_offset=1024, sys_flag=0, born_timestamp=1, born_host=b"\x7f\0\0\1",
                           born_port=5, store_timestamp=2, store_host=b"\x7f\0\0\1", store_port=10911)
    return {
        "frame": [b"\x80" + frames[0] + frames[1], b"\x10" + frames[2], b"\x00" + struct.pack(">i", -1)],
        "json_header": [encode_json_header(send), encode_json_header(pull)],
        "rocketmq_header": [encode_rocketmq_header(binary)],
        "fastjson": [b'{0:"10.0.0.5:10911",1:"x"}', b'{{"brokerName":"b","queueId":0,"topic":"T"}:{"a":1}}',
                     b'{"offsetTable":{"T@g":{0:5}}}'],
        "properties": [b"UNIQ_KEY\x01ABC\x02WAIT\x01true", b"a\x01b\x02c\x01d\x02"],
        "batch": [encode_batch([(0, b"a", "k\x01v"), (1, b"bb", "")])],
        "record": [record, record + record],
        "msg_id": [encode_offset_msg_id(b"\x7f\0\0\1", 10911, 12345).encode(),
                   encode_offset_msg_id(b"\0" * 15 + b"\1", 10911, 1).encode()],
        "route": [b'{"orderTopicConf":null,"queueDatas":[{"brokerName":"broker-a","readQueueNums":4,'
                  b'"writeQueueNums":4,"perm":6,"topicSysFlag":0}],"brokerDatas":[{"cluster":"DefaultCluster",'
                  b'"brokerName":"broker-a","brokerAddrs":{0:"127.0.0.1:10911"}}]}'],
        "register_body": [b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"topicName":"T",'
                          b'"readQueueNums":4,"writeQueueNums":4,"perm":6}},"dataVersion":{"timestamp":1,'
                          b'"counter":2}},"filterServerList":[]}'],
        "tag_expression": [b"*", b"a || b || c", b"TagA||TagB"],
        "inflate": [zlib.compress(b"hello" * 100), zlib.compress(b"\0" * 100_000, 9)],
    }
