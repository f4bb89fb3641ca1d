"""Every remoting connection has Nagle's algorithm off (TCP_NODELAY), on both ends, in every TLS
mode and on both event loops: a one-in-flight request or its answer held back for the peer's
delayed ACK costs up to 40 ms (bench/compare.py row 1, bench/hot_path.py --loop)."""

from __future__ import annotations

import socket

import pytest

from tests.remoting.test_tls import pki, ping, run_on, serve, tls_client  # noqa: F401 (pki: a fixture)
from tidemq.remoting import RemotingClient


def _nodelay(conn) -> int:
    sock = conn.transport.get_extra_info("socket")
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
@pytest.mark.parametrize("mode,client_tls", [("disabled", False), ("permissive", False), ("permissive", True),
                                             ("enforcing", True)])
def test_connections_have_nagle_off(pki, loop_kind, mode, client_tls):  # noqa: F811 (pki)
    async def main():
        server, addr = await serve(mode, pki)
        client = tls_client(pki["ca_file"]) if client_tls else RemotingClient(connect_timeout=2.0)
        try:
            await ping(client, addr)
            conns = [await client.connection(addr), *server.connections]
            assert len(conns) == 2
            assert [_nodelay(c) for c in conns] == [1, 1]
        finally:
            await client.close()
            await server.stop()

    run_on(loop_kind, main)
