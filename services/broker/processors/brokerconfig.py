"""Remoting adapter of the broker-config family: UPDATE_BROKER_CONFIG (25) and GET_BROKER_CONFIG (26).

Both carry the config as RocketMQ's ``key=value`` properties text in the body (MixAll's
properties2String / string2Properties); the allow-list and the checks are
:class:`tidemq.broker.messaging.brokerconfig.BrokerConfigService`'s.
"""

from __future__ import annotations

from tidemq.broker.messaging.brokerconfig import BrokerConfigService
from tidemq.broker.processors.common import Callers, Handler
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode


def parse_properties(text: str) -> list[tuple[str, str]]:
    """``key=value`` lines (RocketMQ's MixAll.properties2String), comments and blanks skipped."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s[0] in "#!":
            continue
        key, sep, value = s.partition("=")
        if not sep:
            key, sep, value = s.partition(":")
        out.append((key.strip(), value.strip()))
    return out


class BrokerConfigProcessor:
    def __init__(self, service: BrokerConfigService, *, callers: Callers) -> None:
        self.service = service
        self.callers = callers

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.UPDATE_BROKER_CONFIG: self.update,
            RequestCode.GET_BROKER_CONFIG: self.get,
        }

    def update(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        try:
            items = parse_properties(cmd.body_bytes().decode("utf-8"))
        except UnicodeDecodeError:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "UPDATE_BROKER_CONFIG: the body is not UTF-8 text")
        if not items:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "UPDATE_BROKER_CONFIG: no key=value in the body")
        self.service.update(self.callers(conn, cmd), items)
        return cmd.response(ResponseCode.SUCCESS)

    def get(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        lines = [f"{k}={v}" for k, v in self.service.current()]
        return cmd.response(body=("\n".join(lines) + "\n").encode())
