"""A replication connection read as whole frames (issue 17): the follower's end of the HA port.

asyncio's StreamReader copies every byte on its way to a frame three times (into its buffer, out
as bytes, the rest of its buffer moved down) and wakes the reading task once per ``readexactly``;
a follower reading 64-256 KiB data frames that way, and acking each one, spent more per message
on the connection than on appending (docs/benchmarks.md, "Replicated"). :class:`FrameLink` (a
``BufferedProtocol``) receives a data frame's body straight into that frame's own buffer, parses
small frames out of one receive buffer, and hands its reader every frame that arrived since it
last asked (:meth:`FrameLink.frames`). Or, once a session is set up, it hands them to a handler
in the protocol's callback, all the frames of one read at a time (:meth:`FrameLink.handle_frames`):
no task wakes up per read. A master reads its followers' acks so (the sends an ack completes are
answered in that loop step), and an ASYNC_FLUSH follower appends a read's frames and acks them
once, before the master's next frame could even be read.

Invariants: a frame's length is checked (``protocol.decode_head``, MAX_FRAME_BODY) before its
buffer is made; frames are handed over whole, in order, and the frames that arrived before a
failure before the failure; decoded frames waiting for the reader are bounded (reading pauses past
MAX_QUEUED_BYTES); a connection that ends raises ``asyncio.IncompleteReadError`` (as StreamReader
does), a frame that does not decode ``ReplicationCodecError``, frames the handler refuses (a
TideMQError or OSError it raises) that exception, and the connection is closed; the frames decoded
before a failure reach the reader or the handler; every wait takes a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import cast

from tidemq.errors import TideMQError

from tidemq.broker.ha import protocol
from tidemq.broker.ha.protocol import Frame

RECEIVE_BUFFER = 16 * 1024  # small frames are parsed out of this; a larger body gets its own buffer
# Decoded frames not yet taken by the reader: past this, reading pauses (a master sends at most
# its window, 4 MiB by default, past the follower's ack).
MAX_QUEUED_BYTES = 32 * 1024 * 1024

_HEAD = protocol.FRAME_HEAD.size


class FrameLink(asyncio.BufferedProtocol):
    """One connection's incoming frames, for one reading task, and its writes (small frames)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._recv = bytearray(RECEIVE_BUFFER)
        self._carry = 0  # bytes of an incomplete head kept at the start of ``_recv``
        self._body: bytearray | None = None  # the body being received straight into its buffer
        self._kind = protocol.FrameKind.DATA  # the kind of ``_body``
        self._filled = 0  # bytes of ``_body`` received
        self._frames: deque[Frame] = deque()
        self._queued = 0
        self._paused = False
        self._failure: BaseException | None = None  # why no frame follows the queued ones
        self._waiter: asyncio.Future[None] | None = None  # the reader, waiting for a frame
        self._drained: asyncio.Future[None] | None = None  # a writer, waiting for the buffer to empty
        self._write_paused = False
        self._handler: Callable[[list[Frame]], None] | None = None  # takes each read's frames
        loop = asyncio.get_running_loop()
        self._lost = loop.create_future()
        self._ended = loop.create_future()  # set once no frame follows (``_failure`` says why)

    # -- the protocol's side --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport (uvloop's does not derive from asyncio.Transport, so no isinstance)
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None:
            return memoryview(self._body)[self._filled :]
        return memoryview(self._recv)[self._carry :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._failure is not None:
            return  # refused already: the transport is closing, nothing more is decoded
        try:
            if self._body is not None:
                self._filled += nbytes
                if self._filled == len(self._body):
                    body, self._body = self._body, None
                    self._queue(protocol.decode_body(self._kind, body))
            else:
                self._parse(self._carry + nbytes)
        except protocol.ReplicationCodecError as exc:
            self._end(exc)
        if self._handler is not None and self._frames:
            self._hand_over(self._handler)

    def _hand_over(self, handler: Callable[[list[Frame]], None]) -> None:
        frames = list(self._frames)
        self._frames.clear()
        self._queued = 0
        try:
            handler(frames)
        except (TideMQError, OSError) as exc:  # refused (ReplicationError, StoreError): it ends
            self._end(exc)

    def _end(self, exc: BaseException) -> None:
        self._fail(exc)
        if self.transport is not None:
            self.transport.close()

    def _parse(self, end: int) -> None:
        """Decode the frames in ``_recv[:end]``; keep an incomplete head, start an incomplete body."""
        buf = self._recv
        mv = memoryview(buf)
        p = 0
        while end - p >= _HEAD:
            kind, length = protocol.decode_head(buf[p : p + _HEAD])
            p += _HEAD
            if end - p >= length:
                self._queue(protocol.decode_body(kind, bytearray(mv[p : p + length])))
                p += length
                continue
            body = bytearray(length)  # decode_head bounded ``length``
            have = end - p
            body[:have] = mv[p:end]
            self._body, self._kind, self._filled = body, kind, have
            self._carry = 0
            return
        self._carry = end - p
        if self._carry:
            buf[: self._carry] = mv[p:end]

    def _queue(self, frame: Frame) -> None:
        self._frames.append(frame)
        self._queued += len(frame.records) if isinstance(frame, protocol.Data) else _HEAD
        if (self._queued > MAX_QUEUED_BYTES and not self._paused and self._handler is None
                and self.transport is not None):  # a handler takes them within this callback
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
            self._ended.set_result(None)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def eof_received(self) -> bool | None:
        return None  # the transport closes; connection_lost says how the stream ended

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            partial = bytes(self._body[: self._filled]) if self._body is not None else bytes(self._recv[: self._carry])
            expected = len(self._body) if self._body is not None else _HEAD
            exc = asyncio.IncompleteReadError(partial, expected)
        self._fail(exc)
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("the replication connection closed"))
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -- the reader's side ----------------------------------------------------------------

    async def frames(self, timeout: float) -> list[Frame]:
        """Every frame received and not yet taken (at least one), oldest first; raises why the
        connection ended once none is left, TimeoutError after ``timeout`` s without a frame."""
        if not self._frames:
            if self._failure is not None:
                raise self._failure
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout):
                    await self._waiter
            finally:
                self._waiter = None
            if not self._frames:
                assert self._failure is not None  # only a frame or a failure wakes the reader
                raise self._failure
        out = list(self._frames)
        self._frames.clear()
        self._queued = 0
        if self._paused and self.transport is not None and self._failure is None:
            self._paused = False
            self.transport.resume_reading()
        return out

    async def next_frame(self, timeout: float) -> Frame:
        """The oldest frame not yet taken (the handshake's answer; later frames stay queued)."""
        if not self._frames:
            frames = await self.frames(timeout)
            self._frames.extend(frames[1:])
            self._queued = sum(len(f.records) if isinstance(f, protocol.Data) else _HEAD for f in self._frames)
            return frames[0]
        frame = self._frames.popleft()
        self._queued -= len(frame.records) if isinstance(frame, protocol.Data) else _HEAD
        return frame

    def handle_frames(self, handler: Callable[[list[Frame]], None]) -> None:
        """From now on, call ``handler`` with the frames of each read, oldest first (those
        already queued now), in the protocol's callback: no reading task. A TideMQError or
        OSError it raises ends the connection (:meth:`ended` raises it)."""
        self._handler = handler
        if self._frames:
            self._hand_over(handler)
        if self._paused and self.transport is not None and self._failure is None:
            self._paused = False
            self.transport.resume_reading()

    async def ended(self) -> None:
        """Wait until no frame follows; raises why (the connection's end, a frame that did not
        decode, the handler's refusal)."""
        await asyncio.shield(self._ended)
        assert self._failure is not None
        raise self._failure

    async def send(self, frame: Frame, timeout: float) -> None:
        """Write ``frame``; wait (at most ``timeout`` s) while the transport's buffer is full."""
        self.write(frame)
        await self.drained(timeout)

    def write(self, frame: Frame) -> None:
        """Write ``frame`` now, without waiting (``drained`` waits for the buffer)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the replication connection is closed")
        transport.write(protocol.encode(frame))

    def write_parts(self, parts: tuple[bytes, bytes | memoryview]) -> None:
        """Write a frame given as its head and body (a data frame's records as read from the
        CommitLog), without waiting."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the replication connection is closed")
        transport.writelines(parts)

    def buffered(self) -> int:
        """Bytes written and not yet sent (0: the transport's buffer is empty)."""
        transport = self.transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    async def drained(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) while the transport's buffer is full."""
        if self._write_paused:
            self._drained = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout):
                    await self._drained
            finally:
                self._drained = None

    async def close(self) -> None:
        """Close the connection and wait (at most 1 s) until it is gone."""
        if self.transport is not None:
            self.transport.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await asyncio.shield(self._lost)
