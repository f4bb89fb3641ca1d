"""Turning error responses into :class:`tidemq.errors.BrokerError` with a sentence that helps.

Pure: takes a response command, raises or returns it.
"""

from __future__ import annotations

from tidemq.errors import BrokerError
from tidemq.remoting import RemotingCommand, ResponseCode

_HINTS: dict[int, str] = {
    ResponseCode.SYSTEM_BUSY: "the broker is overloaded; retry later or slow down",
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: "the server does not implement this request",
    ResponseCode.MESSAGE_ILLEGAL: "the message is too large or malformed for the broker",
    ResponseCode.SERVICE_NOT_AVAILABLE: (
        "the broker cannot write now (shutting down, disk full or slave); retry later"
    ),
    ResponseCode.NO_PERMISSION: "the topic, group or broker permissions forbid this",
    ResponseCode.TOPIC_NOT_EXIST: (
        "create the topic with `tidemq admin updateTopic -n NAMESRV_ADDR -c CLUSTER -t TOPIC`"
    ),
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: (
        "create the group with `tidemq admin updateSubGroup -n NAMESRV_ADDR -c CLUSTER -g GROUP`"
    ),
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: "check the tag expression (e.g. 'TagA || TagB' or '*')",
    ResponseCode.CONSUMER_NOT_ONLINE: "no consumer of that group is connected to the broker",
}


def code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return f"code {code}"


def broker_error(resp: RemotingCommand, what: str, addr: str | None = None) -> BrokerError:
    remark = (resp.remark or "").strip()
    where = f" at {addr}" if addr else ""
    text = f"{what} failed{where}: {code_name(resp.code)} ({resp.code})"
    if remark:
        text += f": {remark}"
    hint = _HINTS.get(resp.code)
    if hint:
        text += f" ({hint})"
    return BrokerError(text, resp.code, remark)


def check(resp: RemotingCommand, what: str, addr: str | None = None,
          ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
    """Return ``resp`` if its code is in ``ok``; raise BrokerError otherwise."""
    if resp.code not in ok:
        raise broker_error(resp, what, addr)
    return resp


def header_int(resp: RemotingCommand, name: str, what: str) -> int:
    try:
        return resp.get_int(name)
    except ValueError as exc:
        raise BrokerError(f"{what}: malformed response ({exc})", resp.code) from None
