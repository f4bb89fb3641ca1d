"""The requests push and lite-pull consumers make to brokers, over a shared ClientInstance.

Committed offsets (query and commit), locks and send-back go to the master of the queue's broker
group, as both RocketMQ clients do (a follower's offset table may lag the master's: starting a
queue from it could skip or repeat messages); the queue's own offsets (max, min, by time) go
where pulls go: the master, else, while the group has no master registered, its lowest-id
follower (ClientInstance.queue_read_addr). Every call has a timeout and turns error answers into
BrokerError with a sentence.
"""

from __future__ import annotations

import logging
import random
from collections import defaultdict

from tidemq.client.instance import ClientInstance
from tidemq.client.push import protocol
from tidemq.client.response import check, header_int
from tidemq.client.route import MessageQueue
from tidemq.errors import CodecError, TideMQError
from tidemq.message import MessageExt
from tidemq.remoting import RequestCode, ResponseCode

log = logging.getLogger(__name__)

LOCK_TIMEOUT = 1.0  # the cpp client's budget; our broker answers locks at once


class ConsumerBrokerApi:
    def __init__(self, inst: ClientInstance, group: str) -> None:
        self.inst = inst
        self.group = group

    # offsets -----------------------------------------------------------------------------------
    async def query_offset(self, mq: MessageQueue) -> int | None:
        """The group's committed offset of ``mq``; None when the broker has none."""
        addr = await self.inst.queue_master_addr(mq)
        resp = await self.inst.invoke(addr, protocol.build_query_offset(self.group, mq))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        what = f"query offset of group {self.group} on {mq}"
        check(resp, what, addr)
        return header_int(resp, "offset", what)

    async def update_offset(self, mq: MessageQueue, offset: int, oneway: bool = False) -> None:
        addr = await self.inst.queue_master_addr(mq)
        cmd = protocol.build_update_offset(self.group, mq, offset, oneway)
        if oneway:
            await self.inst.invoke_oneway(addr, cmd)
            return
        check(await self.inst.invoke(addr, cmd), f"commit offset of group {self.group} on {mq}", addr)

    async def _offset(self, code: RequestCode, mq: MessageQueue, what: str, **extra: object) -> int:
        addr = await self.inst.queue_read_addr(mq)
        resp = check(await self.inst.invoke(addr, protocol.build_offset_request(code, mq, **extra)),
                     f"{what} of {mq}", addr)
        return header_int(resp, "offset", f"{what} of {mq}")

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self._offset(RequestCode.GET_MAX_OFFSET, mq, "max offset")

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self._offset(RequestCode.GET_MIN_OFFSET, mq, "min offset")

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return await self._offset(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq, "offset search",
                                  timestamp=int(timestamp_ms))

    # group -------------------------------------------------------------------------------------
    async def consumer_ids(self, topic: str) -> list[str] | None:
        """The group's client ids as one broker of ``topic`` knows them (sorted), or None when no
        broker could tell (the caller skips this rebalance round, as RocketMQ does)."""
        route = self.inst.routes.get(topic)
        if route is None:
            return None
        brokers = [bd for bd in route.broker_datas if bd.any_addr()]
        if not brokers:
            return None
        bd = random.choice(brokers)
        addr = bd.any_addr()
        assert addr is not None
        try:
            resp = await self.inst.invoke(addr, protocol.build_consumer_list(self.group))
            check(resp, f"consumer list of group {self.group}", addr)
            ids = protocol.parse_consumer_list(resp.body_bytes())
        except (TideMQError, CodecError) as exc:
            log.info("consumer list of group %s from %s unavailable: %s", self.group, addr, exc)
            return None
        return ids or None

    # orderly locks -----------------------------------------------------------------------------
    async def lock(self, client_id: str, mqs: list[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ at each queue's master; the queues now held by ``client_id``. A broker
        that cannot be reached locks nothing."""
        locked: set[MessageQueue] = set()
        for broker_name, group_mqs in _by_broker(mqs).items():
            try:
                addr = await self.inst.master_addr(group_mqs[0].topic, broker_name)
                resp = await self.inst.invoke(
                    addr, protocol.build_lock_batch(self.group, client_id, group_mqs), LOCK_TIMEOUT)
                check(resp, f"lock queues of group {self.group}", addr)
                locked |= protocol.parse_lock_result(resp.body_bytes()) & set(group_mqs)
            except (TideMQError, CodecError) as exc:
                log.info("locking %d queue(s) of group %s on %s failed: %s", len(group_mqs),
                         self.group, broker_name, exc)
        return locked

    async def unlock(self, client_id: str, mqs: list[MessageQueue], oneway: bool = False) -> None:
        for broker_name, group_mqs in _by_broker(mqs).items():
            try:
                addr = await self.inst.master_addr(group_mqs[0].topic, broker_name)
                cmd = protocol.build_unlock_batch(self.group, client_id, group_mqs, oneway)
                if oneway:
                    await self.inst.invoke_oneway(addr, cmd)
                else:
                    check(await self.inst.invoke(addr, cmd, LOCK_TIMEOUT),
                          f"unlock queues of group {self.group}", addr)
            except TideMQError as exc:
                log.info("unlocking %d queue(s) of group %s on %s failed: %s", len(group_mqs),
                         self.group, broker_name, exc)

    # consume failures --------------------------------------------------------------------------
    async def send_back(self, mq: MessageQueue, msg: MessageExt, delay_level: int,
                        max_reconsume_times: int) -> None:
        """CONSUMER_SEND_MSG_BACK to the broker that stored ``msg``; raises on any failure."""
        try:
            addr = await self.inst.queue_master_addr(mq)
        except TideMQError:
            addr = msg.store_host
        cmd = protocol.build_send_back(msg, self.group, delay_level, max_reconsume_times)
        check(await self.inst.invoke(addr, cmd), f"send-back of message {msg.msg_id}", addr)


def _by_broker(mqs: list[MessageQueue]) -> dict[str, list[MessageQueue]]:
    out: dict[str, list[MessageQueue]] = defaultdict(list)
    for mq in sorted(mqs):
        out[mq.broker_name].append(mq)
    return out
