"""The per-frame read deadline in-process (ServerLimits.frame_read_timeout, RemotingServer): a frame
must arrive whole within the deadline of its first byte; time between frames does not count, nor
does time a connection spends paused by the buffer budget."""

from __future__ import annotations

import asyncio
import logging
import struct
import time

from tests.remoting.hostile import closed_within, read_frame, request
from tidemq.remoting import RemotingCommand, RemotingServer, RequestCode, ResponseCode
from tidemq.remoting.limits import ServerLimits


class _Echo:
    def handle(self, conn, cmd: RemotingCommand):
        return cmd.response(ResponseCode.SUCCESS, None, {"n": len(cmd.ext_fields)})

    def connection_lost(self, conn) -> None:
        pass


async def _serve(limits: ServerLimits) -> tuple[RemotingServer, str, int]:
    server = RemotingServer(_Echo(), limits=limits)
    host, port = await server.start("127.0.0.1", 0)
    return server, host, port


def _ping(opaque: int, body: int = 0) -> bytes:
    """A GET_BROKER_CONFIG frame, with ``body`` bytes of body to make it longer."""
    frame = request(RequestCode.GET_BROKER_CONFIG, opaque=opaque)
    return struct.pack(">i", len(frame) - 4 + body) + frame[4:] + b"p" * body


async def test_a_frame_trickling_in_is_closed_at_the_deadline_while_others_are_served(caplog):
    frame = _ping(1, body=200)  # 12 s at 20 bytes a second

    with caplog.at_level(logging.WARNING, "tidemq.remoting.transport"):
        server, host, port = await _serve(ServerLimits(idle_timeout=10.0, frame_read_timeout=0.6))
        try:
            slow_r, slow_w = await asyncio.open_connection(host, port)
            good_r, good_w = await asyncio.open_connection(host, port)
            sent = 0

            async def drip():
                nonlocal sent
                for b in frame:
                    if slow_w.is_closing():
                        return
                    slow_w.write(bytes([b]))
                    sent += 1
                    await asyncio.sleep(0.05)

            dripping = asyncio.create_task(drip())
            t = time.perf_counter()
            served = 0
            while not await closed_within(slow_r, 0.05):
                good_w.write(_ping(served))
                resp = await read_frame(good_r, 2.0)
                assert resp is not None and resp.opaque == served
                served += 1
                assert time.perf_counter() - t < 5.0, "the dripping connection is still open after 5 s"
            took = time.perf_counter() - t
            dripping.cancel()
            assert 0.5 <= took < 3.0, took
            assert sent < len(frame)
            assert served >= 3 and server.slow_frames_closed == 1 and server.idle_closed == 0
            good_w.write(_ping(99))
            assert (await read_frame(good_r, 2.0)).opaque == 99
        finally:
            await server.stop()
    lines = [r.getMessage() for r in caplog.records if "frame read timeout" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"of {len(frame)} bytes of a frame arrived in" in lines[0], lines[0]


async def test_a_peer_silent_mid_frame_is_closed_by_the_sweep():
    server, host, port = await _serve(ServerLimits(idle_timeout=10.0, frame_read_timeout=0.4))
    try:
        r, w = await asyncio.open_connection(host, port)
        w.write(struct.pack(">iI", 1000, 20) + b'{"code":10')  # then nothing
        t = time.perf_counter()
        assert await closed_within(r, 3.0)
        took = time.perf_counter() - t
        assert 0.3 <= took < 2.0, took
        await asyncio.sleep(0.05)
        assert server.slow_frames_closed == 1 and not server.connections
    finally:
        await server.stop()


async def test_time_between_frames_and_frames_split_across_reads_within_the_deadline_are_fine():
    server, host, port = await _serve(ServerLimits(idle_timeout=10.0, frame_read_timeout=0.5))
    try:
        r, w = await asyncio.open_connection(host, port)
        w.write(_ping(1))
        assert (await read_frame(r, 2.0)).opaque == 1
        await asyncio.sleep(0.8)  # idle between frames: longer than the deadline
        one, two = _ping(2), _ping(3)
        # frame 2 arrives in two reads 0.35 s apart; the second read also starts frame 3, whose
        # deadline counts from that read, not from frame 2's first byte (0.7 s before it ends)
        w.write(one[:10])
        await asyncio.sleep(0.35)
        w.write(one[10:] + two[:10])
        assert (await read_frame(r, 2.0)).opaque == 2
        await asyncio.sleep(0.35)
        w.write(two[10:])
        assert (await read_frame(r, 2.0)).opaque == 3
        assert not await closed_within(r, 0.3)
        assert server.slow_frames_closed == 0
    finally:
        await server.stop()


async def test_time_paused_by_the_buffer_budget_does_not_count():
    """B's incomplete frame holds most of the budget; A's pushes it over, so A stops being read
    until B is closed by the deadline. A then completes its frame in two late writes: in time if
    the pause is not counted, more than 0.6 s after its first byte if it were."""
    server, host, port = await _serve(ServerLimits(idle_timeout=10.0, frame_read_timeout=0.6,
                                                   max_buffered_bytes=1000, free_buffer_bytes=0))
    try:
        b_r, b_w = await asyncio.open_connection(host, port)
        a_r, a_w = await asyncio.open_connection(host, port)
        b_w.write(struct.pack(">iI", 5000, 20) + b"{" * 892)  # 900 bytes of a 5004-byte frame
        await asyncio.sleep(0.1)
        frame = _ping(7, body=300)
        a_w.write(frame[:200])  # 1,100 bytes charged: over the budget, A is paused
        assert await closed_within(b_r, 3.0)
        assert server.budget.pauses >= 1
        await asyncio.sleep(0.1)  # A is read again
        a_w.write(frame[200:300])
        await asyncio.sleep(0.2)
        a_w.write(frame[300:])
        resp = await read_frame(a_r, 2.0)
        assert resp is not None and resp.opaque == 7, "A was closed: the paused time counted"
        assert server.slow_frames_closed == 1
    finally:
        await server.stop()
