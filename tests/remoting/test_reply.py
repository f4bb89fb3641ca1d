"""Reply: a handler's later answer, told to the server the moment it is set (no loop turn)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tidemq.remoting import RemotingClient, RemotingCommand, RemotingServer, RequestCode
from tidemq.remoting.reply import Reply


def test_callbacks_run_inside_set_result_in_order_and_once() -> None:
    reply = Reply()
    seen: list[str] = []
    reply.add_done_callback(lambda r: seen.append(f"a:{r.result().remark}"))
    reply.add_done_callback(lambda r: seen.append(f"b:{r.result().remark}"))
    assert not reply.done() and seen == []
    with pytest.raises(asyncio.InvalidStateError):
        reply.result()
    resp = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {}).response(0, "ok")
    reply.set_result(resp)
    assert seen == ["a:ok", "b:ok"]  # before set_result returned
    reply.set_result(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {}).response(1, "late"))
    assert reply.cancel() is False and reply.result() is resp and reply.exception() is None
    reply.add_done_callback(lambda r: seen.append("late"))  # added after: called at once
    assert seen == ["a:ok", "b:ok", "late"]


def test_a_cancelled_reply_tells_its_callbacks_and_ignores_a_later_answer(caplog) -> None:
    reply = Reply()
    seen: list[bool] = []

    def broken(_r: Reply) -> None:
        raise RuntimeError("a bug in one callback")

    reply.add_done_callback(broken)
    reply.add_done_callback(lambda r: seen.append(r.cancelled()))
    with caplog.at_level(logging.ERROR, logger="tidemq.remoting.reply"):
        assert reply.cancel() is True
    assert seen == [True] and "a callback of a deferred reply failed" in caplog.text
    reply.set_result(None)
    assert reply.cancelled()
    with pytest.raises(asyncio.CancelledError):
        reply.result()


def test_awaiting_a_reply() -> None:
    async def main() -> None:
        reply = Reply()
        resp = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {}).response(0, "ok")
        asyncio.get_running_loop().call_soon(reply.set_result, resp)
        assert await reply is resp
        assert await reply is resp  # set already

    asyncio.run(main())


class Later:
    """Answers every request with a Reply the test sets."""

    def __init__(self) -> None:
        self.replies: list[tuple[object, RemotingCommand, Reply]] = []
        self.arrived = asyncio.Event()

    def handle(self, conn, cmd):
        reply = Reply()
        self.replies.append((conn, cmd, reply))
        self.arrived.set()
        return reply

    def connection_lost(self, conn):
        pass


def test_the_server_writes_a_reply_in_the_loop_turn_after_it_is_set() -> None:
    """An asyncio.Future's done-callbacks wait one loop turn; a Reply's answer is queued inside
    set_result, so the connection's flush (its own turn, which gathers a step's answers) runs
    in the very next one."""
    async def main() -> None:
        handler = Later()
        server = RemotingServer(handler)
        host, port = await server.start("127.0.0.1", 0)
        client = RemotingClient()
        try:
            answer = asyncio.ensure_future(client.invoke(f"{host}:{port}", RemotingCommand.request(
                RequestCode.SEND_MESSAGE_V2, {"n": "1"}), timeout=5.0))
            await asyncio.wait_for(handler.arrived.wait(), 5.0)
            conn, cmd, reply = handler.replies[0]
            flushed = conn.activity
            reply.set_result(cmd.response(0, "later"))
            await asyncio.sleep(0)
            assert conn.activity == flushed + 1  # written in the next turn
            resp = await asyncio.wait_for(answer, 5.0)
            assert (resp.code, resp.remark) == (0, "later")
        finally:
            await client.close()
            await server.stop()

    asyncio.run(main())
