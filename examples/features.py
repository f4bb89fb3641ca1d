"""Consumers, tags, delays, retries, ordered sends, request-reply and transactions, in one script.

Start a name server and a broker first (`tidemq local`, or `python3 dev.py demo`), then run

    python examples/features.py            # NAMESRV_ADDR=HOST:PORT for another name server

It takes about 15 s (the first retry of a message waits for delay level 3, 10 s), prints what each
part did and exits 0, or exits 1 naming what did not happen. What it does:

1. creates what it uses, since automatic topic creation is off by default: the topics
   `example-orders` (4 queues) and `example-rpc` (1 queue), and the consumer group `example-group`;
2. starts a push consumer of `example-group` subscribed to `example-orders` with `TagA || TagB`,
   and a responder that answers every request on `example-rpc` with `create_reply_message`;
3. sends tagged messages (a `TagC` one is filtered out), a message delayed by delay level 2 (5 s),
   one timed for an exact moment (`TIMER_DELIVER_MS`), three ordered messages with one key (they
   land on one queue), a message the listener fails once (retried 10 s later) and one it always
   fails (parked in `%DLQ%example-group` after its retry: the consumer's `max_reconsume_times=1`
   wins over the group's `retryMaxTimes`, 16 here);
4. sends a request and waits for its reply;
5. sends two transactional messages: one committed (delivered), one rolled back (never delivered);
6. waits until every expected message arrived, then reads the poisoned one from the DLQ.

Each run tags its messages with a run id, so messages of an earlier run are acknowledged and ignored.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid

from tidemq import (
    Admin,
    AdminError,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PushConsumer,
    TransactionProducer,
    create_reply_message,
    select_by_hash,
)
from tidemq.client.selectors import QueueSelector

NAMESRV = os.environ.get("NAMESRV_ADDR", "127.0.0.1:9876")
CLUSTER = "DefaultCluster"
TOPIC = "example-orders"
RPC_TOPIC = "example-rpc"
GROUP = "example-group"
DLQ_TOPIC = f"%DLQ%{GROUP}"
RUN = uuid.uuid4().hex[:8]  # this run's id, in the property "run" of every message it sends
DEADLINE = 60.0  # seconds to wait for every expected message


async def create_topic(admin: Admin, topic: str, queues: int) -> None:
    """Create ``topic`` on every broker of the cluster and wait until the name server routes it
    (brokers register new topics in the background)."""
    await admin.create_topic(topic, read_queues=queues, write_queues=queues, cluster=CLUSTER)
    await wait_for_route(admin, topic)


async def wait_for_route(admin: Admin, topic: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await admin.topic_route(topic)
            return
        except AdminError:  # the name server does not know the topic yet
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


class Tx:
    """The local transaction of each half message: commit or roll back by its body."""

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        if msg.body.startswith(b"tx-commit"):
            return LocalTransactionState.COMMIT_MESSAGE
        return LocalTransactionState.ROLLBACK_MESSAGE  # or UNKNOW: the broker asks again later

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        # The broker's check-back for a half message left UNKNOW (--transaction-timeout).
        return LocalTransactionState.COMMIT_MESSAGE


async def main() -> int:
    print(f"name server {NAMESRV}, run {RUN}")
    async with Admin(NAMESRV) as admin:
        await create_topic(admin, TOPIC, 4)
        await create_topic(admin, RPC_TOPIC, 1)
        # The group's retryMaxTimes (`tidemq admin updateSubGroup -r`) serves clients that send no
        # maxReconsumeTimes of their own; our PushConsumer sends max_reconsume_times, which wins.
        await admin.update_subscription_group(GROUP, cluster=CLUSTER, retry_max_times=16)

    received: dict[str, list[MessageExt]] = {}  # body -> its deliveries
    sent_at: dict[str, float] = {}  # body -> when it was sent (time.monotonic())
    arrived: dict[str, float] = {}  # body -> its first delivery
    everything = asyncio.Event()
    once = {"hello", "tagged-b", "delayed", "timed", "order-42-1", "order-42-2", "order-42-3", "tx-commit"}
    twice = {"fail-once", "poison"}  # the first delivery and the retry

    def record(m: MessageExt) -> str:
        body = m.body.decode()
        received.setdefault(body, []).append(m)
        arrived.setdefault(body, time.monotonic())
        print(f"  consumed {body!r} (tags {m.tags}, queue {m.queue_id}, reconsume times {m.reconsume_times}), "
              f"{time.monotonic() - sent_at[body]:.1f} s after it was sent")
        if once <= received.keys() and all(len(received.get(b, ())) >= 2 for b in twice):
            everything.set()
        return body

    async def on_orders(msgs: list[MessageExt]) -> ConsumeStatus:
        for m in msgs:  # one message per call (consume_batch_max_size=1)
            if m.properties.get("run") != RUN:
                continue  # left over from an earlier run
            body = record(m)
            if body == "poison" or (body == "fail-once" and m.reconsume_times == 0):
                return ConsumeStatus.RECONSUME_LATER  # given back: %RETRY%example-group, then the DLQ
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(GROUP, NAMESRV, max_reconsume_times=1)  # orderly=True: one queue at a time, in order
    consumer.subscribe(TOPIC, "TagA || TagB")
    consumer.register_listener(on_orders)

    async with Producer("example-replier", NAMESRV) as replier:
        async def on_request(msgs: list[MessageExt]) -> ConsumeStatus:
            for m in msgs:
                await replier.send(create_reply_message(m, b"pong: " + m.body))
            return ConsumeStatus.CONSUME_SUCCESS

        responder = PushConsumer("example-responder", NAMESRV)
        responder.subscribe(RPC_TOPIC, "*")
        responder.register_listener(on_request)

        async with consumer, responder, Producer("example-producer", NAMESRV) as p:
            async def send(body: str, tags: str, keys: str | None = None,
                           properties: dict[str, str] | None = None, selector: QueueSelector | None = None) -> None:
                sent_at[body] = time.monotonic()
                msg = Message(TOPIC, body.encode(), tags=tags, keys=keys, properties={"run": RUN, **(properties or {})})
                r = await p.send(msg, selector=selector)
                print(f"sent {body!r} to queue {r.message_queue.queue_id} at offset {r.queue_offset}")

            await send("hello", "TagA", keys="order-1")
            await send("tagged-b", "TagB")
            await send("not-for-us", "TagC")  # the subscription is TagA || TagB: never delivered
            await send("delayed", "TagA", properties={"DELAY": "2"})  # delay level 2: 5 s (--delay-levels)
            due_ms = int(time.time() * 1000) + 3000  # an exact delivery time, 3 s from now
            await send("timed", "TagA", properties={"TIMER_DELIVER_MS": str(due_ms)})
            for i in (1, 2, 3):  # one key, one queue: RocketMQ's ordered messages
                await send(f"order-42-{i}", "TagA", keys="order-42", selector=select_by_hash("order-42"))
            await send("fail-once", "TagB")
            await send("poison", "TagB")

            reply = await p.request(Message(RPC_TOPIC, b"ping", properties={"run": RUN}), timeout=10.0)
            print(f"request b'ping' answered {reply.body!r}")
            if reply.body != b"pong: ping":
                print(f"FAILED: the reply was {reply.body!r}, not b'pong: ping'")
                return 1

            async with TransactionProducer("example-tx", Tx(), NAMESRV) as tp:
                for body in ("tx-commit", "tx-rollback"):
                    sent_at[body] = time.monotonic()
                    msg = Message(TOPIC, body.encode(), tags="TagA", properties={"run": RUN})
                    r = await tp.send_message_in_transaction(msg)
                    print(f"sent {body!r} in a transaction: local transaction {r.local_state.name}")

            print(f"waiting for the delayed, timed and retried messages (up to {DEADLINE:.0f} s)")
            try:
                await asyncio.wait_for(everything.wait(), DEADLINE)
            except TimeoutError:
                missing = sorted(once - received.keys()) + sorted(b for b in twice if len(received.get(b, ())) < 2)
                print(f"FAILED: not consumed (or not retried) within {DEADLINE:.0f} s: {missing}")
                return 1

    problems = []
    for body in ("not-for-us", "tx-rollback"):
        if body in received:
            problems.append(f"{body!r} was delivered")
    queues = {m.queue_id for i in (1, 2, 3) for m in received[f"order-42-{i}"]}
    if len(queues) != 1:
        problems.append(f"the messages keyed order-42 landed on queues {sorted(queues)}, not one")
    for body, at_least in (("delayed", 4.5), ("timed", 2.5)):
        took = arrived[body] - sent_at[body]
        if took < at_least:
            problems.append(f"{body!r} arrived {took:.1f} s after sending, before its time")

    dead = await read_dlq()
    print(f"{DLQ_TOPIC} holds {[m.body for m in dead]} of this run "
          f"(reconsume times {[m.reconsume_times for m in dead]})")
    if [m.body for m in dead] != [b"poison"]:
        problems.append(f"{DLQ_TOPIC} holds {[m.body for m in dead]} of this run, not [b'poison']")

    for problem in problems:
        print(f"FAILED: {problem}")
    if not problems:
        print("every part worked")
    return 1 if problems else 0


async def read_dlq(timeout: float = 15.0) -> list[MessageExt]:
    """This run's messages in the group's dead-letter queue (a topic like any other), once there."""
    async with Admin(NAMESRV) as admin:
        await wait_for_route(admin, DLQ_TOPIC)
    deadline = time.monotonic() + timeout
    async with PullConsumer("example-dlq-reader", NAMESRV) as reader:
        while True:
            dead = []
            for mq in await reader.fetch_queues(DLQ_TOPIC):
                start = max(await reader.min_offset(mq), await reader.max_offset(mq) - 32)
                res = await reader.pull(mq, start, 32)
                dead += [m for m in res.messages if m.properties.get("run") == RUN]
            if dead or time.monotonic() > deadline:
                return dead
            await asyncio.sleep(0.5)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
