"""Header of END_TRANSACTION (37): a producer's commit or rollback of a half message.

``tranStateTableOffset`` is the half message's queue offset and ``commitLogOffset`` its
commit-log offset (both Java longs, required); ``commitOrRollback`` is RocketMQ's
MessageSysFlag value (0 unknown, 8 commit, 12 rollback; a Java int, required, its meaning checked
by the broker). ``msgId`` is for logs only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tidemq.remoting.command import field_int
from tidemq.remoting.headers.fields import INT, field_bool


@dataclass(frozen=True, slots=True)
class EndTransactionHeader:
    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int
    from_transaction_check: bool
    msg_id: str


def decode_end_transaction_header(fields: Mapping[str, str]) -> EndTransactionHeader:
    return EndTransactionHeader(
        fields.get("producerGroup") or "",
        field_int(fields.get("tranStateTableOffset"), "tranStateTableOffset"),
        field_int(fields.get("commitLogOffset"), "commitLogOffset"),
        field_int(fields.get("commitOrRollback"), "commitOrRollback", None, INT),
        field_bool(fields.get("fromTransactionCheck")),
        fields.get("msgId") or "",
    )
