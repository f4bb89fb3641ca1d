"""PullConsumer: the application chooses queues and offsets; the client pulls and commits.

The consumer registers its group with every broker through the instance's heartbeat
(CONSUME_ACTIVELY, CLUSTERING) listing the topics it has used, so that brokers report the group
in consumer progress. A topic seen for the first time (or a new tag expression) triggers an
immediate heartbeat before the request that uses it. Offsets are the *next* offset to consume.
Pulls and the queue's offsets (max, min, by time) go to the queue's master broker, or, while
its group has no master registered (a failover), to its lowest-id follower, which serves what it
holds replicated; committed offsets (query and commit) go to the master only (a follower's offset
table may lag the master's). A long poll (``suspend_ms`` > 0) waits up to that long
at the broker and the request timeout grows by the same amount.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tidemq.client.base import ClientBase
from tidemq.client.config import ClientConfig, make_config, namesrv_arg
from tidemq.client.heartbeat import CLUSTERING, CONSUME_ACTIVELY, ConsumerData, Subscription
from tidemq.client.instance import ClientInstance
from tidemq.client.pull import (
    PullResult,
    RawPullResult,
    build_pull_request,
    normalize_expression,
    parse_pull_response,
    parse_pull_response_raw,
    parse_tag_expression,
)
from tidemq.client.response import check, header_int
from tidemq.client.route import MessageQueue
from tidemq.client.validation import check_group, check_topic_name
from tidemq.errors import ClientError, RemotingError
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode

log = logging.getLogger(__name__)


class PullConsumer(ClientBase):
    """An asyncio pull consumer. Use ``async with PullConsumer("group", "127.0.0.1:9876") as c:``."""

    _not_started = ("consumer is not started: call `await consumer.start()` or use "
                    "`async with PullConsumer(...)`")

    def __init__(
        self,
        group: str,
        name_servers: str | Sequence[str] | None = None,
        config: ClientConfig | None = None,
    ) -> None:
        self.group = check_group(group)
        self.config = make_config(name_servers, config)
        self._subscriptions: dict[str, Subscription] = {}

    # lifecycle ---------------------------------------------------------------------------------
    def _attach(self, inst: ClientInstance) -> None:
        inst.add_consumer(self)

    async def _detach(self, inst: ClientInstance) -> None:
        await inst.remove_consumer(self)

    @property
    def client_id(self) -> str:
        return self._require().client_id

    def consumer_data(self) -> ConsumerData:
        return ConsumerData(
            group=self.group,
            subscriptions=tuple(self._subscriptions.values()),
            consume_type=CONSUME_ACTIVELY,
            message_model=CLUSTERING,
        )

    async def _subscribe(self, inst: ClientInstance, topic: str, expression: str = "*") -> None:
        expr = normalize_expression(expression)
        current = self._subscriptions.get(topic)
        if current is not None and current.expression == expr:
            return
        self._subscriptions[topic] = Subscription(topic, expr, inst.now_ms())
        if await inst.get_route(topic) is None:
            return
        await inst.send_heartbeat()

    # queues ------------------------------------------------------------------------------------
    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted (topic, broker name, queue id)."""
        inst = self._require()
        check_topic_name(topic)
        route = await inst.get_route(topic)
        if route is None:
            raise ClientError(
                f"no route for topic {topic}: create it with `tidemq admin updateTopic "
                f"-n {namesrv_arg(inst.config.name_servers)} -c DefaultCluster -t {topic}` and check "
                "the name server address"
            )
        await self._subscribe(inst, topic, self._subscriptions.get(topic, Subscription(topic)).expression)
        return route.subscribe_queues(topic)

    async def _addr(self, inst: ClientInstance, mq: MessageQueue, master: bool = False) -> str:
        """Where a request about ``mq`` goes: :meth:`ClientInstance.queue_read_addr`, or the
        group's master when ``master`` (committed offsets)."""
        if not isinstance(mq, MessageQueue):
            raise ClientError(f"expected a MessageQueue, got {type(mq).__name__}")
        return await (inst.queue_master_addr(mq) if master else inst.queue_read_addr(mq))

    # pulling -----------------------------------------------------------------------------------
    async def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int = 32,
        expression: str = "*",
        suspend_ms: int = 0,
        timeout: float | None = None,
    ) -> PullResult:
        """Pull up to ``max_nums`` messages from ``offset``; with ``suspend_ms`` > 0 the broker
        holds the request until a message arrives or that many milliseconds pass."""
        resp, expr, addr = await self._pull(mq, offset, max_nums, expression, suspend_ms, timeout)
        return parse_pull_response(resp, mq, parse_tag_expression(expr), addr)

    async def pull_raw(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int = 32,
        expression: str = "*",
        suspend_ms: int = 0,
        timeout: float | None = None,
    ) -> RawPullResult:
        """Like :meth:`pull`, but the records stay encoded (for bulk decoders); the caller must
        re-check tags itself (the broker filters by tag hash code only)."""
        resp, _expr, addr = await self._pull(mq, offset, max_nums, expression, suspend_ms, timeout)
        return parse_pull_response_raw(resp, mq, addr)

    async def _pull(self, mq: MessageQueue, offset: int, max_nums: int, expression: str,
                    suspend_ms: int, timeout: float | None) -> tuple[RemotingCommand, str, str]:
        inst = self._require()
        if offset < 0:
            raise ClientError(f"offset must be >= 0, got {offset}")
        if max_nums <= 0:
            raise ClientError(f"max_nums must be positive, got {max_nums}")
        if suspend_ms < 0:
            raise ClientError(f"suspend_ms must be >= 0, got {suspend_ms}")
        addr = await self._addr(inst, mq)
        await self._subscribe(inst, mq.topic, expression)
        expr = normalize_expression(expression)
        cmd = build_pull_request(self.group, mq, offset, max_nums, expr, suspend_ms,
                                 self._subscriptions[mq.topic].sub_version)
        wait = (timeout if timeout is not None else self.config.request_timeout) + suspend_ms / 1000
        try:
            return await inst.invoke(addr, cmd, wait), expr, addr
        except RemotingError:
            # The broker may have failed over (issue 17): re-read the route now (bounded) so the
            # caller's next pull goes to the group's new master (or a follower meanwhile).
            inst.refresh_route_after_fault(mq.topic)
            raise

    # offsets -----------------------------------------------------------------------------------
    async def committed_offset(self, mq: MessageQueue) -> int | None:
        """The group's committed offset of ``mq``; None when the broker has none."""
        inst = self._require()
        addr = await self._addr(inst, mq, master=True)
        await self._subscribe(inst, mq.topic, self._expr(mq.topic))
        cmd = RemotingCommand.request(
            RequestCode.QUERY_CONSUMER_OFFSET,
            {"consumerGroup": self.group, "topic": mq.topic, "queueId": mq.queue_id},
        )
        what = f"query offset of group {self.group} on {mq}"
        resp = await inst.invoke(addr, cmd)
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        check(resp, what, addr)
        return header_int(resp, "offset", what)

    async def commit(self, mq: MessageQueue, offset: int) -> None:
        """Store ``offset`` (the next offset to consume) for the group at the broker."""
        inst = self._require()
        if offset < 0:
            raise ClientError(f"offset must be >= 0, got {offset}")
        addr = await self._addr(inst, mq, master=True)
        await self._subscribe(inst, mq.topic, self._expr(mq.topic))
        cmd = RemotingCommand.request(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": self.group, "topic": mq.topic, "queueId": mq.queue_id,
             "commitOffset": offset},
        )
        check(await inst.invoke(addr, cmd), f"commit offset of group {self.group} on {mq}", addr)

    async def max_offset(self, mq: MessageQueue) -> int:
        """The offset the next message of ``mq`` will get (0 for an empty queue)."""
        return await self._offset_request(RequestCode.GET_MAX_OFFSET, mq, "max offset")

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self._offset_request(RequestCode.GET_MIN_OFFSET, mq, "min offset")

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The offset of the message stored closest to ``timestamp_ms``."""
        return await self._offset_request(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq, "offset search", timestamp=int(timestamp_ms)
        )

    def _expr(self, topic: str) -> str:
        sub = self._subscriptions.get(topic)
        return sub.expression if sub is not None else "*"

    async def _offset_request(self, code: RequestCode, mq: MessageQueue, what: str,
                              **extra: object) -> int:
        inst = self._require()
        addr = await self._addr(inst, mq)
        cmd = RemotingCommand.request(code, {"topic": mq.topic, "queueId": mq.queue_id, **extra})
        resp = check(await inst.invoke(addr, cmd), f"{what} of {mq}", addr)
        return header_int(resp, "offset", f"{what} of {mq}")
