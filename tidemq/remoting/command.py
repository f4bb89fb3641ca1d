"""RemotingCommand: one request or response of RocketMQ remoting."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tidemq.remoting.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    SERVER_VERSION,
    LanguageCode,
    ResponseCode,
    SerializeType,
)

# A body is one buffer or pieces written out in order (a pull's records, without joining them).
BodyPiece = bytes | memoryview
Body = BodyPiece | list[bytes] | list[memoryview] | list[BodyPiece] | tuple[BodyPiece, ...] | None


@dataclass(slots=True)
class RemotingCommand:
    """A decoded frame. ``ext_fields`` is always str -> str (the wire's custom header)."""

    code: int
    opaque: int = 0
    flag: int = 0
    language: int = LanguageCode.PYTHON
    version: int = SERVER_VERSION
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: Body = None
    serialize_type: int = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    @classmethod
    def request(
        cls, code: int, fields: Mapping[str, object] | None = None, body: Body = None, oneway: bool = False
    ) -> "RemotingCommand":
        ext = _str_fields(fields) if fields else {}
        return cls(code=int(code), flag=FLAG_ONEWAY if oneway else 0, ext_fields=ext, body=body)

    def response(
        self,
        code: int = ResponseCode.SUCCESS,
        remark: str | None = None,
        fields: Mapping[str, object] | None = None,
        body: Body = None,
    ) -> "RemotingCommand":
        """A response to this request, in its serialize type, with every field as a string."""
        # Positional arguments and module constants: once per request (bench/hot_path.py).
        return RemotingCommand(int(code), self.opaque, FLAG_RESPONSE, _JAVA, SERVER_VERSION, remark,
                               _str_fields(fields) if fields else {}, body, self.serialize_type)

    def response_str(self, code: int, remark: str | None, ext_fields: dict[str, str]) -> "RemotingCommand":
        """:meth:`response` for a header whose values are all strings already: ``ext_fields`` is
        taken as it is, not copied (hot path: a send's answer, bench/hot_path.py)."""
        return RemotingCommand(int(code), self.opaque, FLAG_RESPONSE, _JAVA, SERVER_VERSION, remark,
                               ext_fields, None, self.serialize_type)

    def body_bytes(self) -> bytes:
        b = self.body
        if b.__class__ is bytes:  # hot path: a decoded request's body
            return b
        if b is None:
            return b""
        if isinstance(b, (list, tuple)):
            return b"".join(bytes(p) for p in b)
        return bytes(b)

    # Typed access to extFields; callers turn ValueError into the right response code.
    def get_str(self, name: str, default: str | None = None) -> str | None:
        return self.ext_fields.get(name, default)

    def get_int(self, name: str, default: int | None = None, bits: int = 64) -> int:
        """An integer header field within Java's int (bits=32) or long (64) range."""
        return field_int(self.ext_fields.get(name), name, default, 1 << (bits - 1))

    def get_bool(self, name: str, default: bool = False) -> bool:
        v = self.ext_fields.get(name)
        if v is None or v == "":
            return default
        return v.lower() in ("true", "1")


def field_int(v: str | None, name: str, default: int | None = None, limit: int = 1 << 63) -> int:
    """One raw header value as an integer in [-limit, limit): ``default`` when absent or empty
    (ValueError if there is none), ValueError naming the field when it is not such an integer."""
    if not v:
        if default is None:
            raise ValueError(f"missing header field {name!r}")
        return default
    if len(v) > 24:
        raise ValueError(f"header field {name!r} is not an integer: {v[:24]!r}...")
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"header field {name!r} is not an integer: {v!r}") from None
    if not -limit <= n < limit:
        raise ValueError(f"header field {name!r} is out of range: {n}")
    return n


_JAVA = LanguageCode.JAVA


def _str_fields(fields: Mapping[str, object]) -> dict[str, str]:
    """``fields`` without None values, every value a string (hot path: every request/response)."""
    return {k: v if v.__class__ is str else _to_str(v) for k, v in fields.items() if v is not None}


def _to_str(v: object) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
