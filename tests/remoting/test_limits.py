"""Server limits in-process (tidemq.remoting.limits + RemotingServer), the client's SYSTEM_BUSY
back-off, and bounded inflation of compressed bodies (research matrix rows H4, H5, H7)."""

from __future__ import annotations

import asyncio
import logging
import struct
import subprocess
import sys
import zlib

import pytest

from tests.client.fake_server import fake_config, fake_fixture
from tests.remoting.hostile import closed_within, read_frame, request
from tidemq.client import Producer
from tidemq.client.fault import BUSY_BACKOFF_MAX, busy_backoff
from tidemq.client.send import SendStatus
from tidemq.errors import CodecError, ConfigError
from tidemq.message import MAX_INFLATED, Message, SysFlag, decode_records, encode_record, inflate
from tidemq.remoting import RemotingCommand, RemotingServer, RequestCode, ResponseCode
from tidemq.remoting.limits import BufferBudget, RateLimitedLog, ServerLimits

fake = fake_fixture()  # the in-memory name server + broker of the client tests


class _Holder:
    def __init__(self) -> None:
        self.resumed = 0

    def _budget_resume(self) -> None:
        self.resumed += 1


def test_budget_charges_only_bytes_beyond_the_free_allowance_and_wakes_waiters():
    b = BufferBudget(limit=1000, free_per_connection=100)
    h1, h2 = _Holder(), _Holder()
    assert b.charge(h1, 0, 100) == (0, False) and b.used == 0
    c1, pause = b.charge(h1, 0, 900)
    assert (c1, pause, b.used) == (800, False, 800)
    c2, pause = b.charge(h2, 0, 500)
    assert (c2, pause, b.used) == (400, True, 1200) and h2 in b.waiting
    c1, pause = b.charge(h1, c1, 0)  # h1's frame completed
    assert (c1, pause, b.used, h2.resumed) == (0, False, 400, 1)
    b.release(h2, c2)
    assert b.used == 0 and not b.waiting and b.peak == 1200


def test_limits_are_validated():
    with pytest.raises(ConfigError):
        ServerLimits(idle_timeout=-1)
    with pytest.raises(ConfigError):
        ServerLimits(max_ext_fields=0)


def test_rate_limited_log_summarises_what_it_drops(caplog):
    now = [0.0]
    rl = RateLimitedLog(logging.getLogger("test.rl"), burst=3, interval=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "test.rl"):
        for i in range(100):
            rl.log(logging.WARNING, "bad peer %d", i)
        now[0] = 11.0
        rl.log(logging.WARNING, "bad peer %d", 100)
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["bad peer 0", "bad peer 1", "bad peer 2", "97 similar messages suppressed in the last 10 s",
                    "bad peer 100"]


class _Echo:
    def handle(self, conn, cmd: RemotingCommand):
        return cmd.response(ResponseCode.SUCCESS, None, {"n": len(cmd.ext_fields)})

    def connection_lost(self, conn) -> None:
        pass


def _serve(limits: ServerLimits):
    async def start():
        server = RemotingServer(_Echo(), limits=limits)
        host, port = await server.start("127.0.0.1", 0)
        return server, host, port
    return start()


async def test_idle_connections_are_aborted_but_busy_ones_are_not():
    server, host, port = await _serve(ServerLimits(idle_timeout=1.0))
    try:
        idle_r, _idle_w = await asyncio.open_connection(host, port)
        half_r, half_w = await asyncio.open_connection(host, port)
        half_w.write(struct.pack(">iI", 1000, 20) + b"{")  # half a frame, then silence
        chatty_r, chatty_w = await asyncio.open_connection(host, port)

        async def chat():
            for i in range(30):
                chatty_w.write(request(RequestCode.GET_BROKER_CONFIG, opaque=i))
                assert (await read_frame(chatty_r, 5.0)).opaque == i
                await asyncio.sleep(0.1)

        chatting = asyncio.create_task(chat())
        # closed after 1.0-1.5 s (the sweep runs every timeout/4); generous for a loaded box
        assert await closed_within(idle_r, 5.0)
        assert await closed_within(half_r, 5.0)
        await chatting  # >= 3 s (3x the timeout) of traffic every 0.1 s: never idle
        assert server.idle_closed == 2 and len(server.connections) == 1
    finally:
        await server.stop()


async def test_connection_cap_and_ext_fields_cap():
    server, host, port = await _serve(ServerLimits(max_connections=2, max_ext_fields=10))
    try:
        a = await asyncio.open_connection(host, port)
        b = await asyncio.open_connection(host, port)
        c_r, _c_w = await asyncio.open_connection(host, port)
        assert await closed_within(c_r, 1.0)
        assert server.refused == 1
        r, w = a
        w.write(request(RequestCode.SEND_MESSAGE_V2, opaque=1, **{f"k{i}": i for i in range(11)}))
        w.write(request(RequestCode.SEND_MESSAGE_V2, opaque=2, **{f"k{i}": i for i in range(10)}))
        first, second = await read_frame(r, 1.0), await read_frame(r, 1.0)
        assert first.code == ResponseCode.SYSTEM_ERROR and "11 extFields" in first.remark
        assert second.code == ResponseCode.SUCCESS and second.ext_fields["n"] == "10"
        b[1].close()
    finally:
        await server.stop()


async def test_a_connection_over_the_budget_stops_being_read_until_room_is_made():
    server, host, port = await _serve(ServerLimits(max_buffered_bytes=256 * 1024, free_buffer_bytes=1024,
                                                   idle_timeout=1.6))
    try:
        big_r, big_w = await asyncio.open_connection(host, port)
        big_w.transport.set_write_buffer_limits(high=16 * 1024)
        big_w.write(struct.pack(">iI", 16 * 1024 * 1024, 20) + b"\0" * (15 * 1024 * 1024))
        with pytest.raises(asyncio.TimeoutError):  # more than the kernel's socket buffers hold
            await asyncio.wait_for(big_w.drain(), 1.0)
        budget = server.budget
        assert budget.pauses >= 1 and len(budget.waiting) == 1
        held = budget.used
        assert 256 * 1024 < held < 256 * 1024 + 1024 * 1024  # the budget plus at most a few reads
        # a small request on another connection is still served
        r, w = await asyncio.open_connection(host, port)
        w.write(request(RequestCode.GET_BROKER_CONFIG, opaque=5))
        assert (await read_frame(r, 1.0)).code == ResponseCode.SUCCESS
        # A paused connection is not read, so its peer's close is noticed by the idle timeout,
        # which gives its bytes back.
        big_w.transport.abort()
        for _ in range(100):  # up to 10 s for the 1.6 s idle timeout
            await asyncio.sleep(0.1)
            if budget.used == 0:
                break
        assert budget.used == 0 and not budget.waiting and server.idle_closed == 1
    finally:
        await server.stop()


def test_busy_backoff_grows_and_is_capped():
    assert busy_backoff(1, lambda: 1.0) == pytest.approx(0.05)
    assert busy_backoff(1, lambda: 0.0) == pytest.approx(0.025)
    assert busy_backoff(3, lambda: 1.0) == pytest.approx(0.2)
    assert busy_backoff(50, lambda: 1.0) == BUSY_BACKOFF_MAX


@pytest.mark.timeout(20, func_only=True)
async def test_producer_backs_off_and_retries_system_busy_beyond_its_retry_budget(fake):
    fake.topics["T"] = (1, 1, 6)
    async with Producer("pg", config=fake_config(fake, retry_times_when_send_failed=1)) as p:
        fake.fail_next.extend([(RequestCode.SEND_MESSAGE_V2, ResponseCode.SYSTEM_BUSY)] * 4)
        loop = asyncio.get_running_loop()
        t = loop.time()
        r = await p.send(Message("T", b"x"))
        took = loop.time() - t
    assert r.status is SendStatus.SEND_OK
    assert fake.codes().count(RequestCode.SEND_MESSAGE_V2) == 5  # 4 busy answers did not use the budget
    assert took >= 0.025 + 0.05 + 0.1 + 0.2  # backed off (lower bound of the jitter)


def _compressed_record(body: bytes) -> bytes:
    return encode_record(
        topic=b"T", body=zlib.compress(body, 9), properties=b"", queue_id=0, flag=0, queue_offset=0,
        physical_offset=0, sys_flag=int(SysFlag.COMPRESSED), born_timestamp=1, born_host=b"\x7f\0\0\1",
        born_port=1, store_timestamp=1, store_host=b"\x7f\0\0\1", store_port=2)


def test_decompression_bomb_is_refused_by_the_client_decoder():
    assert MAX_INFLATED == 40 * 1024 * 1024
    bomb = _compressed_record(b"\0" * (MAX_INFLATED + 1))  # ~40 KiB on the wire
    assert len(bomb) < 100_000
    with pytest.raises(CodecError, match="inflates beyond"):
        decode_records(bomb)
    ok = _compressed_record(b"a" * 1000)
    assert decode_records(ok)[0].body == b"a" * 1000
    with pytest.raises(CodecError):
        inflate(b"\x78\x9c not zlib")


def test_decompression_bomb_is_refused_by_the_spark_source():
    arrow = pytest.importorskip("tidemq.spark.arrow")
    cols = arrow.Columns()
    with pytest.raises(CodecError, match="inflates beyond"):
        arrow.collect(_compressed_record(b"\0" * (MAX_INFLATED + 1)), cols, 1, None)


_CAP_PROBE = """
import resource, sys
from tidemq.remoting.limits import connection_cap
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
cap, said = connection_cap(int(sys.argv[3]))
print(cap, resource.getrlimit(resource.RLIMIT_NOFILE)[0], said, sep="|")
"""


@pytest.mark.parametrize(("soft", "hard", "requested", "cap", "soft_after", "said"), [
    (1024, 4096, 16_384, 4096 - 512, 4096, "does not fit the open-file limit 4096"),  # soft raised, cap fitted
    (1024, 4096, 300, 300, 4096, "connection cap 300 (open-file limit 4096)"),
    (1024, 1024, 0, 512, 1024, "no connection cap does not fit"),  # 0: the fd limit still bounds it
    (500, 500, 100, 64, 500, "capped at 64"),  # never below 64
])
def test_connection_cap_fits_under_the_open_file_limit(soft, hard, requested, cap, soft_after, said):
    """With more connections than descriptors, accept() fails with EMFILE and the store cannot open
    its next segment: the cap is fitted under the (raised) open-file limit, and says how to lift it."""
    out = subprocess.run([sys.executable, "-c", _CAP_PROBE, str(soft), str(hard), str(requested)],
                         capture_output=True, text=True, check=True).stdout.strip().split("|")
    assert (int(out[0]), int(out[1])) == (cap, soft_after)
    assert said in out[2]
    if cap != requested:
        assert "ulimit -n" in out[2]
