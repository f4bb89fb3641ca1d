"""Wire names of a replicated broker group (issue 17): the SWITCHOVER header and the keys a replica
adds to GET_BROKER_RUNTIME_INFO.

SWITCHOVER (TideMQ's own request code 9001, see tidemq.remoting.codes) asks a group's master to
hand mastership over. Request header: ``brokerName`` (the group the caller means; a broker of
another group refuses, so a stale address cannot switch the wrong group) and ``toReplicaId``
(0..4, or -1 / absent: the in-sync follower with the highest acknowledged offset). A SUCCESS
answer carries ``replicaId``, the replica that takes over.

GET_BROKER_RUNTIME_INFO (RocketMQ's 28) answers a KVTable, ``{"table": {key: value}}`` with every
value a string. A broker that runs as a replica adds the ``ha*`` keys of :data:`RUNTIME_KEYS`;
a plain broker has none of them. Lists are comma-separated (``haInSync`` = ``"0,1,2"``) and the
followers' lag is ``replica:bytes`` pairs (``haFollowerLag`` = ``"1:0,2:4096"``, master only); a
value that does not exist (no master, no failover yet) is the empty string.

Pure: no sockets, files or clocks; a bad field raises ``ValueError`` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tidemq.remoting.command import field_int
from tidemq.remoting.headers.fields import INT

# The highest replica id (tidemq.broker.ha.coordination.MAX_REPLICAS - 1; remoting imports
# nothing of ours, a test keeps the two equal).
MAX_REPLICA_ID = 4
BEST_REPLICA = -1  # toReplicaId: let the master pick the in-sync follower that is furthest ahead

# GET_BROKER_RUNTIME_INFO keys of a replica, in the order clients list them.
HA_ROLE = "haRole"  # master | follower | none
HA_REPLICA_ID = "haReplicaId"
HA_EPOCH = "haEpoch"
HA_MASTER = "haMaster"  # the master's replica id, "" when there is none
HA_IN_SYNC = "haInSync"  # "0,1,2"
HA_MIN_IN_SYNC = "haMinInSync"
HA_REPLICATION = "haReplication"  # sync | async
HA_HIGH_WATER = "haHighWater"  # CommitLog offset acknowledged by the group's rule
HA_LOG_END = "haLogEnd"  # this replica's CommitLog end
HA_FOLLOWER_LAG = "haFollowerLag"  # "1:0,2:4096" (master only)
HA_FAILOVERS = "haFailovers"  # times this replica became master by election
HA_LAST_FAILOVER_SECONDS = "haLastFailoverSeconds"  # "" until it did
HA_SWITCHOVERS = "haSwitchovers"
HA_DEPOSED = "haDeposed"  # masters this replica deposed because their replication address refused
RUNTIME_KEYS = (HA_ROLE, HA_REPLICA_ID, HA_EPOCH, HA_MASTER, HA_IN_SYNC, HA_MIN_IN_SYNC, HA_REPLICATION,
                HA_HIGH_WATER, HA_LOG_END, HA_FOLLOWER_LAG, HA_FAILOVERS, HA_LAST_FAILOVER_SECONDS,
                HA_SWITCHOVERS, HA_DEPOSED)


@dataclass(frozen=True, slots=True)
class SwitchoverHeader:
    """SWITCHOVER: the group meant and the replica to take over (None: the best in-sync one)."""

    broker_name: str
    to_replica_id: int | None = None

    def __post_init__(self) -> None:
        if self.to_replica_id is not None and not 0 <= self.to_replica_id <= MAX_REPLICA_ID:
            raise ValueError(f"replica id {self.to_replica_id} is outside 0..{MAX_REPLICA_ID}: name a replica "
                             "of the group, or none for the in-sync follower furthest ahead")

    def fields(self) -> dict[str, object]:
        to = BEST_REPLICA if self.to_replica_id is None else self.to_replica_id
        return {"brokerName": self.broker_name, "toReplicaId": to}


def decode_switchover_header(fields: Mapping[str, str]) -> SwitchoverHeader:
    to = field_int(fields.get("toReplicaId"), "toReplicaId", BEST_REPLICA, INT)
    try:
        return SwitchoverHeader(fields.get("brokerName") or "", None if to == BEST_REPLICA else to)
    except ValueError as exc:
        raise ValueError(f"header field 'toReplicaId': {exc}") from None


def decode_switchover_answer(fields: Mapping[str, str]) -> int:
    """The replica id a SUCCESS answer to SWITCHOVER names."""
    to = field_int(fields.get("replicaId"), "replicaId", None, INT)
    if not 0 <= to <= MAX_REPLICA_ID:
        raise ValueError(f"header field 'replicaId' is out of range: {to}")
    return to


def id_list(ids: tuple[int, ...]) -> str:
    """``haInSync``: "0,1,2"."""
    return ",".join(str(i) for i in ids)


def parse_id_list(text: str) -> tuple[int, ...]:
    """``haInSync`` back to ids; ValueError naming the key when it is not such a list."""
    try:
        return tuple(int(p) for p in text.split(",")) if text.strip() else ()
    except ValueError:
        raise ValueError(f"{HA_IN_SYNC} {text[:64]!r} is not a comma-separated list of replica ids") from None


def lag_list(lags: tuple[tuple[int, int], ...]) -> str:
    """``haFollowerLag``: (replica id, lag bytes) pairs as "1:0,2:4096"."""
    return ",".join(f"{r}:{b}" for r, b in lags)


def parse_lag_list(text: str) -> tuple[tuple[int, int], ...]:
    """``haFollowerLag`` back to (replica id, lag bytes) pairs; ValueError naming the key."""
    out = []
    for part in text.split(",") if text.strip() else ():
        rid, sep, lag = part.partition(":")
        try:
            if not sep:
                raise ValueError
            out.append((int(rid), int(lag)))
        except ValueError:
            raise ValueError(f"{HA_FOLLOWER_LAG} {text[:64]!r} is not a list of replica:bytes pairs") from None
    return tuple(out)
