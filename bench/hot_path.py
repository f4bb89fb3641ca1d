"""The broker's send hot path in one process, without sockets: CPU per message, and its profile.

A real Broker (store in a temporary directory, ASYNC_FLUSH, 256 MiB segments) gets encoded
SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE frames straight into a remoting Connection whose transport
only counts writes, so the figure is the broker's own Python work per message: frame and header
decoding, the send processor, the store append (CommitLog, consume queue, index), the response
encoding, and metrics. Socket syscalls, event-loop wake-ups and the client are not in it (compare
with bench/compare.py's "broker CPU s per M msgs", which has all of them).

    .venv/bin/python bench/hot_path.py [--messages 20000] [--size 1024] [--profile 25]

Workloads: ``single`` (one frame per data_received: a request at a time), ``pipelined`` (64
frames per data_received, as 256 in flight arrive), ``batch`` (SEND_BATCH_MESSAGE of 64).
``--profile N`` reruns each under cProfile and prints the N functions with the most own time
(cProfile slows Python code about 3x; read its figures as shares, not as microseconds).

``--remoting`` runs only the remoting part of a send, in-process: a Connection whose handler decodes
the send header and answers with a send's response header (frame split, JSON header decode, send
header decode, response, encode, write), no broker behind it: what tidemq.remoting costs per request.

``--loop`` measures what the sockets and the event loop add (issue 19, "the loop"): the same
Broker serves its real port, and a client process (a blocking socket, frames encoded in advance,
one request in flight, as bench/compare.py row 1) sends SEND_MESSAGE_V2s; the figure is the
broker process's CPU (all threads, user + system) per send. ``echo`` is the floor: an asyncio
Protocol on the same loop that answers each frame with a fixed response, nothing else.

    .venv/bin/python bench/hot_path.py --loop [--messages 20000] [--profile 25] [--flush sync]

``--flush sync`` runs the broker with SYNC_FLUSH (every send answered after the group commit's
fdatasync covers it, bench/compare.py's sync rows); the figures then include the flush (its
fdatasync's CPU, the flush thread, the answer's wake-ups). Each run also prints the store's flush
rounds per send.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.procs import free_port  # noqa: E402
from tidemq.broker.broker import Broker  # noqa: E402
from tidemq.broker.config import BrokerConfig  # noqa: E402
from tidemq.broker.store.config import FlushMode, StoreConfig  # noqa: E402
from tidemq.message import encode_batch, encode_properties  # noqa: E402
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode  # noqa: E402
from tidemq.remoting.frame import encode_frame  # noqa: E402
from tidemq.remoting.headers.send import decode_send_header, send_response_fields  # noqa: E402
from tidemq.remoting.transport import Connection  # noqa: E402

TOPIC = "HotPath"


class CountingTransport:
    """Stands in for the socket: counts the writes a connection makes."""

    def __init__(self) -> None:
        self.writes = 0

    def writelines(self, parts: Iterable[bytes | memoryview]) -> None:
        self.writes += 1

    def write(self, data: bytes | memoryview) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 40000) if name == "peername" else default


def header(props: dict[str, str], batch: bool = False) -> dict[str, str]:
    """A SEND_MESSAGE_V2 header as TideMQ's and RocketMQ's clients send it (one-letter names)."""
    return {"a": "hot-path", "b": TOPIC, "c": "TBW102", "d": "4", "e": "1", "f": "0",
            "g": str(int(time.time() * 1000)), "h": "0", "i": encode_properties(props), "j": "0",
            "m": "true" if batch else "false"}


def frames(workload: str, n: int, body: bytes) -> list[bytes]:
    if workload == "batch":
        out = []
        for i in range(n // 64):
            items = [(0, body, encode_properties({"UNIQ_KEY": f"7F000001{i:012X}{j:012X}", "TAGS": "TagA"}))
                     for j in range(64)]
            cmd = RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, header({"WAIT": "true"}, True),
                                          encode_batch(items))
            cmd.opaque = i + 1
            out.append(encode_frame(cmd))
        return out
    singles = []
    for i in range(n):
        props = {"UNIQ_KEY": f"7F000001{i:024X}", "WAIT": "true", "TAGS": "TagA"}
        cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header(props), body)
        cmd.opaque = i + 1
        singles.append(encode_frame(cmd))
    if workload == "pipelined":
        return [b"".join(singles[i:i + 64]) for i in range(0, n, 64)]
    return singles


class Echo(asyncio.Protocol):
    """The loop's floor: answers each whole frame with one fixed response frame."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while len(buf) >= 4:
            (length,) = struct.unpack_from(">i", buf)
            if len(buf) < 4 + length:
                break
            del buf[:4 + length]
            assert self.transport is not None
            self.transport.write(self.answer)


def client(port: int, n: int, size: int) -> int:
    """The client process of --loop: n sends, one in flight, over one blocking socket."""
    body = b"x" * size
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    frames = []
    for i in range(n):
        cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header(
            {"UNIQ_KEY": f"7F000001{i:024X}", "WAIT": "true", "TAGS": "TagA"}), body)
        cmd.opaque = i + 1
        frames.append(encode_frame(cmd))
    buf = bytearray()
    for f in frames:
        sock.sendall(f)
        while True:
            if len(buf) >= 4:
                (length,) = struct.unpack_from(">i", buf)
                if len(buf) >= 4 + length:
                    del buf[:4 + length]
                    break
            chunk = sock.recv(65536)
            if not chunk:
                print("the server closed the connection", file=sys.stderr)
                return 1
            buf += chunk
    sock.close()
    return 0


async def drive(port: int, n: int, size: int) -> tuple[float, float]:
    """Run the client process against ``port``; the CPU and wall seconds this process spent meanwhile."""
    proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--client", str(port), str(n), str(size))
    t0, c0 = time.perf_counter(), time.process_time()
    rc = await proc.wait()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if rc != 0:
        raise RuntimeError(f"the --loop client exited with {rc}")
    return cpu, wall


class AnswerOnly:
    """--remoting's handler: the send header decoded and a send's answer, nothing stored."""

    def handle(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = decode_send_header(cmd.ext_fields, True)
        return cmd.response_str(0, None, send_response_fields("7F00000100002A9F0000000000000001", h.queue_id,
                                                              123, "DefaultRegion"))

    def connection_lost(self, conn: Connection) -> None:
        pass


def remoting_run(args: argparse.Namespace) -> None:
    """--remoting: CPU per request of the remoting path alone (best of 5 passes)."""
    chunks = frames("single", args.messages, os.urandom(args.size // 2 + 1).hex().encode()[: args.size])
    best = float("inf")
    for _ in range(5):
        conn = Connection(AnswerOnly())
        conn.connection_made(CountingTransport())  # type: ignore[arg-type]
        c0 = time.process_time()
        for chunk in chunks:
            conn.data_received(chunk)
        best = min(best, time.process_time() - c0)
    print(f"remoting path (split, header decode, send header, answer, encode, write): "
          f"{best / args.messages * 1e6:.2f} us CPU per request")


async def loop_run(args: argparse.Namespace, broker: Broker, port: int) -> None:
    """--loop: broker CPU per one-in-flight send over loopback, and the echo floor."""
    answer = encode_frame(RemotingCommand(code=0, opaque=1, flag=1, ext_fields={"msgId": "X" * 32}))
    echo = await asyncio.get_running_loop().create_server(lambda: Echo(answer), "127.0.0.1", 0)
    echo_port = echo.sockets[0].getsockname()[1]
    print(f"{'loop workload':<14} {'messages':>9} {'CPU us/msg':>11} {'wall us/msg':>12} {'flush rounds/msg':>14}")
    try:
        for name, target in (("echo", echo_port), ("broker send", port)):
            for profile in (False, True) if args.profile and name != "echo" else (False,):
                prof = cProfile.Profile() if profile else None
                before = broker.store.stats()["messages_put"]
                rounds = broker.store.stats()["flush_rounds"]
                if prof:
                    prof.enable()
                cpu, wall = await drive(target, args.messages, args.size)
                if prof:
                    prof.disable()
                    out = io.StringIO()
                    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.profile)
                    print(f"\n--- {name}: cProfile, top {args.profile} by own time ---")
                    print("\n".join(line for line in out.getvalue().splitlines()[6:] if line.strip()))
                    continue
                if name != "echo" and broker.store.stats()["messages_put"] - before != args.messages:
                    raise RuntimeError("the broker did not store every message")
                rounds = broker.store.stats()["flush_rounds"] - rounds
                print(f"{name:<14} {args.messages:>9,} {cpu / args.messages * 1e6:>11.1f} "
                      f"{wall / args.messages * 1e6:>12.1f} {rounds / args.messages:>14.2f}")
    finally:
        echo.close()


async def run(args: argparse.Namespace) -> int:
    if args.remoting:
        remoting_run(args)
        return 0
    body = os.urandom(args.size // 2 + 1).hex().encode()[: args.size]
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        store = StoreConfig(root=Path(tmp) / "store", commitlog_segment_size=256 << 20,
                            flush_mode=FlushMode.SYNC if args.flush == "sync" else FlushMode.ASYNC)
        cfg = BrokerConfig(store=store,
                           listen_host="127.0.0.1", listen_port=port, advertise_host="127.0.0.1",
                           advertise_port=port)
        broker = Broker(cfg)
        await broker.start()
        client = RemotingClient()
        try:
            resp = await client.invoke(f"127.0.0.1:{port}", RemotingCommand.request(
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                {"topic": TOPIC, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
                 "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": "false"}), 5)
            if resp.code != 0:
                print(f"creating the topic failed: {resp.code} {resp.remark}", file=sys.stderr)
                return 1
            await asyncio.sleep(1.0)  # the next CommitLog segment is pre-faulted by now
            if args.loop:
                await loop_run(args, broker, port)
                return 0
            print(f"{'workload':<12} {'messages':>9} {'CPU us/msg':>11} {'wall us/msg':>12} {'writes':>7}")
            for workload in ("single", "pipelined", "batch"):
                for profile in (False, True) if args.profile else (False,):
                    chunks = frames(workload, args.messages, body)
                    before = broker.store.stats()["messages_put"]
                    conn = Connection(broker)
                    conn.connection_made(CountingTransport())  # type: ignore[arg-type]
                    prof = cProfile.Profile() if profile else None
                    t0, c0 = time.perf_counter(), time.process_time()
                    if prof:
                        prof.enable()
                    for chunk in chunks:
                        conn.data_received(chunk)
                    if prof:
                        prof.disable()
                    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                    stored = broker.store.stats()["messages_put"] - before
                    if stored != args.messages:
                        print(f"{workload}: stored {stored} of {args.messages} messages", file=sys.stderr)
                        return 1
                    if prof is None:
                        print(f"{workload:<12} {stored:>9,} {cpu / stored * 1e6:>11.1f} {wall / stored * 1e6:>12.1f} "
                              f"{cast(CountingTransport, conn.transport).writes:>7}")
                    else:
                        out = io.StringIO()
                        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.profile)
                        print(f"\n--- {workload}: cProfile, top {args.profile} by own time ---")
                        print("\n".join(line for line in out.getvalue().splitlines()[6:] if line.strip()))
        finally:
            await client.close()
            await broker.stop()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile each workload and print the N functions with most own time")
    ap.add_argument("--remoting", action="store_true",
                    help="only the remoting path of a send (no broker): CPU per request")
    ap.add_argument("--loop", action="store_true",
                    help="measure the broker's CPU per one-in-flight send over a real socket, and an echo floor")
    ap.add_argument("--flush", choices=["async", "sync"], default="async",
                    help="the broker's flush mode (sync: SYNC_FLUSH, each send answered once flushed)")
    ap.add_argument("--client", nargs=3, type=int, metavar=("PORT", "N", "SIZE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        return client(*args.client)
    if args.flush == "sync" and not args.loop:
        ap.error("--flush sync needs --loop (in-process sends never wait for a flush round)")
    if args.messages < 64:
        ap.error("--messages must be at least 64")
    args.messages -= args.messages % 64
    try:
        import uvloop  # noqa: PLC0415 (optional: not on Windows)
        return uvloop.run(run(args))
    except ImportError:
        return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
