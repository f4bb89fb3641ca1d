"""One timeout timer per connection: each request still times out at its own deadline."""

from __future__ import annotations

import asyncio
import time

import pytest

from tidemq.errors import RemotingTimeoutError
from tidemq.remoting import RemotingClient, RemotingCommand, RemotingServer, RequestCode


class Silent:
    """Answers requests whose queueId is 0 at once and never answers the others."""

    def handle(self, conn, cmd):
        if cmd.ext_fields.get("queueId") == "0":
            return cmd.response(0, "", {"offset": 1})
        return None

    def connection_lost(self, conn):
        pass


def req(answered: bool) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_MAX_OFFSET,
                                   {"topic": "T", "queueId": 0 if answered else 1})


async def test_short_timeout_after_a_long_one_fires_on_time_and_answers_still_arrive():
    server = RemotingServer(Silent())
    host, port = await server.start("127.0.0.1", 0)
    client = RemotingClient()
    addr = f"{host}:{port}"
    try:
        long = asyncio.ensure_future(client.invoke(addr, req(False), 5.0))
        await asyncio.sleep(0.01)
        t0 = time.monotonic()
        with pytest.raises(RemotingTimeoutError):
            await client.invoke(addr, req(False), 0.2)
        assert time.monotonic() - t0 < 1.0  # not held back by the 5 s request
        answers = await asyncio.gather(*(client.invoke(addr, req(True), 2.0) for _ in range(50)))
        assert all(a.code == 0 for a in answers)
        assert not long.done()
        long.cancel()
    finally:
        await client.close()
        await server.stop()
