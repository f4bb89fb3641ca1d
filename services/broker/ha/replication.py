"""CommitLog replication, master to followers (issue 17, step 2): the asyncio server a master runs
on its HA port and the client a follower runs against it. Election and acknowledgement build on it.

A session: the follower connects and sends its Handshake (group, replica id, the epoch it knows,
its CommitLog end); the master answers Welcome (its epoch, the truncation point, the offset it
streams from) or a Refusal; the follower cuts its log at the truncation point and then appends the
master's data frames at exactly the offsets they carry, checking every record (the store's
``append_replicated``), and acks its end (what it has flushed, on a SYNC_FLUSH broker): once for
all the frames one read brought (ha/link.py), and only when that end moved or a keepalive is due.
The master streams whole records within a bounded window (at most ``max_unacked_bytes`` past the
follower's ack), sends heartbeats when idle or when a moved high-water mark found no data frame to
carry it within ``mark_linger``, and records each follower's acked offset: what sync
acknowledgement waits on. Followers streaming from the same offset share one read and encoding
of a frame.

Invariants:
- Truncation follows Kafka's leader-epoch rule: a follower's log agrees with the master's up to
  the start of the first epoch after the follower's (``truncation_point``); the epoch history is
  the master's (where each epoch began: the group record's ``masterLogEnd``).
- A follower never accepts an epoch lower than the one it knows, nor a data frame of an epoch
  other than the session's: a stale master is fenced in the data path, not by its lease.
- Every network wait has a timeout; every task is owned (a master's one per connection, a
  follower's one loop) and cancelled and awaited on ``close``. A master reads acks in the
  connection's callback (ha/link.py): a follower silent past its heartbeat interval plus the
  timeout is dropped by its stream, which looks at least every ``poll_interval``.
- A dropped connection leaves no partial record: frames are read whole before anything is
  appended, and the store keeps nothing of a frame that fails its checks.
- An ack never claims more than the follower holds (appended; flushed when ``ack_flushed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from tidemq.errors import BrokerError, StoreError

from tidemq.broker.ha import protocol
from tidemq.broker.ha.epochs import EpochHistory, EpochStart
from tidemq.broker.ha.link import FrameLink
from tidemq.broker.ha.protocol import Ack, Data, Frame, Handshake, Heartbeat, Refusal, Welcome
from tidemq.broker.store.store import MessageStore
from tidemq.broker.store.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class ReplicationError(BrokerError):
    """A replication session ended: the peer refused, broke the protocol or went silent."""


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    cluster: str
    broker_name: str
    frame_bytes: int = 256 * 1024  # most record bytes in one data frame (at least one record)
    max_unacked_bytes: int = 4 * 1024 * 1024  # the window: bytes sent past the follower's ack
    heartbeat_interval: float = 1.0  # an idle master sends a heartbeat, the follower acks it
    timeout: float = 10.0  # every network wait (connect, read, drain)
    poll_interval: float = 0.05  # a caught-up master looks for new records this often (or on wake)
    # A moved high-water mark waits this long for a data frame to carry it before a heartbeat
    # does: under load the next frame follows within a millisecond, and a heartbeat per ack
    # (then acked in turn) doubled the frames and wake-ups per batch (bench/compare.py row 3).
    mark_linger: float = 0.005
    retry_interval: float = 1.0  # a follower reconnects after a failed session


@dataclass(frozen=True, slots=True)
class FollowerState:
    replica_id: int
    # CommitLog offset the follower has flushed: from its first ack on (within a heartbeat);
    # until then, its end after the handshake's truncation (what it holds, loaded from its disk).
    acked: int
    sent: int  # CommitLog offset streamed to it so far


def truncation_point(history: Sequence[EpochStart], follower_epoch: int, follower_end: int,
                     master_end: int) -> int | None:
    """Where a follower that knows ``follower_epoch`` and ends at ``follower_end`` must cut its log
    (None: nothing to cut): the start of the first epoch after its own, if its log goes past it
    (it may hold records its old master never got to us), and never past our end."""
    cut = follower_end
    for e in sorted(history, key=lambda e: e.epoch):
        if e.epoch > follower_epoch:
            cut = min(cut, e.start)
            break
    cut = min(cut, master_end)
    return cut if cut < follower_end else None


@dataclass(slots=True)
class _Stream:
    """Where a master's stream to one follower stands."""
    link: FrameLink
    pos: int  # the CommitLog offset streamed up to
    sent_mark: int  # the high-water mark the follower last heard
    idle_since: float  # when the last frame went out
    heard: float  # when the follower's last ack came

    def sent(self, frame: Data, now: float) -> None:
        self.pos, self.sent_mark, self.idle_since = frame.end, frame.high_water, now


class _MasterLink(FrameLink):
    """A master's end of a follower's connection: tells the master once it is made."""

    def __init__(self, accepted: Callable[[FrameLink], None]) -> None:
        super().__init__()
        self._accepted = accepted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._accepted(self)


class ReplicationMaster:
    """Serves the CommitLog of ``store`` to followers on the HA port, in epoch ``epoch``."""

    def __init__(self, store: MessageStore, config: ReplicationConfig, epoch: int,
                 history: Sequence[EpochStart], on_change: Callable[[], None] | None = None,
                 high_water: Callable[[], int] | None = None) -> None:
        self.store = store
        self.config = config
        self.epoch = epoch
        self.history = tuple(history)
        # Called after every ack and when a follower's session ends: the acknowledgement gate
        # re-reads acked offsets then (ha/replica.py).
        self._on_change = on_change
        self._high_water = high_water  # sent in every frame: followers serve reads below it
        self._server: asyncio.Server | None = None
        self._sessions: set[asyncio.Task[None]] = set()
        self._followers: dict[int, FollowerState] = {}  # connected followers only
        self._owners: dict[int, asyncio.Task[None]] = {}  # the session that owns each follower's state
        # Followers whose session ended (their process stopped or died, the connection broke),
        # until they connect again: the in-sync set drops them at once (ha/replica.py).
        self._ended: set[int] = set()
        self._wake = asyncio.Event()
        self._parked: dict[int, _Stream] = {}  # the streams waiting for news, by replica id
        self._push_due = False  # a coalesced push waits for the end of this loop step
        # The last data frame made (CommitLog offset asked for, frame, its head): the followers
        # streaming from the same offset share one read, one CRC and one encoding of it.
        self._last: tuple[int, Data, bytes] | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on (host, port); returns the port bound (0 picks a free one)."""
        self._server = await asyncio.get_running_loop().create_server(
            functools.partial(_MasterLink, self._accepted), host, port)
        bound: int = self._server.sockets[0].getsockname()[1]
        log.info("replication master of %s/%s (epoch %d) listening on %s:%d",
                 self.config.cluster, self.config.broker_name, self.epoch, host, bound)
        return bound

    def _mark(self) -> int:
        return self._high_water() if self._high_water is not None else -1

    def followers(self) -> dict[int, FollowerState]:
        """Each connected follower's acked and sent offsets, by replica id."""
        return dict(self._followers)

    def ended(self) -> frozenset[int]:
        """Replicas whose session with this master ended and that have not connected since."""
        return frozenset(self._ended)

    def acked_offset(self, replica_id: int) -> int | None:
        state = self._followers.get(replica_id)
        return state.acked if state is not None else None

    async def close(self) -> None:
        """Stop accepting, end every session and wait for them."""
        if self._server is not None:
            self._server.close()
        for t in list(self._sessions):
            t.cancel()
        for t in list(self._sessions):
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _accepted(self, link: FrameLink) -> None:
        """A follower connected: its session runs in a task of its own."""
        task = asyncio.get_running_loop().create_task(self._serve(link))
        self._sessions.add(task)

    async def _serve(self, link: FrameLink) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = link.transport.get_extra_info("peername") if link.transport is not None else None
        try:
            await self._session(link, task)
        except (ReplicationError, protocol.ReplicationCodecError, StoreError) as exc:
            log.warning("replication session with %s ended: %s", peer, exc)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.info("replication session with %s ended: %r", peer, exc)
        finally:
            self._sessions.discard(task)
            for replica, owner in list(self._owners.items()):
                if owner is task:  # not a newer session of the same replica
                    del self._owners[replica]
                    self._followers.pop(replica, None)
                    self._ended.add(replica)
                    self._changed()
            await link.close()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    async def _refuse(self, link: FrameLink, reason: str) -> None:
        await link.send(Refusal(reason), self.config.timeout)
        raise ReplicationError(reason)

    async def _session(self, link: FrameLink, task: asyncio.Task[None]) -> None:
        cfg = self.config
        hello = await link.next_frame(cfg.timeout)
        if not isinstance(hello, Handshake):
            raise ReplicationError(f"expected a handshake, got {type(hello).__name__}")
        if (hello.cluster, hello.broker_name) != (cfg.cluster, cfg.broker_name):
            await self._refuse(link, f"this is the master of {cfg.cluster}/{cfg.broker_name}, not of "
                                       f"{hello.cluster}/{hello.broker_name}; check --cluster and --broker-name")
        if hello.epoch > self.epoch:
            await self._refuse(link, f"replica {hello.replica_id} knows epoch {hello.epoch}, newer than "
                                       f"this master's {self.epoch}: this master is stale")
        store = self.store
        end = store.commitlog_max_offset
        cut = truncation_point(self.history, hello.epoch, hello.log_end, end)
        start = hello.log_end if cut is None else cut
        if start < store.commitlog_min_offset or not store.is_record_boundary(start):
            await self._refuse(link, f"replica {hello.replica_id}'s log (end {hello.log_end}, epoch "
                                       f"{hello.epoch}) does not meet this master's log [{store.commitlog_min_offset}, "
                                       f"{end}) at a record boundary; empty its store directory to copy it anew")
        await link.send(Welcome(self.epoch, -1 if cut is None else cut, start, self.history), cfg.timeout)
        log.info("replica %d of %s/%s joined at offset %d (truncated from %d: %s)", hello.replica_id,
                 cfg.cluster, cfg.broker_name, start, hello.log_end, cut is not None)
        state = FollowerState(hello.replica_id, start, start)
        self._ended.discard(hello.replica_id)
        self._followers[hello.replica_id] = state
        self._owners[hello.replica_id] = task
        acked = asyncio.Event()
        now = asyncio.get_running_loop().time()
        at = _Stream(link, start, -1, now, now)  # where this follower's stream stands
        link.handle_frames(functools.partial(self._on_acks, task, hello.replica_id, at, acked))
        tasks = [asyncio.create_task(self._stream(hello.replica_id, at, acked)),
                 asyncio.create_task(link.ended())]
        try:  # either ending (both only end by raising) ends the session
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()
        finally:
            await cancel_and_wait(*tasks)

    async def _stream(self, replica: int, at: _Stream, acked: asyncio.Event) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        link = at.link
        # A follower acks what it appended and, idle, the heartbeats (at most every half
        # interval): silence past the heartbeat interval plus the timeout means it is gone.
        silence = cfg.heartbeat_interval + cfg.timeout
        mark_due = 0.0  # when a moved mark goes out in a heartbeat if no data frame carries it
        while True:
            if loop.time() - at.heard > silence:
                raise TimeoutError(f"replica {replica} sent no ack for {silence:g} s")
            state = self._followers[replica]
            if at.pos - state.acked >= cfg.max_unacked_bytes:
                acked.clear()
                async with asyncio.timeout(cfg.timeout):  # a follower that stops acking is dropped
                    await acked.wait()
                continue
            frame, head = self._data(at.pos)
            if frame.records:
                # Hot path (bench/compare.py --replicated, row 3): head and records go out as two
                # buffers, the records as read from the CommitLog.
                link.write_parts((head, frame.records))
                await link.drained(cfg.timeout)
                at.sent(frame, loop.time())
                self._followers[replica] = FollowerState(replica, state.acked, at.pos)
                continue
            at.pos = frame.offset
            mark = self._mark()
            now = loop.time()
            if mark <= at.sent_mark:
                mark_due = 0.0
            elif not mark_due:
                mark_due = now + cfg.mark_linger
            if now - at.idle_since >= cfg.heartbeat_interval or (mark_due and now >= mark_due):
                # Idle, or the mark moved since this follower last heard it (acks from the
                # others) and no data frame carried it within the linger: a heartbeat, so its
                # consumers see what is now acknowledged.
                await link.send(Heartbeat(self.epoch, self.store.commitlog_max_offset, mark), cfg.timeout)
                at.sent_mark, mark_due = mark, 0.0
                at.idle_since = now = loop.time()
            # Parked until news: ``wake`` writes new records to a parked stream itself (at the
            # put, before the master dispatches them) and wakes it only when it cannot.
            self._wake.clear()
            self._parked[replica] = at
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(cfg.poll_interval, mark_due - now) if mark_due else cfg.poll_interval):
                        await self._wake.wait()
            finally:
                if self._parked.get(replica) is at:
                    del self._parked[replica]

    def wake(self) -> None:
        """New records were stored: stream them now rather than at the next poll. Hot path
        (bench/compare.py --replicated, rows 1-3): a follower's stream parked for news gets its
        frame written here, within the caller's step (the store calls this once a put is in the
        CommitLog, before it dispatches it), with no task wake-up, when the follower has all
        it was sent acked; news for a follower with frames in flight wait for the end of this
        loop step, so one frame carries all the puts of the step (fewer frames, reads and acks
        per message under load: bench/compare.py --replicated, rows 2 and 3). A stream that is
        busy, has a full window or a buffer not yet drained is woken to do it itself."""
        self._push(True)

    def _push(self, coalesce: bool) -> None:
        if coalesce and self._push_due:
            return  # the push at the end of this step takes these news too
        if not self._parked:
            self._wake.set()
            return
        end = self.store.commitlog_max_offset
        max_unacked = self.config.max_unacked_bytes
        now = -1.0
        for replica, at in list(self._parked.items()):
            if at.pos >= end:
                continue
            state = self._followers.get(replica)
            link = at.link
            if state is None or at.pos - state.acked >= max_unacked or link.closing() or link.buffered():
                self._wake.set()
                continue
            if coalesce and at.pos > state.acked:
                if not self._push_due:
                    self._push_due = True
                    asyncio.get_running_loop().call_soon(self._push_later)
                continue
            try:
                frame, head = self._data(at.pos)
            except StoreError:
                self._wake.set()  # the stream meets it again and ends the session
                continue
            if frame.records:
                link.write_parts((head, frame.records))
                if now < 0:
                    now = asyncio.get_running_loop().time()
                at.sent(frame, now)
                self._followers[replica] = FollowerState(replica, state.acked, at.pos)

    def _push_later(self) -> None:
        self._push_due = False
        self._push(False)

    def _data(self, pos: int) -> tuple[Data, bytes]:
        """The data frame streaming from CommitLog offset ``pos`` (no records: nothing there yet;
        its offset is where the next record will be) and its head."""
        last = self._last
        if last is not None and last[0] == pos:
            return last[1], last[2]
        cfg = self.config
        at, data = self.store.read_commitlog(pos, min(cfg.frame_bytes, cfg.max_unacked_bytes))
        frame = Data(self.epoch, at, data, self._mark())
        if not data:
            return frame, b""
        head = protocol.data_head(frame)
        self._last = (pos, frame, head)
        return frame, head

    def _on_acks(self, session: asyncio.Task[None], replica: int, at: _Stream, acked: asyncio.Event,
                 frames: list[Frame]) -> None:
        """The frames one read brought from follower ``replica``, in the connection's callback
        (hot path: bench/compare.py --replicated, rows 1-3): the acknowledgement gate hears of
        them at once and answers the sends they complete in this loop step. Raising ends the
        session."""
        state = self._followers.get(replica)
        if state is None or self._owners.get(replica) is not session:
            raise ReplicationError(f"replica {replica} connected again; this older session ends")
        offset = state.acked
        for frame in frames:
            if not isinstance(frame, Ack):
                raise ReplicationError(f"replica {replica} sent {type(frame).__name__}; only acks are expected")
            if not offset <= frame.offset <= state.sent:
                raise ReplicationError(f"replica {replica} acked offset {frame.offset} outside "
                                       f"[{offset}, {state.sent}]")
            offset = frame.offset
        self._followers[replica] = FollowerState(replica, offset, state.sent)
        at.heard = asyncio.get_running_loop().time()
        acked.set()
        self._changed()


@dataclass(slots=True)
class _Heard:
    """When a follower last heard its master, and last acked."""
    at: float
    acked_at: float


async def _connect(loop: asyncio.AbstractEventLoop, host: str, port: int) -> FrameLink:
    """A connection to the first address of ``host`` that accepts one. ConnectionRefusedError
    when every address refused: the proof a deposition rests on, which Python 3.11's
    create_connection loses for a name with several addresses (a dual-stack pod's: it raises a
    bare OSError for them all)."""
    errors: list[OSError] = []
    for family, kind, proto, _name, address in await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            errors.append(exc)
            continue
        except BaseException:
            sock.close()
            raise
        _, link = await loop.create_connection(FrameLink, sock=sock)
        return link
    if errors and all(isinstance(e, ConnectionRefusedError) for e in errors):
        raise ConnectionRefusedError(f"every address of {host}:{port} refused the connection")
    if len(errors) == 1:
        raise errors[0]
    raise OSError(f"no address of {host}:{port} accepted a connection: " + "; ".join(map(str, errors)))


class ReplicationFollower:
    """Replicates the CommitLog of the master at ``master`` (host, port) into ``store``."""

    def __init__(self, store: MessageStore, config: ReplicationConfig, replica_id: int, epoch: int,
                 master: tuple[str, int], history: EpochHistory | None = None,
                 ack_flushed: bool = True, on_high_water: Callable[[int], None] | None = None,
                 truncate: Callable[[int], Awaitable[None]] | None = None,
                 on_refused: Callable[[int], None] | None = None) -> None:
        self.store = store
        self.config = config
        self.replica_id = replica_id
        self.epoch = epoch  # the newest epoch this replica knows; never goes down
        self.master = master
        # This log's epoch history (persisted); without one (tests), ``epoch`` is also the epoch
        # of the log's last record.
        self.history = history
        # Ack what is flushed to disk (SYNC_FLUSH brokers), else what is appended: the page
        # cache survives a killed process, as Kafka's followers count on.
        self.ack_flushed = ack_flushed
        self.acked = -1  # the last offset acked to the master
        self.high_water = -1  # the master's high-water mark, as last heard (-1: not yet)
        self.on_high_water = on_high_water
        # Cuts the log at the handshake's truncation point: the store's truncate, or a replicated
        # broker's (which also undoes the metadata changes of the cut tail).
        self.truncate = truncate or store.truncate
        # The epoch of the last Welcome from ``master`` (None: never welcomed there): once that
        # address refuses connections, ``on_refused(welcomed)`` (a master's replication listener
        # closes only when its process ends or it leaves the master role: proof it is gone).
        self.welcomed: int | None = None
        self.on_refused = on_refused
        self._welcomes = 0  # sessions welcomed so far
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Run sessions until ``close``, reconnecting after each failure."""
        self._task = asyncio.create_task(self._run(), name=f"tidemq-replica-{self.replica_id}")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        quick_at = float("-inf")  # when the last immediate retry was made
        while True:
            welcomed_before = self._welcomes
            try:
                await self.run_session()
            except ConnectionRefusedError as exc:
                log.info("replication from %s:%d refused: %r", *self.master, exc)
                # Proof that the master welcomed at ``welcomed`` is gone, from a replica that
                # held all it had heard was acknowledged (an emptied replica catching up does not
                # count).
                if self.welcomed is not None and self.on_refused is not None and \
                        self.store.commitlog_max_offset >= self.high_water:
                    self.on_refused(self.welcomed)
            except (ReplicationError, protocol.ReplicationCodecError, StoreError) as exc:
                log.warning("replication from %s:%d stopped: %s", *self.master, exc)
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                log.info("replication from %s:%d interrupted: %r", *self.master, exc)
            # A session that was welcomed is retried at once when it breaks (at most once per
            # retry interval): a refusal then tells the replica its master is gone without
            # waiting for its lease.
            now = loop.time()
            if self._welcomes != welcomed_before and now - quick_at >= self.config.retry_interval:
                quick_at = now
                continue
            await asyncio.sleep(self.config.retry_interval)

    async def run_session(self) -> None:
        """One connection: handshake, truncation, then frames until it breaks (raises why)."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(cfg.timeout):
            link = await _connect(loop, *self.master)
        try:
            store = self.store
            end = store.commitlog_max_offset
            log_epoch = self.history.epoch_at(end) if self.history is not None else self.epoch
            await link.send(Handshake(cfg.cluster, cfg.broker_name, self.replica_id, log_epoch,
                                      store.commitlog_max_offset), cfg.timeout)
            answer = await link.next_frame(cfg.timeout)
            if isinstance(answer, Refusal):
                raise ReplicationError(f"the master refused: {answer.reason}")
            if not isinstance(answer, Welcome):
                raise ReplicationError(f"expected the master's welcome, got {type(answer).__name__}")
            if answer.epoch < self.epoch:
                raise ReplicationError(f"the master is at epoch {answer.epoch}, older than {self.epoch} "
                                       f"that this replica knows: it is stale")
            self.epoch = self.welcomed = answer.epoch
            self._welcomes += 1
            if answer.truncate_at >= 0:
                log.warning("replica %d truncates its commitlog from %d to %d to follow epoch %d",
                            self.replica_id, store.commitlog_max_offset, answer.truncate_at, answer.epoch)
                await self.truncate(answer.truncate_at)
            else:  # a cut an earlier session made and could not finish (a rebuild that failed)
                await store.finish_cut()
            if answer.stream_from != store.commitlog_max_offset:
                raise ReplicationError(f"the master streams from {answer.stream_from} but this log ends at "
                                       f"{store.commitlog_max_offset}")
            if self.history is not None:  # before any record of the master's is appended
                self.history.adopt(answer.history)
            await self._follow(link, answer.epoch)
        finally:
            await link.close()

    async def _follow(self, link: FrameLink, epoch: int) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        wait = cfg.heartbeat_interval + cfg.timeout  # the master is gone if silent past this
        if self.ack_flushed:
            await self._follow_flushed(link, epoch, wait)
            return
        # Acking what is appended (ASYNC_FLUSH): the frames of each read are appended and acked
        # in the connection's callback (hot path: bench/compare.py --replicated, rows 1-3), and
        # this task only watches for the master's silence and the connection's end.
        heard = _Heard(loop.time(), -cfg.heartbeat_interval)
        link.handle_frames(functools.partial(self._on_frames, link, epoch, heard))
        while True:
            left = heard.at + wait - loop.time()
            if left <= 0:
                raise TimeoutError(f"the master sent nothing for {wait:g} s")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await link.ended()  # raises why it ended

    def _append(self, frames: list[Frame], epoch: int, dispatch: bool) -> int:
        """Append the data frames of ``frames`` (checked: the session's epoch, whole records at
        this log's end); the highest high-water mark they carry. Frames before a bad one stay."""
        store = self.store
        mark = self.high_water
        try:
            for frame in frames:
                if isinstance(frame, Data):
                    if frame.epoch != epoch:
                        raise ReplicationError(f"a data frame of epoch {frame.epoch} in a session of epoch {epoch}")
                    store.append_replicated(frame.offset, frame.records, dispatch=dispatch)
                elif isinstance(frame, Heartbeat):
                    if frame.epoch != epoch:
                        raise ReplicationError(f"a heartbeat of epoch {frame.epoch} in a session of epoch {epoch}")
                else:
                    raise ReplicationError(f"unexpected {type(frame).__name__} from the master")
                if frame.high_water > mark:
                    mark = frame.high_water
        except OSError as exc:  # this replica's disk (full, failing): said as such, not as a network error
            store.dispatch_replicated()
            raise StoreError(f"replica {self.replica_id} cannot store the master's records: {exc}; free space "
                             "under its --store (it reconnects and catches up once it can)") from exc
        except BaseException:
            store.dispatch_replicated()  # the frames before the bad one stay, dispatched
            raise
        return mark

    def _learn(self, mark: int) -> None:
        if mark > self.high_water:
            self.high_water = mark
            if self.on_high_water is not None:
                self.on_high_water(mark)

    def _on_frames(self, link: FrameLink, epoch: int, heard: _Heard, frames: list[Frame]) -> None:
        """The frames of one read, in the connection's callback: appended, one ack for them all
        written (when the end moved, or as a keepalive), and only then dispatched (consume
        queue, index, listeners): the master's wait, and so its sender's, does not include
        this replica's dispatch. Raising ends the session (ha/link.py)."""
        mark = self._append(frames, epoch, False)
        now = asyncio.get_running_loop().time()
        heard.at = now
        acked = self.store.commitlog_max_offset  # never more than this log holds
        if (acked != self.acked or now - heard.acked_at >= self.config.heartbeat_interval / 2) \
                and not link.closing():
            self.acked, heard.acked_at = acked, now
            link.write(Ack(acked))
        self.store.dispatch_replicated()
        self._learn(mark)

    async def _follow_flushed(self, link: FrameLink, epoch: int, wait: float) -> None:
        """Acking what is flushed (SYNC_FLUSH): each read's frames appended and dispatched, the
        CommitLog flushed, then one ack, in this task (a flush is awaited)."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        # An ack only for news (a new offset), or to say it is alive: the master drops a follower
        # silent past its heartbeat interval plus its timeout.
        keepalive = cfg.heartbeat_interval / 2
        acked_at = -keepalive
        while True:
            mark = self._append(await link.frames(wait), epoch, True)
            acked = await self.store.flush_commitlog()  # never more than is on disk
            now = loop.time()
            if acked != self.acked or now - acked_at >= keepalive:
                self.acked, acked_at = acked, now
                link.write(Ack(acked))
            self._learn(mark)
            await link.drained(cfg.timeout)
