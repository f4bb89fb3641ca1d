"""The in-memory fake broker of tests/client/fake_server.py, plus what push consumers need:
short long-polls (so pull loops do not spin), CONSUMER_SEND_MSG_BACK and queue locks."""

from __future__ import annotations

import asyncio

import orjson

from tests.client.fake_server import FakeCluster
from tidemq.remoting import RemotingCommand, ResponseCode

HOLD = 0.05


class PushFakeCluster(FakeCluster):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.send_backs: list[dict[str, str]] = []
        self.locks: dict[tuple[str, str, int], str] = {}

    def on_pull_message(self, conn, cmd: RemotingCommand):
        resp = super().on_pull_message(conn, cmd)
        if resp.code == ResponseCode.PULL_NOT_FOUND and cmd.get_int("sysFlag") & 2:
            async def later():
                await asyncio.sleep(HOLD)
                return super(PushFakeCluster, self).on_pull_message(conn, cmd)
            return later()
        return resp

    def on_consumer_send_msg_back(self, conn, cmd: RemotingCommand):
        self.send_backs.append(dict(cmd.ext_fields))
        return cmd.response()

    def on_lock_batch_mq(self, conn, cmd: RemotingCommand):
        body = orjson.loads(cmd.body_bytes())
        ok = []
        for mq in body["mqSet"]:
            key = (mq["topic"], mq["brokerName"], int(mq["queueId"]))
            if self.locks.setdefault(key, body["clientId"]) == body["clientId"]:
                ok.append(mq)
        return cmd.response(body=orjson.dumps({"lockOKMQSet": ok}))

    def on_unlock_batch_mq(self, conn, cmd: RemotingCommand):
        body = orjson.loads(cmd.body_bytes())
        for mq in body["mqSet"]:
            key = (mq["topic"], mq["brokerName"], int(mq["queueId"]))
            if self.locks.get(key) == body["clientId"]:
                del self.locks[key]
        return cmd.response()
