"""The coordination store: one compare-and-swap record per broker group, the ground of election.

Issue 17 elects a broker group's master without a consensus protocol of its own: every replica
reads the group's :class:`GroupRecord`, and a change (a new epoch, a new master, a new in-sync set)
is a compare-and-swap against the revision it read, so of two contenders at one revision exactly
one wins. The store is an interface (:class:`CoordinationStore`) with two backends on real systems:
etcd (``tidemq.broker.ha.etcd``) and a Kubernetes ``coordination.k8s.io/v1`` Lease
(``tidemq.broker.ha.kubernetes``).

Invariants every backend keeps:
- A revision is a positive integer that changes on every write of a key; revision 0 means "absent",
  and a compare-and-swap at revision 0 creates the key only if it does not exist (or has expired).
- A key written under a lease reads as absent once the lease has expired (not kept alive within its
  TTL) or was revoked. The lease is liveness, not fencing: a master that lost its lease may not know
  it yet, so the data path must still check the epoch (client-go's leaderelection says the same).
- ``watch`` yields the key's changes in revision order, starting after the revision given.
- Every network wait has a timeout; a store that cannot be reached raises :class:`CoordinationError`.

The record's JSON codec is pure (bytes in, value out) and raises only :class:`RecordCodecError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import orjson

from tidemq.errors import CodecError, TideMQError

# A broker group has 1 to 5 replicas (issue 17); replica ids are 0..MAX_REPLICAS-1.
MAX_REPLICAS = 5
# The longest record the codec accepts: a real one is ~150 bytes; checked before parsing.
MAX_RECORD_BYTES = 4096
KEY_PREFIX = "/tidemq"
MAX_INT64 = 2**63 - 1


class CoordinationError(TideMQError):
    """The coordination store could not be reached or refused a request."""


class RecordCodecError(CodecError):
    """Bytes that are not a valid group record."""


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """The election state of one broker group.

    ``epoch`` grows by one with every change of master; ``master`` is the replica id acknowledging
    writes in that epoch (None while none is elected); ``in_sync`` the replicas that have every
    acknowledged message (only they may be elected); ``master_log_end`` the master's CommitLog end
    offset when it was elected, where followers of another history truncate to;
    ``handed_over_by`` the previous master when this record was written by a planned hand-over
    (only then may the named master take a record it did not write itself). A record that breaks
    these bounds raises ValueError (the codec turns it into RecordCodecError).
    """

    epoch: int
    master: int | None
    in_sync: tuple[int, ...]
    min_in_sync: int
    master_log_end: int = 0
    handed_over_by: int | None = None

    def __post_init__(self) -> None:
        if not (0 <= self.epoch <= MAX_INT64 and 0 <= self.master_log_end <= MAX_INT64):
            raise ValueError(f"epoch and master_log_end must be in 0..2^63-1: {self}")
        for replica in (*self.in_sync, *(() if self.master is None else (self.master,)),
                        *(() if self.handed_over_by is None else (self.handed_over_by,))):
            if not 0 <= replica < MAX_REPLICAS:
                raise ValueError(f"replica id {replica} is outside 0..{MAX_REPLICAS - 1}")
        if len(set(self.in_sync)) != len(self.in_sync):
            raise ValueError(f"in_sync lists a replica twice: {self.in_sync}")
        if not 1 <= self.min_in_sync <= MAX_REPLICAS:
            raise ValueError(f"min_in_sync {self.min_in_sync} is outside 1..{MAX_REPLICAS}")


@dataclass(frozen=True, slots=True)
class Versioned:
    """A record as read from the store, with the revision a compare-and-swap must name."""

    record: GroupRecord
    revision: int


@dataclass(frozen=True, slots=True)
class Change:
    """One change of a watched key: its new record, or None when it was deleted or expired."""

    record: GroupRecord | None
    revision: int


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted lease: ``id`` is the backend's handle, ``ttl`` the seconds it lives unrenewed."""

    id: str
    ttl: float


def group_key(cluster: str, broker_name: str) -> str:
    """The one key of a broker group's record."""
    for part in (cluster, broker_name):
        if not part or "/" in part:
            raise ValueError(f"cluster and broker name must be non-empty and have no '/': {part!r}")
    return f"{KEY_PREFIX}/{cluster}/{broker_name}/group"


def encode_record(record: GroupRecord) -> bytes:
    doc: dict[str, object] = {"epoch": record.epoch, "master": record.master,
                              "inSync": list(record.in_sync), "minInSync": record.min_in_sync,
                              "masterLogEnd": record.master_log_end}
    if record.handed_over_by is not None:
        doc["handedOverBy"] = record.handed_over_by
    return orjson.dumps(doc)


def _int(doc: dict[str, object], name: str) -> int:
    value = doc.get(name)
    # bool is an int subclass: `true` is not an epoch.
    if not isinstance(value, int) or isinstance(value, bool):
        raise RecordCodecError(f"group record field {name!r} must be an integer, got {value!r}")
    return value


def decode_record(data: bytes) -> GroupRecord:
    """The record in ``data``; raises RecordCodecError (only) for anything else."""
    if len(data) > MAX_RECORD_BYTES:
        raise RecordCodecError(f"group record of {len(data)} bytes exceeds {MAX_RECORD_BYTES}")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise RecordCodecError(f"group record is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise RecordCodecError("group record must be a JSON object")
    master = doc.get("master")
    if master is not None and (not isinstance(master, int) or isinstance(master, bool)):
        raise RecordCodecError(f"group record field 'master' must be an integer or null: {master!r}")
    by = doc.get("handedOverBy")
    if by is not None and (not isinstance(by, int) or isinstance(by, bool)):
        raise RecordCodecError(f"group record field 'handedOverBy' must be an integer or null: {by!r}")
    in_sync = doc.get("inSync")
    if not isinstance(in_sync, list) or len(in_sync) > MAX_REPLICAS or \
            not all(isinstance(r, int) and not isinstance(r, bool) for r in in_sync):
        raise RecordCodecError(f"group record field 'inSync' must be a list of replica ids: {in_sync!r}")
    try:
        return GroupRecord(epoch=_int(doc, "epoch"), master=master, in_sync=tuple(in_sync),
                           min_in_sync=_int(doc, "minInSync"),
                           master_log_end=_int(doc, "masterLogEnd"), handed_over_by=by)
    except ValueError as exc:
        raise RecordCodecError(f"invalid group record: {exc}") from None


class CoordinationStore(Protocol):
    """What election needs of a store (see the module docstring for the invariants)."""

    async def get(self, key: str) -> Versioned | None:
        """The key's record and revision, or None when absent (or its lease expired)."""

    async def compare_and_swap(self, key: str, record: GroupRecord, revision: int,
                               lease: Lease | None = None) -> Versioned | None:
        """Write ``record`` if the key is still at ``revision`` (0: absent); the written record
        and its new revision, or None when another write came first. Under ``lease`` the key
        disappears when the lease expires."""

    async def grant(self, ttl: float) -> Lease:
        """A new lease living ``ttl`` seconds unless kept alive."""

    async def keep_alive(self, lease: Lease) -> bool:
        """Renew ``lease`` for another TTL; False when it had already expired (or was revoked)."""

    async def revoke(self, lease: Lease) -> None:
        """End ``lease`` now: the keys written under it disappear. A gone lease is no error."""

    def watch(self, key: str, after: int = 0) -> AsyncIterator[Change]:
        """The key's changes with a revision above ``after`` (0: from now on), as they happen,
        until cancelled; a broken connection is reopened where it left off, not raised."""

    async def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
