"""The compiled frame codecs (tidemq/remoting/_frame_c.pyx) against their Python twins (frame.py).

Differential: for any input, both give equal commands and equal bytes, or raise the same error type
with the same message, and leave a frame buffer with the same bytes. Inputs: hypothesis-made commands,
headers and frames, the same mutated (truncated, bytes flipped, lengths rewritten), random bytes,
and the fuzz corpora of tests/fuzz (frame, json_header, rocketmq_header).
"""

from __future__ import annotations

import struct
from pathlib import Path

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tidemq import compiled
from tidemq.remoting import frame
from tidemq.remoting.codes import LanguageCode, SerializeType
from tidemq.remoting.command import RemotingCommand

_c = compiled.load("tidemq.remoting._frame_c")
pytestmark = pytest.mark.skipif(
    _c is None, reason="the compiled frame codecs are not loaded (TIDEMQ_NO_EXTENSIONS=1 or not built)")

CORPUS = Path(__file__).resolve().parent.parent / "fuzz" / "corpus"


def _key(cmd: RemotingCommand) -> tuple:
    return (cmd.code, type(cmd.code), cmd.opaque, cmd.flag, cmd.language, type(cmd.language), cmd.version,
            cmd.remark, cmd.ext_fields, cmd.body, cmd.serialize_type, type(cmd.serialize_type))


def _outcome(fn, *args) -> tuple:
    """(True, value) or (False, error type, message) of one call."""
    try:
        value = fn(*args)
    except Exception as exc:  # noqa: BLE001 (any error must be the twin's error)
        return (False, type(exc), str(exc))
    if isinstance(value, RemotingCommand):
        return (True, _key(value))
    return (True, value)


def _same(fn_c, fn_py, *args) -> tuple:
    got, want = _outcome(fn_c, *args), _outcome(fn_py, *args)
    assert got == want
    return want


def _split(data: bytes, max_frame: int) -> tuple:
    """Frames, error and the buffer left, as a connection's read sees them."""
    out = []
    for fn in (_c.iter_frames, frame.iter_frames_py):
        buf = bytearray(data)
        cmds = []
        err = None
        try:
            for cmd in fn(buf, max_frame):
                cmds.append(_key(cmd))
        except Exception as exc:  # noqa: BLE001
            err = (type(exc), str(exc))
        out.append((cmds, err, bytes(buf)))
    assert out[0] == out[1]
    return out[1]


texts = st.text(max_size=12) | st.sampled_from(["", "\x00", '"\\', "\ud800", "é\u2028", "\x7f\x1f\x0b"])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3), max_leaves=6)
numbers = st.integers(-(2**31), 2**31 - 1) | st.integers(-(2**65), 2**65) | st.sampled_from([True, False])


@st.composite
def commands(draw, binary: bool | None = None) -> RemotingCommand:
    stype = (draw(st.sampled_from([SerializeType.JSON, SerializeType.ROCKETMQ])) if binary is None
             else (SerializeType.ROCKETMQ if binary else SerializeType.JSON))
    small = st.integers(-(2**15), 2**15 - 1)
    return RemotingCommand(
        code=draw(small), opaque=draw(st.integers(-(2**31), 2**31 - 1)), flag=draw(st.integers(0, 3)),
        language=draw(st.sampled_from(list(LanguageCode)) | st.integers(0, 255)), version=draw(small),
        remark=draw(st.none() | texts), ext_fields=draw(st.dictionaries(texts, texts, max_size=6)),
        body=draw(st.none() | st.binary(max_size=64) | st.lists(st.binary(max_size=16), max_size=3)),
        serialize_type=stype)


@st.composite
def odd_commands(draw) -> RemotingCommand:
    """Commands no codec of ours builds: odd number types, non-str fields, enums, huge ints."""
    cmd = draw(commands(binary=False))
    cmd.code = draw(numbers)
    cmd.opaque = draw(numbers)
    cmd.version = draw(numbers | st.sampled_from([SerializeType.ROCKETMQ]))
    cmd.ext_fields = draw(st.dictionaries(texts | st.integers(0, 9), texts | st.integers() | st.none(), max_size=3))
    cmd.remark = draw(st.none() | texts | st.integers())
    return cmd


def _strip_surrogates(cmd: RemotingCommand) -> bool:
    """Whether every text of ``cmd`` encodes as UTF-8 (the encoders refuse lone surrogates)."""
    texts = [cmd.remark or "", *cmd.ext_fields, *cmd.ext_fields.values()]
    return all(not isinstance(t, str) or "\ud800" not in t for t in texts)


@settings(max_examples=300)
@given(commands())
def test_encoding_gives_the_same_bytes(cmd):
    _same(_c.encode_frame_parts, frame.encode_frame_parts_py, cmd)
    _same(_c.encode_frame, frame.encode_frame_py, cmd)
    if cmd.serialize_type == SerializeType.JSON:
        _same(_c.encode_json_header, frame.encode_json_header_py, cmd)


@settings(max_examples=200)
@given(odd_commands())
def test_encoding_odd_commands_gives_the_same_bytes_or_error(cmd):
    _same(_c.encode_frame_parts, frame.encode_frame_parts_py, cmd)
    _same(_c.encode_json_header, frame.encode_json_header_py, cmd)


@settings(max_examples=300)
@given(st.lists(commands(), min_size=1, max_size=4), st.integers(0, 2**31 + 5), st.data())
def test_frames_split_the_same_whole_cut_and_mutated(cmds, max_frame, data):
    wire = b"".join(frame.encode_frame_py(c) for c in cmds if _strip_surrogates(c))
    _split(wire, frame.DEFAULT_MAX_FRAME)
    _split(wire, max_frame)
    _split(wire[: data.draw(st.integers(0, len(wire)))], frame.DEFAULT_MAX_FRAME)
    if wire:
        mutated = bytearray(wire)
        for _ in range(data.draw(st.integers(1, 4))):
            at = data.draw(st.integers(0, len(mutated) - 1))
            mutated[at] = data.draw(st.integers(0, 255))
        _split(bytes(mutated), 1 << 16)
        _same(_c.decode_frame, frame.decode_frame_py, bytes(mutated), 1 << 16)


@settings(max_examples=300)
@given(st.binary(max_size=80), st.sampled_from([0, 4, 8, 64, 1 << 16, frame.DEFAULT_MAX_FRAME, 2**40, -5]))
@example(b"\x00\x00\x00\x04\x00\x00\x00\x00", 8)
@example(b"\xff\xff\xff\xff", 8)
@example(b"\x00\x00\x00\x08\x01\x00\x00\x04abcd", 64)
@example(b"\x00\x00\x00\x08\x02\x00\x00\x00abcd", 64)
def test_random_bytes_split_and_decode_the_same(data, max_frame):
    _split(data, max_frame)
    _same(_c.decode_frame, frame.decode_frame_py, data, max_frame)


@settings(max_examples=400)
@given(st.dictionaries(st.sampled_from(["code", "opaque", "flag", "version", "language", "remark", "extFields",
                                        "serializeTypeCurrentRPC"]), json_values, max_size=8),
       st.dictionaries(texts, json_values, max_size=4))
@example({"code": "12", "language": "CPP", "extFields": {"a": 1, "b": True, "c": None}}, {})
@example({"code": 2**40, "opaque": "2147483648", "language": 7}, {})
@example({"code": 1, "language": None, "remark": 3.5}, {})
def test_json_headers_decode_the_same(obj, ext):
    if "extFields" not in obj and ext:
        obj["extFields"] = ext
    try:
        data = orjson.dumps(obj)
    except orjson.JSONEncodeError:
        return
    _same(_c.decode_json_header, frame.decode_json_header_py, data)
    _same(_c.decode_header, frame.decode_header_py, 0, data)
    _same(_c.decode_json_header, frame.decode_json_header_py, bytearray(data))


@settings(max_examples=300)
@given(st.binary(max_size=60))
@example(b"[]")
@example(b'{"extFields": 3}')
@example(b"\xff")
def test_random_json_header_bytes_decode_the_same(data):
    _same(_c.decode_json_header, frame.decode_json_header_py, data)


@settings(max_examples=300)
@given(commands(binary=True), st.data())
def test_binary_headers_decode_the_same_whole_cut_and_mutated(cmd, data):
    if not _strip_surrogates(cmd):
        return
    header = frame.encode_rocketmq_header(cmd)
    _same(_c.decode_rocketmq_header, frame.decode_rocketmq_header_py, header)
    _same(_c.decode_header, frame.decode_header_py, 1, header)
    _same(_c.decode_rocketmq_header, frame.decode_rocketmq_header_py, header[: data.draw(st.integers(0, len(header)))])
    mutated = bytearray(header)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(mutated) - 1))
        mutated[at] = data.draw(st.integers(0, 255))
    _same(_c.decode_rocketmq_header, frame.decode_rocketmq_header_py, bytes(mutated))
    _same(_c.decode_rocketmq_header, frame.decode_rocketmq_header_py, memoryview(bytes(mutated)))


@settings(max_examples=300)
@given(st.binary(max_size=60), st.integers(-1, 3))
def test_random_binary_header_bytes_and_types_decode_the_same(data, stype):
    _same(_c.decode_rocketmq_header, frame.decode_rocketmq_header_py, data)
    _same(_c.decode_header, frame.decode_header_py, stype, data)


def test_fuzz_corpora_decode_the_same():
    seen = 0
    for name in ("frame", "json_header", "rocketmq_header"):
        for path in sorted((CORPUS / name).iterdir()):
            data = path.read_bytes()
            seen += 1
            if name == "frame":  # the fuzz target drops its first byte (the split point)
                _split(data[1:], 1 << 16)
                _same(_c.decode_frame, frame.decode_frame_py, data[1:])
            elif name == "json_header":
                _same(_c.decode_json_header, frame.decode_json_header_py, data)
            else:
                _same(_c.decode_rocketmq_header, frame.decode_rocketmq_header_py, data)
    assert seen >= 5


def test_the_frame_module_runs_the_compiled_codecs():
    assert frame.iter_frames is _c.iter_frames and frame.encode_frame_parts is _c.encode_frame_parts
    assert frame.decode_frame is _c.decode_frame and frame.encode_json_header is _c.encode_json_header


def test_a_buffer_shrunk_while_iterating_stops_the_split():
    one = frame.encode_frame_py(RemotingCommand(code=1, body=b"x" * 100))
    buf = bytearray(one * 3)
    frames = _c.iter_frames(buf)
    next(frames)
    del buf[len(one):]  # a consumer that misbehaves must not make the split read freed memory
    assert list(frames) == []
    assert buf == bytearray()


def test_prefix_lengths_are_exact():
    cmd = RemotingCommand(code=310, opaque=7, ext_fields={"b": "T"}, body=[b"ab", memoryview(b"cde")])
    head, *pieces = _c.encode_frame_parts(cmd)
    length, type_and_len = struct.unpack(">iI", head[:8])
    assert length == len(head) - 4 + 5 and type_and_len == len(head) - 8 and pieces == [b"ab", memoryview(b"cde")]
