"""A connection writes the answers of a read's first large requests before it serves the rest of
that read (tidemq.remoting.transport.EARLY_FLUSH_BYTES): the peer works on them meanwhile instead
of waiting for the whole read to be answered (bench/compare.py row 2, merged sends in flight)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from tidemq.remoting import RemotingCommand, RemotingServer, RequestCode
from tidemq.remoting.frame import encode_frame
from tidemq.remoting.transport import EARLY_FLUSH_BYTES


class Gate:
    """Request n=0 blocks the loop while the client queues the next requests (so they arrive in
    one read); request n=2 notes whether the client already holds the answer to n=1."""

    def __init__(self) -> None:
        self.serving_gate = threading.Event()
        self.first_answered = threading.Event()
        self.seen: list[bool] = []

    def handle(self, conn, cmd):
        n = int(cmd.ext_fields["n"])
        if n == 0:
            self.serving_gate.set()
            time.sleep(0.3)  # deliberately blocking: the client's next frames pile up meanwhile
        elif n == 2:
            self.seen.append(self.first_answered.wait(3.0))
        return cmd.response(0, "", {"n": n})

    def connection_lost(self, conn):
        pass


def frame(n: int, size: int) -> bytes:
    return encode_frame(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"n": n}, b"x" * size))


def client(port: int, gate: Gate) -> int:
    """Send the gate, then three large requests in one write; count the answers that arrive."""
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as s:
        s.sendall(frame(0, 1))
        assert gate.serving_gate.wait(5.0)
        s.sendall(b"".join(frame(n, EARLY_FLUSH_BYTES + 100) for n in (1, 2, 3)))
        buf = b""
        answers = 0
        while answers < 4:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                buf = buf[4 + int.from_bytes(buf[:4], "big"):]
                answers += 1
            if answers >= 2:  # the gate's answer and the first large request's
                gate.first_answered.set()
        return answers


async def test_answers_to_the_first_large_requests_of_a_read_leave_before_the_rest_is_served():
    gate = Gate()
    server = RemotingServer(gate)
    _host, port = await server.start("127.0.0.1", 0)
    try:
        answers = await asyncio.wait_for(asyncio.to_thread(client, port, gate), 15.0)
    finally:
        await server.stop()
    assert answers == 4
    assert gate.seen == [True]  # n=1's answer was written before n=2 was served
