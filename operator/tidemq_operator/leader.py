"""Leader election between operator replicas on a ``coordination.k8s.io/v1`` Lease.

Only the leader runs kopf (every handler, timer and status write); the other replicas wait,
ready to take over. This is client-go's ``leaderelection`` (what controller-runtime operators and
Strimzi use) in asyncio:

- The Lease names its holder (``holderIdentity``, the pod name), how long a claim lasts
  (``leaseDurationSeconds``), when it was last renewed (``renewTime``), acquired (``acquireTime``)
  and how often it changed hands (``leaseTransitions``).
- Every write is a compare-and-swap: a JSON merge patch carrying the ``metadata.resourceVersion``
  that was read (the API server answers 409 Conflict when another replica wrote in between), or a
  create (409 when it exists). Of two replicas racing for a free Lease exactly one wins.
- A candidate takes the Lease over when it is released (empty holder) or when the record has not
  changed for ``leaseDurationSeconds`` by the candidate's own monotonic clock, counted from when
  it first saw that record (client-go's observedTime): no two hosts' wall clocks are compared.
- The leader renews every ``retry_period``. A renewal counts from the moment it was sent; when
  none has succeeded for ``renew_deadline`` (each attempt is bounded by what is left of it) the
  leader steps down at once: the work it leads is cancelled and :class:`LeadershipLost` raised.
  A leader that reads another holder in the Lease steps down at once too.

Invariant (why at most one replica acts): ``retry_period < renew_deadline < lease_duration``. The
leader stops acting no later than ``renew_deadline`` after its last successful renewal was sent;
any other replica saw that record no earlier than it was sent and waits ``lease_duration`` from
then. Like client-go's, this assumes clocks that run at the same rate, not synchronised clocks.

On a clean stop the leader releases the Lease (holder cleared), so a standby takes over at its
next retry instead of after the lease duration. After a SIGKILL nothing is released: the standby
takes over once the lease has expired.

The Kubernetes calls run on a dedicated thread (the synchronous ``kubernetes`` client), so busy
handler threads in the default executor never delay a renewal. Clock, wall clock and sleep are
injected (tests drive them).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

log = logging.getLogger(__name__)

API_VERSION = "coordination.k8s.io/v1"
# client-go's defaults (and controller-runtime's): 15 s lease, 10 s renew deadline, 2 s retries.
LEASE_DURATION = 15
RENEW_DEADLINE = 10.0
RETRY_PERIOD = 2.0
MAX_IDENTITY = 253  # holderIdentity is free text; keep it a readable, bounded name


class LeaseConflict(Exception):
    """Another replica wrote the Lease since it was read (409), or created it first."""


class LeadershipLost(Exception):
    """This replica stopped leading: renewal failed past the deadline, or another holds the Lease."""


@dataclass(frozen=True, slots=True)
class LeaderConfig:
    """Where the Lease is and the election's timings (seconds)."""

    name: str
    namespace: str
    identity: str
    lease_duration: int = LEASE_DURATION
    renew_deadline: float = RENEW_DEADLINE
    retry_period: float = RETRY_PERIOD

    def __post_init__(self) -> None:
        if not self.name or not self.namespace:
            raise ValueError("leader election needs a Lease name and namespace")
        if not self.identity or len(self.identity) > MAX_IDENTITY:
            raise ValueError(f"leader election needs an identity of 1-{MAX_IDENTITY} characters "
                             "(the pod name: set POD_NAME)")
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                f"leader election timings must satisfy retry period ({self.retry_period:g} s) < renew "
                f"deadline ({self.renew_deadline:g} s) < lease duration ({self.lease_duration} s): "
                "otherwise a standby could take over while the leader still acts")

    @property
    def request_timeout(self) -> float:
        """Bound of one API call: a renewal must be able to fail and be retried before the deadline."""
        return max(0.5, min(5.0, self.renew_deadline / 2))


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The election's fields of a Lease (``spec``) and the version they were read at."""

    holder: str                   # "" when released
    lease_duration: int           # seconds
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0
    resource_version: str | None = None

    @classmethod
    def from_lease(cls, obj: dict[str, Any]) -> LeaseRecord:
        spec = obj.get("spec") or {}
        return cls(holder=spec.get("holderIdentity") or "",
                   lease_duration=int(spec.get("leaseDurationSeconds") or 0),
                   acquire_time=spec.get("acquireTime"), renew_time=spec.get("renewTime"),
                   transitions=int(spec.get("leaseTransitions") or 0),
                   resource_version=(obj.get("metadata") or {}).get("resourceVersion"))

    def spec(self) -> dict[str, Any]:
        return {"holderIdentity": self.holder, "leaseDurationSeconds": self.lease_duration,
                "acquireTime": self.acquire_time, "renewTime": self.renew_time,
                "leaseTransitions": self.transitions}

    def same_claim(self, other: LeaseRecord | None) -> bool:
        """Whether ``other`` is this record unchanged (a renewal changes renewTime)."""
        return other is not None and self.spec() == other.spec()


def micro_time(now: datetime.datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC), as Lease times are written."""
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


# the state machine (pure) ----------------------------------------------------------------------
def may_claim(current: LeaseRecord | None, identity: str, observed_at: float, now: float) -> bool:
    """Whether ``identity`` may write itself into the Lease: it does not exist, was released, is
    ours, or has not changed for its lease duration since ``observed_at`` (our monotonic clock)."""
    if current is None or not current.holder or current.holder == identity:
        return True
    return now >= observed_at + current.lease_duration


def claim(current: LeaseRecord | None, identity: str, lease_duration: int, wall: str) -> LeaseRecord:
    """The record that makes (or keeps) ``identity`` the holder as of ``wall``: a renewal keeps
    acquireTime and the transition count; a change of holder sets both."""
    if current is not None and current.holder == identity:
        return replace(current, lease_duration=lease_duration, renew_time=wall)
    transitions = current.transitions + 1 if current is not None else 0
    return LeaseRecord(holder=identity, lease_duration=lease_duration, acquire_time=wall,
                       renew_time=wall, transitions=transitions)


def released(current: LeaseRecord, wall: str) -> LeaseRecord:
    """The record a leader writes when it stops: no holder, so a standby claims it at once
    (client-go's ReleaseOnCancel also shortens the duration to 1 s)."""
    return replace(current, holder="", lease_duration=1, renew_time=wall)


# the Lease on the API server --------------------------------------------------------------------
class LeaseStore(Protocol):
    async def get(self) -> LeaseRecord | None: ...
    async def create(self, record: LeaseRecord) -> LeaseRecord: ...
    async def update(self, record: LeaseRecord, resource_version: str | None) -> LeaseRecord: ...


class KubernetesLeaseStore:
    """The Lease through the ``kubernetes`` client, each call on this store's own thread and
    bounded by ``timeout``. ``api_client`` is a configured ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: Any, name: str, namespace: str, timeout: float) -> None:
        import kubernetes  # noqa: PLC0415 (optional dependency: the operator extra)

        self._api = kubernetes.client.CoordinationV1Api(api_client)
        self._errors = kubernetes.client.ApiException
        self.name, self.namespace, self.timeout = name, namespace, timeout
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leader-lease")

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, lambda: fn(*args, _request_timeout=self.timeout, **kwargs))

    async def get(self) -> LeaseRecord | None:
        try:
            obj = await self._call(self._api.read_namespaced_lease, self.name, self.namespace)
        except self._errors as exc:
            if exc.status == 404:
                return None
            raise
        return LeaseRecord.from_lease(self._api.api_client.sanitize_for_serialization(obj))

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        body = {"apiVersion": API_VERSION, "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": record.spec()}
        try:
            obj = await self._call(self._api.create_namespaced_lease, self.namespace, body)
        except self._errors as exc:
            if exc.status == 409:
                raise LeaseConflict(f"Lease {self.namespace}/{self.name} was created by another replica") from None
            raise
        return LeaseRecord.from_lease(self._api.api_client.sanitize_for_serialization(obj))

    async def update(self, record: LeaseRecord, resource_version: str | None) -> LeaseRecord:
        # A merge patch with metadata.resourceVersion is a compare-and-swap: 409 when it moved on.
        body = {"metadata": {"resourceVersion": resource_version}, "spec": record.spec()}
        try:
            obj = await self._call(self._api.patch_namespaced_lease, self.name, self.namespace, body,
                                   _content_type="application/merge-patch+json")
        except self._errors as exc:
            if exc.status == 409:
                raise LeaseConflict(f"Lease {self.namespace}/{self.name} changed since it was read") from None
            raise
        return LeaseRecord.from_lease(self._api.api_client.sanitize_for_serialization(obj))

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


# the elector -----------------------------------------------------------------------------------
class LeaderElector:
    """Acquire, hold and release the Lease; :meth:`run` runs some work only while leading.

    ``leading`` (read by ``/leaderz``) is True from a successful claim until the leader steps
    down or releases; :meth:`standing_by` (with it, ``/readyz``) says a standby could take over.
    ``holder`` is the holder last seen (for logs and the probes)."""

    def __init__(self, config: LeaderConfig, store: LeaseStore,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime.datetime] = utc_now,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.config, self.store = config, store
        self.clock, self.wall, self.sleep = clock, wall, sleep
        self.leading = False
        self.holder = ""
        self.contact_at: float | None = None  # when the Lease was last read (monotonic), None: never
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0

    @property
    def lease(self) -> str:
        return f"{self.config.namespace}/{self.config.name}"

    def standing_by(self) -> bool:
        """True while this replica could take over: it read the Lease within the renew deadline
        (a standby that cannot reach the API server could not lead, so it is not ready)."""
        at = self.contact_at
        return at is not None and self.clock() - at <= self.config.renew_deadline

    def _observe(self, record: LeaseRecord | None, now: float) -> None:
        if record is None:
            self._observed = None
        elif not record.same_claim(self._observed):
            self._observed, self._observed_at = record, now
        self.holder = record.holder if record is not None else ""

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: read the Lease, claim it when allowed. True when we hold it now.
        A conflict (someone else wrote first) is False; API errors propagate."""
        now = self.clock()
        current = await self.store.get()
        self.contact_at = now
        self._observe(current, now)
        me = self.config.identity
        if not may_claim(current, me, self._observed_at, now):
            return False
        wall = micro_time(self.wall())
        try:
            if current is None:
                written = await self.store.create(claim(None, me, self.config.lease_duration, wall))
            else:
                written = await self.store.update(claim(current, me, self.config.lease_duration, wall),
                                                  current.resource_version)
        except LeaseConflict as exc:
            log.debug("leader election: %s", exc)
            return False
        self._observed, self._observed_at, self.holder = written, now, me
        return True

    async def acquire(self) -> None:
        """Return once this replica leads (retrying every retry period)."""
        waiting_for = None
        while True:
            try:
                if await self.try_acquire_or_renew():
                    break
            except Exception as exc:  # noqa: BLE001 (API trouble: a standby just retries)
                log.warning("leader election: cannot read or claim Lease %s: %s", self.lease, exc)
            else:
                if self.holder != waiting_for:
                    waiting_for = self.holder
                    log.info("leader election: %s leads (Lease %s); %s stands by", self.holder or "nobody",
                             self.lease, self.config.identity)
            await self.sleep(self.config.retry_period)
        self.leading = True
        rec = self._observed
        log.info("leader election: %s now leads (Lease %s, transition %d)", self.config.identity,
                 self.lease, rec.transitions if rec else 0)

    async def hold(self) -> None:
        """Renew every retry period while leading; raise :class:`LeadershipLost` (and stop
        leading) when no renewal succeeded for the renew deadline or another holds the Lease."""
        cfg = self.config
        last_renewed = self._observed_at  # when the winning claim was sent
        while True:
            await self.sleep(cfg.retry_period)
            sent = self.clock()
            left = last_renewed + cfg.renew_deadline - sent
            reason = ""
            if left > 0:
                try:
                    if await asyncio.wait_for(self.try_acquire_or_renew(), left):
                        last_renewed = sent
                        continue
                    reason = f"{self.holder or 'another replica'} holds it"
                except TimeoutError:
                    reason = f"no renewal within the {cfg.renew_deadline:g} s renew deadline"
                except Exception as exc:  # noqa: BLE001 (API trouble: retry until the deadline)
                    log.warning("leader election: cannot renew Lease %s: %s", self.lease, exc)
                    if self.clock() < last_renewed + cfg.renew_deadline:
                        continue
                    reason = f"no renewal within the {cfg.renew_deadline:g} s renew deadline ({exc})"
            else:
                reason = f"no renewal within the {cfg.renew_deadline:g} s renew deadline"
            self.leading = False
            raise LeadershipLost(f"{cfg.identity} lost Lease {self.lease}: {reason}")

    async def release(self) -> None:
        """Give the Lease up (holder cleared), if we still hold it; errors are logged."""
        self.leading = False
        try:
            current = await asyncio.wait_for(self.store.get(), self.config.request_timeout)
            if current is None or current.holder != self.config.identity:
                return
            await asyncio.wait_for(
                self.store.update(released(current, micro_time(self.wall())), current.resource_version),
                self.config.request_timeout)
        except Exception as exc:  # noqa: BLE001 (the lease then expires instead)
            log.warning("leader election: could not release Lease %s (%s); a standby takes over "
                        "when it expires", self.lease, exc)
            return
        log.info("leader election: %s released Lease %s", self.config.identity, self.lease)

    async def run(self, work: Callable[[], Awaitable[None]]) -> None:
        """Wait for the leadership, then run ``work()`` while renewing. ``work`` ending (or
        raising, or this being cancelled) releases the Lease. Losing the leadership cancels
        ``work`` at once and raises :class:`LeadershipLost` without waiting for it to finish:
        the caller should exit the process (see ``tidemq operator``)."""
        await self.acquire()
        task = asyncio.ensure_future(work())
        renewer = asyncio.ensure_future(self.hold())
        try:
            await asyncio.wait({task, renewer}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            renewer.cancel()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await self.release()
            raise
        if renewer.done():
            task.cancel()  # never awaited: a lost leader must not wait for its handlers
            renewer.result()  # raises LeadershipLost
        renewer.cancel()
        await asyncio.gather(renewer, return_exceptions=True)
        await self.release()
        task.result()
