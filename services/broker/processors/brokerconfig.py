"""Remoting adapter of the broker-config family: UPDATE_BROKER_CONFIG (25) and GET_BROKER_CONFIG (26).

Both carry the config as RocketMQ's ``key=value`` properties text in the body (MixAll's
properties2String / string2Properties); the allow-list and the checks are
:class:`tidemq.broker.messaging.brokerconfig.BrokerConfigService`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from tidemq.broker.messaging.brokerconfig import BrokerConfigService
from tidemq.broker.processors.common import Callers, Handler
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode


log = logging.getLogger(__name__)

# How long an UPDATE_BROKER_CONFIG waits for the name servers to take a permission change before
# answering anyway (the registration goes on; the periodic rounds repeat it).
REREGISTER_WAIT = 10.0


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

    def update(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Awaitable[RemotingCommand]:
        try:
            items = parse_properties(cmd.body_bytes().decode("utf-8"))
        except UnicodeDecodeError:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "UPDATE_BROKER_CONFIG: the body is not UTF-8 text")
        if not items:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "UPDATE_BROKER_CONFIG: no key=value in the body")
        # a refusal raises here, before anything awaits (the dispatcher answers it)
        announced = self.service.update(self.callers(conn, cmd), items)
        if announced is None:
            return cmd.response(ResponseCode.SUCCESS)
        return self._answer_when_registered(cmd, announced)

    @staticmethod
    async def _answer_when_registered(cmd: RemotingCommand, announced: Awaitable[None]) -> RemotingCommand:
        try:
            await asyncio.wait_for(asyncio.shield(announced), REREGISTER_WAIT)
        except TimeoutError:
            log.warning("the name servers did not take the new brokerPermission within %.0f s; "
                        "answering now, the registration goes on", REREGISTER_WAIT)
        return cmd.response(ResponseCode.SUCCESS)

    def get(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        lines = [f"{k}={v}" for k, v in self.service.current()]
        return cmd.response(body=("\n".join(lines) + "\n").encode())
