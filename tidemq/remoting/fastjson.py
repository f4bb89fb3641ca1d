"""JSON as RocketMQ's Java side (fastjson) writes it, both ways: pure functions.

fastjson writes integer map keys unquoted (``{0:"10.0.0.5:10911"}``) and object map keys inline
(``{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}``, used by TopicStatsTable and ConsumeStats).
:func:`loads` accepts standard JSON plus both quirks; object keys come back as
:class:`ObjectKey` (a hashable, sorted tuple of the key object's items). :func:`dumps` writes
standard JSON but renders ObjectKey keys in fastjson's inline form, which Java admin tools need.
"""

from __future__ import annotations

import orjson

from tidemq.errors import FrameError

MAX_DEPTH = 64


class ObjectKey(tuple[tuple[str, object], ...]):
    """A map key that is itself a JSON object, as fastjson writes ``Map<MessageQueue, ...>``."""

    @classmethod
    def of(cls, **fields: object) -> "ObjectKey":
        return cls(sorted(fields.items()))

    def as_dict(self) -> dict[str, object]:
        return dict(self)


def dumps(value: object) -> bytes:
    if not _has_object_keys(value):
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    return _dump(value).encode()


def _has_object_keys(value: object) -> bool:
    if isinstance(value, dict):
        return any(isinstance(k, ObjectKey) or _has_object_keys(v) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not isinstance(value, ObjectKey):
        return any(_has_object_keys(v) for v in value)
    return False


def _dump(value: object) -> str:
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            if isinstance(k, ObjectKey):
                ks = _dump(dict(k))
            else:
                ks = orjson.dumps(str(k)).decode()
            items.append(f"{ks}:{_dump(v)}")
        return "{" + ",".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_dump(v) for v in value) + "]"
    return orjson.dumps(value).decode()


def loads(data: bytes | str) -> object:
    """Parse fastjson output. Raises FrameError on anything that is not (lenient) JSON."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            try:
                text = bytes(data).decode("utf-8")
            except UnicodeDecodeError:
                raise FrameError("JSON body is not UTF-8") from None
    else:
        text = data
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    parser = _Parser(text)
    value = parser.value(0)
    parser.ws()
    if parser.pos != len(text):
        raise FrameError(f"unexpected data at character {parser.pos} of JSON body")
    return value


def _freeze(value: object) -> object:
    """A hashable form of a decoded JSON value (object keys may nest objects and arrays)."""
    if isinstance(value, dict):
        return ObjectKey(sorted(((str(k), _freeze(v)) for k, v in value.items()), key=lambda kv: kv[0]))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def ws(self) -> None:
        t, p = self.text, self.pos
        while p < len(t) and t[p] in " \t\r\n":
            p += 1
        self.pos = p

    def fail(self, what: str) -> FrameError:
        return FrameError(f"invalid JSON body at character {self.pos}: {what}")

    def closed(self, close: str) -> bool:
        """After an element: consume a comma (False) or the ``close`` bracket (True)."""
        self.ws()
        if self.text.startswith(",", self.pos):
            self.pos += 1
            return False
        if self.text.startswith(close, self.pos):
            self.pos += 1
            return True
        raise self.fail(f"expected , or {close}")

    def value(self, depth: int) -> object:
        if depth > MAX_DEPTH:
            raise self.fail("nested too deeply")
        self.ws()
        if self.pos >= len(self.text):
            raise self.fail("unexpected end")
        c = self.text[self.pos]
        if c == "{":
            return self.obj(depth)
        if c == "[":
            self.pos += 1
            out: list[object] = []
            self.ws()
            if self.text.startswith("]", self.pos):
                self.pos += 1
                return out
            while True:
                out.append(self.value(depth + 1))
                if self.closed("]"):
                    return out
        if c == '"':
            return self.string()
        return self.scalar()

    def obj(self, depth: int) -> dict[object, object]:
        self.pos += 1
        out: dict[object, object] = {}
        self.ws()
        if self.text.startswith("}", self.pos):
            self.pos += 1
            return out
        while True:
            self.ws()
            if self.pos >= len(self.text):
                raise self.fail("unexpected end in object")
            c = self.text[self.pos]
            if c == '"':
                key: object = self.string()
            elif c == "{":
                key = _freeze(self.obj(depth + 1))
            else:
                key = self.scalar()
                if not isinstance(key, (int, float)) or isinstance(key, bool):
                    raise self.fail("object key must be a string, number or object")
            self.ws()
            if not self.text.startswith(":", self.pos):
                raise self.fail("expected :")
            self.pos += 1
            out[key] = self.value(depth + 1)
            if self.closed("}"):
                return out

    def string(self) -> str:
        start = self.pos
        p = start + 1
        t = self.text
        while p < len(t):
            ch = t[p]
            if ch == "\\":
                p += 2
                continue
            if ch == '"':
                self.pos = p + 1
                try:
                    text: str = orjson.loads(t[start : p + 1])
                    return text
                except orjson.JSONDecodeError:
                    raise self.fail("bad string") from None
            p += 1
        raise self.fail("unterminated string")

    def scalar(self) -> object:
        t, p = self.text, self.pos
        end = p
        while end < len(t) and t[end] not in ",:}] \t\r\n":
            end += 1
        token = t[p:end]
        self.pos = end
        if token in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[token]
        try:
            return int(token)
        except ValueError:
            pass
        try:
            return float(token)
        except ValueError:
            raise self.fail(f"unexpected token {token[:20]!r}") from None
