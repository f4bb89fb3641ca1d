"""Remoting adapter of the runtime family: GET_BROKER_RUNTIME_INFO (RocketMQ's 28) and SWITCHOVER
(TideMQ's 9001, issue 17).

GET_BROKER_RUNTIME_INFO answers RocketMQ's KVTable body ``{"table": {key: string}}`` with the keys
of RocketMQ's ``AdminBrokerProcessor.prepareRuntimeInfo`` this broker can fill honestly
(``brokerVersionDesc``, ``brokerVersion``, ``msgPutTotalTodayNow``, ``msgGetTotalTodayNow``,
``bootTimestamp``, ``commitLogMinOffset``, ``commitLogMaxOffset``, ``remainHowManyDataToFlush``,
``commitLogDiskRatio``), TideMQ's ``transactionHalfProgress`` (the transaction checker's offset in
the half queue: every half message below it is resolved) and, for a replica, the ``ha*`` keys of
:mod:`tidemq.remoting.headers.replica`. SWITCHOVER decodes its header there too and answers
SUCCESS with ``replicaId``, or the refusal's code and sentence.
"""

from __future__ import annotations

from collections.abc import Awaitable

import orjson

from tidemq.broker.messaging.runtime import BrokerRuntime, RuntimeService
from tidemq.broker.processors.common import Handler
from tidemq.errors import BrokerError
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.codes import SERVER_VERSION
from tidemq.remoting.headers import replica as ha
from tidemq.remoting.headers.admin import TRANSACTION_HALF_PROGRESS
from tidemq.remoting.headers.replica import SwitchoverHeader, decode_switchover_header, id_list, lag_list

# RocketMQ's MQVersion name of the protocol version this broker answers with (SERVER_VERSION).
ROCKETMQ_VERSION_DESC = "V4_9_7"


def runtime_table(rt: BrokerRuntime) -> dict[str, str]:
    """The KVTable of GET_BROKER_RUNTIME_INFO (every value a string, as RocketMQ's)."""
    table = {
        "brokerVersionDesc": f"TideMQ {rt.version} ({ROCKETMQ_VERSION_DESC})",
        "brokerVersion": str(SERVER_VERSION),
        "msgPutTotalTodayNow": str(rt.messages_in),
        "msgGetTotalTodayNow": str(rt.messages_out),
        "bootTimestamp": str(rt.boot_ms),
        "commitLogMinOffset": str(rt.commitlog_min_offset),
        "commitLogMaxOffset": str(rt.commitlog_max_offset),
        "remainHowManyDataToFlush": str(rt.unflushed_bytes),
        "commitLogDiskRatio": repr(rt.disk_usage_ratio),
        TRANSACTION_HALF_PROGRESS: str(rt.transaction_half_progress),
    }
    s = rt.replica
    if s is not None:
        last = s.last_failover_seconds
        table.update({
            ha.HA_ROLE: s.role,
            ha.HA_REPLICA_ID: str(s.replica_id),
            ha.HA_EPOCH: str(s.epoch),
            ha.HA_MASTER: "" if s.master is None else str(s.master),
            ha.HA_IN_SYNC: id_list(tuple(s.in_sync)),
            ha.HA_MIN_IN_SYNC: str(s.min_in_sync),
            ha.HA_REPLICATION: s.replication,
            ha.HA_HIGH_WATER: str(s.high_water),
            ha.HA_LOG_END: str(s.log_end),
            ha.HA_FOLLOWER_LAG: lag_list(tuple((f.replica_id, f.lag_bytes) for f in s.followers)),
            ha.HA_FAILOVERS: str(s.failovers),
            ha.HA_LAST_FAILOVER_SECONDS: "" if last is None else f"{last:.3f}",
            ha.HA_SWITCHOVERS: str(s.switchovers),
            ha.HA_DEPOSED: str(s.deposed),
        })
    return table


class RuntimeProcessor:
    def __init__(self, service: RuntimeService) -> None:
        self.service = service

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.GET_BROKER_RUNTIME_INFO: self.runtime_info,
            RequestCode.SWITCHOVER: self.switchover,
        }

    def runtime_info(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body=orjson.dumps({"table": runtime_table(self.service.runtime())}))

    def switchover(self, conn: Connection, cmd: RemotingCommand) -> Awaitable[RemotingCommand]:
        h = decode_switchover_header(cmd.ext_fields)  # ValueError: the dispatcher's "bad request"
        return self._switchover(cmd, h)

    async def _switchover(self, cmd: RemotingCommand, h: SwitchoverHeader) -> RemotingCommand:
        try:
            to = await self.service.switchover(h.broker_name, h.to_replica_id)
        except BrokerError as exc:  # a refusal, raised after the dispatcher's own conversion: answer it here
            return cmd.response(exc.code or ResponseCode.SYSTEM_ERROR, exc.remark or str(exc))
        return cmd.response(fields={"replicaId": to})
