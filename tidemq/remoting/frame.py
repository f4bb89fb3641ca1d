"""Frame and header codecs of RocketMQ remoting: pure functions, no I/O.

A frame is ``int32 length | int32 (serializeType << 24 | headerLength) | header | body``, big-endian,
where ``length`` counts everything after itself. Headers are JSON (type 0) or the binary
"ROCKETMQ" form (type 1). Every length read from the wire is checked against a limit before any
buffer is made; anything malformed raises :class:`tidemq.errors.FrameError` and nothing else.

The functions here (``*_py``) are the reference; the public names are bound at the end of the
module to their compiled twins (tidemq/remoting/_frame_c.pyx) when those are built, else to these.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import orjson

from tidemq import compiled
from tidemq.errors import FrameError
from tidemq.remoting.codes import LanguageCode, SerializeType
from tidemq.remoting.command import RemotingCommand

DEFAULT_MAX_FRAME = 16 * 1024 * 1024
_INT = struct.Struct(">i")
_PREFIX = struct.Struct(">iI")
_BIN_FIXED = struct.Struct(">hBhii")
_LANG_BY_NAME = {c.name: c for c in LanguageCode}
# Plain-int / str tables: enum construction per header is measurable on the hot path.
_LANG_INT_BY_NAME = {c.name: int(c) for c in LanguageCode}
_LANG_NAME_BY_INT = {int(c): c.name for c in LanguageCode}
_JSON = SerializeType.JSON


def coerce_ext_fields(raw: object) -> dict[str, str]:
    """Turn a decoded extFields object into str -> str (cpp sends numbers, bools as "1"/"0")."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise FrameError("extFields is not a JSON object")
    for v in raw.values():  # hot path (bench/produce_consume.py): Java/Python clients send strings
        if v.__class__ is not str:
            break
    else:
        return raw
    out: dict[str, str] = {}
    for k, v in raw.items():
        if v is None:
            continue
        if isinstance(v, str):
            out[k] = v
        elif isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif isinstance(v, (int, float)):
            out[k] = str(v)
        else:
            out[k] = orjson.dumps(v).decode()
    return out


def lenient_int(value: object, default: int, *, bools: bool) -> int:
    """A JSON integer that may come as a number or a decimal string: None -> ``default``, an
    int or decimal str -> its value, a bool -> 0/1 when ``bools`` allows it. Raises ValueError
    for anything else (callers word the error)."""
    if value is None:
        return default
    if isinstance(value, bool):
        if bools:
            return int(value)
        raise ValueError(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return int(value)
    raise ValueError(value)


def _as_int(value: object, name: str, default: int = 0) -> int:
    if value.__class__ is int:  # hot path: the usual case
        return value
    try:
        n = lenient_int(value, default, bools=True)
    except ValueError:
        raise FrameError(f"header field {name!r} is not an integer") from None
    if not -0x80000000 <= n <= 0x7FFFFFFF:  # a decimal string can hold any size (found by fuzzing)
        raise FrameError(f"header field {name!r} is outside Java's int range")
    return n


def decode_json_header_py(data: bytes | memoryview) -> RemotingCommand:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise FrameError(f"header is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError("header is not a JSON object")
    get = obj.get
    lang = get("language", "JAVA")
    if isinstance(lang, int):
        language = lang
    else:
        language = _LANG_INT_BY_NAME.get(lang) if lang.__class__ is str else None  # type: ignore[assignment]
        if language is None:
            code = _LANG_BY_NAME.get(str(lang))
            language = int(code) if code is not None else int(LanguageCode.OTHER)
    remark = get("remark")
    # positional (code, opaque, flag, language, version, remark, ext_fields, body, serialize_type):
    # hot path, every frame
    return RemotingCommand(
        _as_int(get("code"), "code"),
        _as_int(get("opaque"), "opaque"),
        _as_int(get("flag"), "flag"),
        language,
        _as_int(get("version"), "version"),
        remark if isinstance(remark, str) else (None if remark is None else str(remark)),
        coerce_ext_fields(get("extFields")),
        None,
        _JSON,
    )


def encode_json_header_py(cmd: RemotingCommand) -> bytes:
    lang = _LANG_NAME_BY_INT.get(cmd.language, "OTHER")
    obj: dict[str, object] = {
        "code": cmd.code,
        "extFields": cmd.ext_fields,
        "flag": cmd.flag,
        "language": lang,
        "opaque": cmd.opaque,
        "serializeTypeCurrentRPC": "JSON",
        "version": cmd.version,
    }
    if cmd.remark:
        obj["remark"] = cmd.remark
    return orjson.dumps(obj)


def _read_str(data: memoryview, pos: int, length: int, what: str) -> tuple[str, int]:
    end = pos + length
    if length < 0 or end > len(data):
        raise FrameError(f"binary header: {what} length {length} exceeds the header")
    try:
        return bytes(data[pos:end]).decode("utf-8"), end
    except UnicodeDecodeError:
        raise FrameError(f"binary header: {what} is not UTF-8") from None


def decode_rocketmq_header_py(data: bytes | memoryview) -> RemotingCommand:
    mv = memoryview(data)
    if len(mv) < _BIN_FIXED.size + 8:
        raise FrameError("binary header shorter than its fixed part")
    code, language, version, opaque, flag = _BIN_FIXED.unpack_from(mv, 0)
    pos = _BIN_FIXED.size
    (remark_len,) = _INT.unpack_from(mv, pos)
    pos += 4
    remark, pos = _read_str(mv, pos, remark_len, "remark")
    if pos + 4 > len(mv):
        raise FrameError("binary header: missing extFields length")
    (ext_len,) = _INT.unpack_from(mv, pos)
    pos += 4
    end = pos + ext_len
    if ext_len < 0 or end > len(mv):
        raise FrameError(f"binary header: extFields length {ext_len} exceeds the header")
    fields: dict[str, str] = {}
    while pos < end:
        if pos + 2 > end:
            raise FrameError("binary header: truncated extFields key length")
        (klen,) = struct.unpack_from(">h", mv, pos)
        key, pos = _read_str(mv, pos + 2, klen, "extFields key")
        if pos + 4 > end:
            raise FrameError("binary header: truncated extFields value length")
        (vlen,) = _INT.unpack_from(mv, pos)
        value, pos = _read_str(mv, pos + 4, vlen, "extFields value")
        if pos > end:
            raise FrameError("binary header: extFields entry exceeds its length")
        fields[key] = value
    return RemotingCommand(
        code=code,
        language=language,
        version=version,
        opaque=opaque,
        flag=flag,
        remark=remark or None,
        ext_fields=fields,
        serialize_type=SerializeType.ROCKETMQ,
    )


def encode_rocketmq_header(cmd: RemotingCommand) -> bytes:
    remark = (cmd.remark or "").encode()
    ext = bytearray()
    for k, v in cmd.ext_fields.items():
        kb, vb = k.encode(), v.encode()
        ext += struct.pack(">h", len(kb)) + kb + _INT.pack(len(vb)) + vb
    return b"".join(
        (
            _BIN_FIXED.pack(cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag),
            _INT.pack(len(remark)),
            remark,
            _INT.pack(len(ext)),
            bytes(ext),
        )
    )


def decode_header_py(serialize_type: int, data: bytes | memoryview) -> RemotingCommand:
    if serialize_type == SerializeType.JSON:
        return decode_json_header_py(data)
    if serialize_type == SerializeType.ROCKETMQ:
        return decode_rocketmq_header_py(data)
    raise FrameError(f"unknown serialize type {serialize_type}")


def encode_frame_parts_py(cmd: RemotingCommand) -> list[bytes | memoryview]:
    """Encode ``cmd`` as frame pieces (prefix + header, then the body pieces), without joining."""
    if cmd.serialize_type == SerializeType.ROCKETMQ:
        header = encode_rocketmq_header(cmd)
    else:
        header = encode_json_header_py(cmd)
    body = cmd.body
    if body is None:
        body_len = 0
        pieces: list[bytes | memoryview] = []
    elif isinstance(body, (list, tuple)):
        pieces = list(body)
        body_len = sum(len(p) for p in pieces)
    else:
        pieces = [body]
        body_len = len(body)
    prefix = _PREFIX.pack(4 + len(header) + body_len, (cmd.serialize_type << 24) | len(header))
    return [prefix + header, *pieces]


def encode_frame_py(cmd: RemotingCommand) -> bytes:
    return b"".join(encode_frame_parts_py(cmd))


def decode_frame_py(frame: bytes | memoryview, max_frame: int = DEFAULT_MAX_FRAME) -> RemotingCommand:
    """Decode one whole frame (including its length word)."""
    mv = memoryview(frame)
    if len(mv) < 8:
        raise FrameError("frame shorter than 8 bytes")
    length, type_and_len = _PREFIX.unpack_from(mv, 0)
    if length < 4 or length > max_frame:
        raise FrameError(f"frame length {length} outside 4..{max_frame}")
    if length + 4 != len(mv):
        raise FrameError(f"frame length {length} does not match the {len(mv) - 4} bytes given")
    return _decode_body(mv[4:], type_and_len)


def _decode_body(mv: memoryview, type_and_len: int) -> RemotingCommand:
    header_len = type_and_len & 0xFFFFFF
    serialize_type = (type_and_len >> 24) & 0xFF
    if header_len + 4 > len(mv):
        raise FrameError(f"header length {header_len} exceeds the frame")
    cmd = decode_header_py(serialize_type, mv[4 : 4 + header_len])
    cmd.body = bytes(mv[4 + header_len :])
    return cmd


def iter_frames_py(
    buffer: bytearray, max_frame: int = DEFAULT_MAX_FRAME
) -> Iterator[RemotingCommand]:
    """Yield every complete frame at the start of ``buffer`` and remove it from the buffer.

    A frame whose announced length is negative, shorter than the prefix or larger than
    ``max_frame`` raises FrameError before anything is allocated for it.
    """
    pos = 0
    n = len(buffer)
    try:
        while n - pos >= 4:
            (length,) = _INT.unpack_from(buffer, pos)
            if length < 4 or length > max_frame:
                raise FrameError(f"frame length {length} outside 4..{max_frame}")
            if n - pos - 4 < length:
                break
            start = pos + 4
            pos = start + length
            (type_and_len,) = struct.unpack_from(">I", buffer, start)
            error = None
            try:
                cmd = _decode_body(memoryview(buffer)[start:pos], type_and_len)
            except FrameError as exc:
                error = str(exc)  # re-raised below, so no traceback pins views of the buffer
            if error is not None:
                raise FrameError(error)
            yield cmd
    finally:
        if pos:
            del buffer[:pos]


# The compiled twins (tidemq/remoting/_frame_c.pyx) when built, else the Python ones above: same
# results and errors (tests/remoting/test_frame_compiled.py). Loaded last: the compiled module
# hands its rare cases back to the functions above.
_c = compiled.load("tidemq.remoting._frame_c")
iter_frames = iter_frames_py if _c is None else _c.iter_frames
decode_frame = decode_frame_py if _c is None else _c.decode_frame
decode_header = decode_header_py if _c is None else _c.decode_header
decode_json_header = decode_json_header_py if _c is None else _c.decode_json_header
decode_rocketmq_header = decode_rocketmq_header_py if _c is None else _c.decode_rocketmq_header
encode_json_header = encode_json_header_py if _c is None else _c.encode_json_header
encode_frame_parts = encode_frame_parts_py if _c is None else _c.encode_frame_parts
encode_frame = encode_frame_py if _c is None else _c.encode_frame
