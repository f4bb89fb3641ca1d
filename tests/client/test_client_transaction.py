"""TransactionProducer against real TideMQ processes with short transaction timings: commit,
rollback, check-back deciding, another producer of the group answering for a crashed one, the
check limit, and a broker restart in the middle of a transaction."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.procs import Cluster
from tidemq.client import (
    Admin,
    ClientConfig,
    LocalTransactionState,
    PullConsumer,
    SyncTransactionProducer,
    TransactionProducer,
    TransactionSendResult,
)
from tidemq.client.pull import PullStatus
from tidemq.remoting.headers.admin import TRANSACTION_HALF_PROGRESS
from tidemq.client.send import SendStatus
from tidemq.client.transaction import build_end_transaction, coerce_state
from tidemq.errors import ClientError
from tidemq.message import Message, MessageExt, decode_offset_msg_id
from tests.support.topics import create_topic
from tests.support.waiting import wait_until

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
TX_ARGS = ["--transaction-timeout", "0.5", "--transaction-check-interval", "0.2",
           "--transaction-check-max", "3"]
# For tests that assert a transaction resolved by the producer (end / check answer) is never
# checked (again): the end must reach the broker before the timeout, which 0.5 s does not
# guarantee on a loaded machine. Waiting SETTLE past a resolution covers a (wrong) check.
PATIENT_TIMEOUT = 2.5
PATIENT_TX_ARGS = ["--transaction-timeout", str(PATIENT_TIMEOUT), "--transaction-check-interval", "0.2",
                   "--transaction-check-max", "3"]
SETTLE = PATIENT_TIMEOUT + 1.0  # past timeout + check interval, with slack
QUEUES = 2
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"


# A bound per test body (the module's clusters' start is not counted).
pytestmark = pytest.mark.timeout(30, func_only=True)


def _start(root, args: list[str] = TX_ARGS, **kw) -> Cluster:
    c = Cluster(root, extra_broker_args=args, **kw)
    try:
        c.start()
    except Exception:  # noqa: BLE001 (whatever failed, stop what started, then say why with the log)
        c.stop()
        raise RuntimeError(f"cluster did not start:\n{c.broker.log()[-3000:]}")
    return c


@pytest.fixture(scope="module")
def txc(tmp_path_factory):
    c = _start(tmp_path_factory.mktemp("txcluster"))
    yield c
    c.stop()


@pytest.fixture(scope="module")
def txp(tmp_path_factory):
    """A broker that checks back only after PATIENT_TIMEOUT."""
    c = _start(tmp_path_factory.mktemp("txpatient"), PATIENT_TX_ARGS)
    yield c
    c.stop()


def names() -> tuple[str, str]:
    u = uuid.uuid4().hex[:8]
    return f"tx_{u}", f"txg_{u}"


def cfg(c: Cluster, instance: str = "DEFAULT", **kw) -> ClientConfig:
    return ClientConfig(name_servers=c.namesrv_addr, instance_name=instance, **kw)


async def visible(c: Cluster, topic: str) -> list[MessageExt]:
    """Every message a consumer of ``topic`` can pull now."""
    out: list[MessageExt] = []
    async with PullConsumer(f"reader_{uuid.uuid4().hex[:6]}", c.namesrv_addr) as consumer:
        for mq in await consumer.fetch_queues(topic):
            offset = 0
            while True:
                r = await consumer.pull(mq, offset, 32)
                if r.status is not PullStatus.FOUND:
                    break
                out.extend(r.messages)
                offset = r.next_begin_offset
    return out


class Listener:
    """Async execute, sync check (so both calling conventions are exercised)."""

    def __init__(self, execute: LocalTransactionState, check: LocalTransactionState = UNKNOW) -> None:
        self.execute = execute
        self.check = check
        self.executed: list[tuple[Message, object]] = []
        self.checked: list[MessageExt] = []
        self.check_threads: set[str] = set()
        self.check_times: list[float] = []

    async def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        self.executed.append((msg, arg))
        return self.execute

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        self.checked.append(msg)
        self.check_times.append(time.monotonic())
        self.check_threads.add(threading.current_thread().name)
        return self.check


async def test_commit_is_visible_exactly_once_with_the_producers_ids(txp):
    txc = txp
    topic, group = names()

    await create_topic(txc, topic, QUEUES)
    listener = Listener(COMMIT)
    async with TransactionProducer(group, listener, config=cfg(txc)) as p:
        msg = Message(topic, b"order-1", tags="TagT", keys=["k1", "k2"], properties={"p": "v"})
        res = await p.send_message_in_transaction(msg, arg={"n": 1})
        assert res.status is SendStatus.SEND_OK and res.local_state is COMMIT
        [(seen, arg)] = listener.executed
        assert arg == {"n": 1}
        assert seen.properties["UNIQ_KEY"] == res.transaction_id == res.msg_id
        assert seen.properties["TRAN_MSG"] == "true" and seen.properties["PGROUP"] == group
        assert "UNIQ_KEY" not in msg.properties  # the caller's message is left alone
        got = await wait_until(lambda: visible(txc, topic), f"the committed message in {topic}")
        await asyncio.sleep(SETTLE)  # past timeout + interval: no check, no second copy
        again = await visible(txc, topic)
        assert listener.checked == [] and p.checks_answered == 0
    assert len(got) == 1 and len(again) == 1
    m = again[0]
    assert (m.body, m.tags, m.keys, m.properties["p"]) == (b"order-1", "TagT", ["k1", "k2"], "v")
    assert m.msg_id == res.transaction_id
    assert m.queue_id == res.message_queue.queue_id
    assert m.sys_flag & 0xC == 0x8
    assert m.prepared_transaction_offset == decode_offset_msg_id(res.offset_msg_id)[1]
    assert not {"TRAN_MSG", "REAL_TOPIC", "REAL_QID"} & set(m.properties)


async def test_rollback_is_never_visible(txp):
    txc = txp
    topic, group = names()

    await create_topic(txc, topic, QUEUES)
    listener = Listener(ROLLBACK, check=COMMIT)
    async with TransactionProducer(group, listener, config=cfg(txc)) as p:
        res = await p.send_message_in_transaction(Message(topic, b"nope"))
        assert res.local_state is ROLLBACK
        await asyncio.sleep(SETTLE)
        assert await visible(txc, topic) == []
        assert listener.checked == []  # resolved: never asked


@pytest.mark.parametrize("answer", [COMMIT, ROLLBACK])
async def test_unknown_state_is_checked_back_and_the_answer_decides(txp, answer):
    txc = txp
    topic, group = names()

    await create_topic(txc, topic, QUEUES)
    listener = Listener(UNKNOW, check=answer)
    async with TransactionProducer(group, listener, config=cfg(txc)) as p:
        res = await p.send_message_in_transaction(Message(topic, b"maybe", tags="TagU", keys="ku"))
        assert res.local_state is UNKNOW
        assert await visible(txc, topic) == []  # the half message is invisible
        await wait_until(lambda: listener.checked, "the broker to check the transaction back")
        await wait_until(lambda: p.checks_answered, "the producer to answer the check")
        checked = listener.checked[0]
        assert (checked.topic, checked.body, checked.msg_id) == (topic, b"maybe", res.transaction_id)
        assert checked.queue_id == res.message_queue.queue_id and checked.tags == "TagU"
        assert "MainThread" not in listener.check_threads  # a plain function runs off the loop
        if answer is COMMIT:
            got = await wait_until(lambda: visible(txc, topic),
                                   f"the message the check committed in {topic}")
            assert [m.msg_id for m in got] == [res.transaction_id] and got[0].keys == ["ku"]
        await asyncio.sleep(SETTLE)  # an unresolved copy would be checked again by now
        final = await visible(txc, topic)
        assert len(listener.checked) == 1  # resolved by the answer: not asked again
    assert len(final) == (1 if answer is COMMIT else 0)


async def test_runtime_info_reports_the_check_progress_until_the_transaction_resolves(txp):
    """transactionHalfProgress (GET_BROKER_RUNTIME_INFO): below the half queue's end while a
    transaction is open, at the end once its check-back committed it (what a scale-in waits for)."""
    topic, group = names()
    await create_topic(txp, topic, QUEUES)

    async def progress_and_end() -> tuple[int, int]:
        async with Admin(txp.namesrv_addr) as admin:
            done = int((await admin.get_broker_runtime_info(txp.broker_addr))[TRANSACTION_HALF_PROGRESS])
            return done, (await admin.queue_offset_range(txp.broker_addr, HALF_TOPIC, 0))[1]

    listener = Listener(UNKNOW, check=COMMIT)
    async with TransactionProducer(group, listener, config=cfg(txp)) as p:
        await p.send_message_in_transaction(Message(topic, b"open"))
        done, end = await progress_and_end()
        assert done < end, (done, end)  # open: the checker cannot pass it
        await wait_until(lambda: listener.checked, "the broker to check the transaction back")

        async def resolved() -> bool:
            now, _ = await progress_and_end()
            return now >= end
        await wait_until(resolved, "the checker's progress past the committed half message", timeout=15)


async def test_another_producer_of_the_group_answers_for_a_crashed_one(txp):
    txc = txp  # p1 must be gone before the first check, however slow its close
    topic, group = names()

    await create_topic(txc, topic, QUEUES)
    first = Listener(UNKNOW, check=ROLLBACK)
    p1 = TransactionProducer(group, first, config=cfg(txc, "p1"))
    await p1.start()
    res = await p1.send_message_in_transaction(Message(topic, b"orphan"))
    assert res.local_state is UNKNOW
    await p1.close()  # gone without finishing the transaction
    second = Listener(UNKNOW, check=COMMIT)
    async with TransactionProducer(group, second, config=cfg(txc, "p2"), topics=[topic]):
        got = await wait_until(lambda: visible(txc, topic),
                               f"the message the second producer committed in {topic}")
    assert [m.msg_id for m in got] == [res.transaction_id]
    assert first.checked == [] and [m.msg_id for m in second.checked] == [res.transaction_id]


async def test_after_check_max_unknown_answers_the_half_is_discarded(txc):
    topic, group = names()

    await create_topic(txc, topic, QUEUES)
    listener = Listener(UNKNOW, check=UNKNOW)
    async with TransactionProducer(group, listener, config=cfg(txc)) as p:
        await p.send_message_in_transaction(Message(topic, b"never"))
        await wait_until(lambda: len(listener.checked) >= 3, "three checks of the transaction")
        await asyncio.sleep(1.5)  # a further round would ask a 4th time
        assert len(listener.checked) == 3
        assert await visible(txc, topic) == []
    assert "discarded after 3 check(s)" in txc.broker.log()


@pytest.fixture
def own_txc(tmp_path):
    """A cluster of the test's own, for a test that restarts its broker."""
    c = _start(tmp_path)
    yield c
    c.stop()


@pytest.mark.timeout(60, func_only=True)
async def test_broker_restart_in_the_middle_of_transactions(own_txc):
    c = own_txc
    topic, group = names()
    await create_topic(c, topic, QUEUES)
    release = asyncio.Event()

    class Slow(Listener):
        async def execute_local_transaction(self, msg, arg):
            self.executed.append((msg, arg))
            if arg == "slow":
                await release.wait()
                return COMMIT
            return UNKNOW

    listener = Slow(UNKNOW, check=COMMIT)
    conf = cfg(c, heartbeat_interval=0.3)
    async with TransactionProducer(group, listener, config=conf) as p:
        # Immune for 3 s (longer than the 0.5 s timeout): checked after the restart.
        sent_at = time.monotonic()
        unknown = await p.send_message_in_transaction(
            Message(topic, b"checked", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "3"}), "unknown")
        slow = asyncio.ensure_future(p.send_message_in_transaction(Message(topic, b"slow"), "slow"))
        await wait_until(lambda: len(listener.executed) == 2, "both transactions to execute locally")
        await asyncio.to_thread(c.restart_broker)
        release.set()
        committed = await slow
        await wait_until(lambda: _count(visible(c, topic), 2),
                         f"both messages in {topic} after the restart", timeout=15)
        await asyncio.sleep(1.0)
        final = await visible(c, topic)
    assert committed.local_state is COMMIT
    assert sorted(m.body for m in final) == [b"checked", b"slow"]
    assert {m.msg_id for m in final} == {unknown.transaction_id, committed.transaction_id}
    assert [m.msg_id for m in listener.checked] == [unknown.transaction_id]
    assert listener.check_times[0] - sent_at >= 2.9


async def _count(coro, n: int):
    got = await coro
    return got if len(got) >= n else None


async def test_sync_facade_commits(txp):
    txc = txp  # a check before the commit lands would be answered ROLLBACK
    topic, group = names()
    await create_topic(txc, topic, QUEUES)

    class SyncListener:
        def execute_local_transaction(self, msg, arg):
            return "COMMIT_MESSAGE"

        def check_local_transaction(self, msg):
            return ROLLBACK

    def send_in_transaction() -> TransactionSendResult:  # blocking: off the test's loop
        with SyncTransactionProducer(group, SyncListener(), config=cfg(txc)) as p:
            return p.send_message_in_transaction(Message(topic, b"sync"))

    res = await asyncio.to_thread(send_in_transaction)
    assert res.local_state is COMMIT
    got = await wait_until(lambda: visible(txc, topic), f"the committed message in {topic}")
    assert [m.body for m in got] == [b"sync"]


def test_listener_and_state_validation():
    with pytest.raises(ClientError, match="execute_local_transaction"):
        TransactionProducer("g", object())
    assert coerce_state(None, "x") is UNKNOW
    assert coerce_state("ROLLBACK_MESSAGE", "x") is ROLLBACK
    assert coerce_state(42, "x") is UNKNOW
    cmd = build_end_transaction("g", 3, 77, COMMIT, "U", "U", True)
    assert cmd.is_oneway and cmd.ext_fields == {
        "producerGroup": "g", "tranStateTableOffset": "3", "commitLogOffset": "77",
        "commitOrRollback": "8", "fromTransactionCheck": "true", "msgId": "U", "transactionId": "U"}


def _cpp(scenario: str, timeout: float = 90, **args) -> dict:
    script = Path(__file__).resolve().parent.parent / "interop" / "cpp_scenarios.py"
    probe = subprocess.run([sys.executable, "-c", "import rocketmq.client"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("the RocketMQ C++ client wheel cannot load here (needs Linux x86_64)")
    r = subprocess.run([sys.executable, str(script), scenario], input=json.dumps(args),
                       capture_output=True, text=True, timeout=timeout)
    marker = "@@RESULT@@"
    assert r.returncode == 0 and marker in r.stdout, f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return json.loads(r.stdout.rsplit(marker, 1)[1])


@pytest.mark.interop
@pytest.mark.timeout(150, func_only=True)  # the C++ scenario alone may take 90 s
async def test_cpp_push_consumer_sees_only_committed_transactional_messages(txc):
    topic, group = names()

    class ByBody(Listener):
        async def execute_local_transaction(self, msg, arg):
            return {b"yes": COMMIT, b"no": ROLLBACK}.get(msg.body, UNKNOW)

    await create_topic(txc, topic, QUEUES)
    p = TransactionProducer(group, ByBody(UNKNOW, check=UNKNOW), config=cfg(txc))
    await p.start()
    try:
        for body in (b"yes", b"no", b"open"):
            await p.send_message_in_transaction(Message(topic, body, tags="T"))
        res = await asyncio.to_thread(_cpp, "push_consume", namesrv=txc.namesrv_addr, topic=topic,
                                      group=f"cpp_{group}", expect=1, timeout=30, linger=1.5)
    finally:
        await p.close()
    assert [m["body"] for m in res["messages"]] == ["yes"]
