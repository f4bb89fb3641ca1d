"""Transactional messages in the broker: the pure half/op conversions and bookkeeping, the service
and check-back rounds on a real store with an injected clock and fake producer connections, and
the wire behaviour of a real broker process (half messages invisible, END_TRANSACTION)."""

from __future__ import annotations

import time
import uuid

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.broker.processors.transaction import ask_transaction_state, check_request
from tidemq.broker.store.store import PutRequest
from tidemq.broker.transaction.book import CheckPolicy, OpBook, Verdict, judge
from tidemq.broker.transaction.checker import TransactionChecker
from tidemq.broker.transaction.half import (
    CHECK_MAX_TOPIC,
    HALF_TOPIC,
    OP_TOPIC,
    PROP_CHECK_TIMES,
    PROP_IMMUNITY,
    PROP_NOT_BEFORE,
    PROP_ROOT_OFFSET,
    EndType,
    HalfInfo,
    check_record,
    half_info,
    is_transactional,
    parse_op_body,
    to_half,
)
from tidemq.broker.transaction.service import TransactionConfig, TransactionService
from tidemq.errors import BrokerError, CodecError
from tidemq.message import MessageExt, SysFlag, decode_offset_msg_id, decode_record, decode_records, encode_properties
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode

from tests.broker.store.util import Clock, config, open_store, read_queue

STORE_HOST = ("127.0.0.1", 10911)
PROPS = {"TRAN_MSG": "true", "PGROUP": "pg", "UNIQ_KEY": "U1", "TAGS": "TagA", "KEYS": "k1 k2"}


def send_req(topic: str = "T", queue_id: int = 1, body: bytes = b"payload", **props: str) -> PutRequest:
    return PutRequest(topic, queue_id, body, {**PROPS, **props}, flag=3,
                      sys_flag=SysFlag.TRANSACTION_PREPARED, born_timestamp=1_700_000_000_000,
                      born_host=("10.0.0.2", 4000), store_host=STORE_HOST)


# ------------------------------------------------------------------------------------ pure parts
def test_transactional_sends_are_recognised_by_property_or_sysflag():
    assert is_transactional(0, {"TRAN_MSG": "true"})
    assert is_transactional(0, {"TRAN_MSG": "TRUE"})
    assert is_transactional(int(SysFlag.TRANSACTION_PREPARED), {})
    assert not is_transactional(0, {"TRAN_MSG": "false"})
    assert not is_transactional(int(SysFlag.TRANSACTION_COMMIT), {})


def test_half_message_goes_to_the_half_topic_with_its_real_address():
    h = to_half(send_req(DELAY="3"))
    assert (h.topic, h.queue_id) == (HALF_TOPIC, 0)
    assert h.properties["REAL_TOPIC"] == "T" and h.properties["REAL_QID"] == "1"
    assert "DELAY" not in h.properties
    assert h.sys_flag & 0xC == 0  # dispatched to the half topic's own queue


def test_op_bodies_parse_only_offsets():
    assert parse_op_body(b"42") == 42
    for bad in (b"", b"-1", b"x", b"9" * 30, b"\xff"):
        assert parse_op_body(bad) is None


@given(st.binary(max_size=40))
def test_op_body_parser_never_raises(data):
    v = parse_op_body(data)
    assert v is None or (v >= 0 and v == int(data))


@given(st.dictionaries(st.sampled_from(["REAL_TOPIC", "REAL_QID", PROP_CHECK_TIMES, PROP_IMMUNITY,
                                        PROP_ROOT_OFFSET, PROP_NOT_BEFORE, "PGROUP"]),
                       st.text(alphabet="0123456789-xT ", max_size=6)))
def test_half_info_reads_any_properties_or_refuses_with_codec_error(props):
    msg = MessageExt("RMQ_SYS_TRANS_HALF_TOPIC", b"b", 0, 5, 100, 100, 0, 0, 1, "1.2.3.4:5", 2,
                     "1.2.3.4:6", 0, 0, props, 0, "X")
    try:
        info = half_info(msg)
    except CodecError:
        assert not props.get("REAL_TOPIC") or not _is_int(props.get("REAL_QID", ""))
        return
    assert info.real_topic == props["REAL_TOPIC"] and info.check_times >= 0


def test_op_book_forgets_a_root_once_the_progress_passed_all_its_copies():
    book = OpBook()
    book.add(root=5, op_offset=0, keep_until=10)
    book.add(root=7, op_offset=1, keep_until=12)
    assert 5 in book and 7 in book
    assert book.op_progress(op_end=2) == 0
    assert book.prune(half_progress=9) == 0
    assert book.prune(half_progress=10) == 1
    assert 5 not in book and 7 in book
    assert book.op_progress(op_end=2) == 1
    book.prune(12)
    assert len(book) == 0 and book.op_progress(op_end=2) == 2


def _info(store_ts: int, check_times: int = 0, immunity_ms: int | None = None, born: int | None = None) -> HalfInfo:
    return HalfInfo(queue_offset=0, commit_log_offset=0, root=0, check_times=check_times,
                    not_before_ms=None if immunity_ms is None else store_ts + immunity_ms,
                    store_timestamp=store_ts,
                    born_timestamp=store_ts if born is None else born, group="pg", real_topic="T",
                    real_queue_id=0)


def test_judge_follows_the_clock():
    policy = CheckPolicy(timeout_ms=6000, check_max=2, max_age_ms=3_600_000)
    t0 = 1_700_000_000_000
    assert judge(_info(t0), True, t0 + 10**6, policy) is Verdict.RESOLVED
    assert judge(_info(t0), False, t0 + 5999, policy) is Verdict.WAIT
    assert judge(_info(t0), False, t0 + 6000, policy) is Verdict.CHECK
    assert judge(_info(t0, check_times=1), False, t0 + 6000, policy) is Verdict.CHECK
    assert judge(_info(t0, check_times=2), False, t0 + 5000, policy) is Verdict.WAIT
    assert judge(_info(t0, check_times=2), False, t0 + 6000, policy) is Verdict.DISCARD
    assert judge(_info(t0, born=t0 - 3_600_001), False, t0 + 6000, policy) is Verdict.DISCARD
    # CHECK_IMMUNITY_TIME_IN_SECONDS replaces the timeout; when longer, the half moves along.
    assert judge(_info(t0, immunity_ms=20_000), False, t0 + 7500, policy) is Verdict.RENEW
    assert judge(_info(t0, immunity_ms=20_000), False, t0 + 3000, policy) is Verdict.WAIT
    assert judge(_info(t0, immunity_ms=20_000), False, t0 + 20_000, policy) is Verdict.CHECK
    assert judge(_info(t0, immunity_ms=2000), False, t0 + 2000, policy) is Verdict.CHECK
    assert judge(_info(t0, immunity_ms=2000), False, t0 + 1999, policy) is Verdict.WAIT


# --------------------------------------------------------------------- service and checker
class FakeConn:
    def __init__(self, peer: str = "10.0.0.2:4000") -> None:
        self.peer = peer
        self.is_open = True
        self.sent: list[RemotingCommand] = []

    def invoke_oneway(self, cmd: RemotingCommand) -> None:
        self.sent.append(cmd)


class Rig:
    def __init__(self, root, clock: Clock, check_max: int = 3, producers=None) -> None:
        self.root = root
        self.clock = clock
        self.store = open_store(config(root), clock=clock)
        self.svc = TransactionService(self.store, TransactionConfig(timeout=6, check_interval=60,
                                                                    check_max=check_max),
                                      STORE_HOST, root / "config" / "tx.json", clock)
        self.svc.load()
        self.svc.rebuild()
        self.producers: dict[str, list[FakeConn]] = producers if producers is not None else {}
        self.checker = TransactionChecker(self.svc, lambda g: list(self.producers.get(g, [])), ask_transaction_state)

    def half(self, **props: str):
        r = self.svc.prepare(send_req(**props))
        assert r.ok
        return r

    def real(self, topic: str = "T", queue_id: int = 1):
        return read_queue(self.store, topic, queue_id)


@pytest.mark.timeout(20, func_only=True)
async def test_commit_writes_the_real_message_once_and_an_op_record(tmp_path):
    rig = Rig(tmp_path, Clock())
    r = rig.half()
    assert rig.real() == []  # invisible in the real topic
    [half] = read_queue(rig.store, HALF_TOPIC, 0)
    assert half.queue_offset == r.queue_offset == 0
    done = rig.svc.end("pg", r.queue_offset, r.physical_offset, EndType.COMMIT)
    assert done is not None and done.topic == "T"
    [m] = rig.real()
    assert (m.topic, m.queue_id, m.body, m.flag) == ("T", 1, b"payload", 3)
    assert m.sys_flag & 0xC == SysFlag.TRANSACTION_COMMIT
    assert m.prepared_transaction_offset == r.physical_offset
    assert (m.properties["UNIQ_KEY"], m.tags, m.keys) == ("U1", "TagA", ["k1", "k2"])
    assert m.born_host == "10.0.0.2:4000" and m.born_timestamp == 1_700_000_000_000
    assert not {"REAL_TOPIC", "REAL_QID", "TRAN_MSG"} & set(m.properties)
    [op] = read_queue(rig.store, OP_TOPIC, 0)
    assert (op.body, op.tags) == (b"0", "d")
    # A second commit (e.g. a check answer racing the producer's own) changes nothing.
    assert rig.svc.end("pg", r.queue_offset, r.physical_offset, EndType.COMMIT) is None
    assert len(rig.real()) == 1 and len(read_queue(rig.store, OP_TOPIC, 0)) == 1
    assert rig.svc.stats["duplicate_ends"] == 1
    assert rig.store.query_by_key("T", "k1", 10, 0, 2**62)  # the committed message is indexed
    rig.store.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_rollback_and_mismatched_ends(tmp_path):
    rig = Rig(tmp_path, Clock())
    r = rig.half()
    with pytest.raises(BrokerError, match="producer group"):
        rig.svc.end("other", r.queue_offset, r.physical_offset, EndType.COMMIT)
    with pytest.raises(BrokerError, match="state table offset"):
        rig.svc.end("pg", 7, r.physical_offset, EndType.COMMIT)
    with pytest.raises(BrokerError):
        rig.svc.end("pg", 0, r.physical_offset + 1, EndType.COMMIT)
    plain = rig.store.put(PutRequest("T", 0, b"normal", {}))
    with pytest.raises(BrokerError, match="not a half message"):
        rig.svc.end("pg", 0, plain.physical_offset, EndType.COMMIT)
    assert rig.svc.end("pg", r.queue_offset, r.physical_offset, EndType.ROLLBACK) is None
    assert rig.real() == [] and len(read_queue(rig.store, OP_TOPIC, 0)) == 1
    assert rig.svc.end("pg", r.queue_offset, r.physical_offset, EndType.COMMIT) is None
    assert rig.real() == []
    rig.store.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_open_transaction_is_checked_after_the_timeout_and_the_answer_decides(tmp_path):
    clock = Clock()
    conn = FakeConn()
    rig = Rig(tmp_path, clock, producers={"pg": [conn]})
    r = rig.half()
    clock.now += 5.9
    s = await rig.checker.check_once()
    assert (s.checked, conn.sent) == (0, [])
    assert rig.svc.half_progress == 0  # too young: the round stopped at it
    clock.now += 0.2
    s = await rig.checker.check_once()
    assert s.checked == 1
    [cmd] = conn.sent
    assert cmd.code == RequestCode.CHECK_TRANSACTION_STATE and cmd.is_oneway
    msg = decode_record(cmd.body_bytes())
    assert (msg.topic, msg.queue_id, msg.body) == ("T", 1, b"payload")
    assert msg.properties[PROP_CHECK_TIMES] == "1" and msg.properties[PROP_ROOT_OFFSET] == "0"
    assert msg.properties["PGROUP"] == "pg"
    assert cmd.get_int("tranStateTableOffset") == msg.queue_offset == 1  # the re-appended copy
    assert cmd.get_int("commitLogOffset") == msg.commit_log_offset > r.physical_offset
    assert cmd.get_str("msgId") == cmd.get_str("transactionId") == "U1"
    assert decode_offset_msg_id(cmd.get_str("offsetMsgId"))[1] == msg.commit_log_offset
    assert rig.svc.half_progress == 1
    # Not due again within the timeout.
    clock.now += 1
    assert (await rig.checker.check_once()).checked == 0
    # The producer answers COMMIT for the copy; its own late COMMIT for the original is ignored.
    rig.svc.end("pg", msg.queue_offset, msg.commit_log_offset, EndType.COMMIT, from_check=True)
    rig.svc.end("pg", r.queue_offset, r.physical_offset, EndType.COMMIT)
    [real] = rig.real()
    assert real.properties["UNIQ_KEY"] == "U1" and PROP_CHECK_TIMES not in real.properties
    clock.now += 100
    assert (await rig.checker.check_once()).checked == 0
    assert len(conn.sent) == 1
    rig.store.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_late_end_from_the_original_producer_still_counts_while_checks_go_on(tmp_path):
    clock = Clock()
    conn = FakeConn()
    rig = Rig(tmp_path, clock, producers={"pg": [conn]})
    r = rig.half()
    clock.now += 7
    assert (await rig.checker.check_once()).checked == 1
    assert rig.svc.half_progress > r.queue_offset  # the original is behind the checker now
    assert rig.svc.end("pg", r.queue_offset, r.physical_offset, EndType.COMMIT) is not None
    copy = decode_record(conn.sent[0].body_bytes())
    assert rig.svc.end("pg", copy.queue_offset, copy.commit_log_offset, EndType.COMMIT) is None
    assert len(rig.real()) == 1
    rig.store.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_without_a_producer_online_no_check_is_counted(tmp_path):
    clock = Clock()
    rig = Rig(tmp_path, clock, check_max=1)
    rig.half()
    for _ in range(3):
        clock.now += 7
        s = await rig.checker.check_once()
        assert (s.no_producer, s.checked, s.discarded) == (1, 0, 0)
    conn = FakeConn()
    rig.producers["pg"] = [conn]
    clock.now += 7
    assert (await rig.checker.check_once()).checked == 1
    assert decode_record(conn.sent[0].body_bytes()).properties[PROP_CHECK_TIMES] == "1"
    rig.store.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_after_check_max_unanswered_checks_the_half_is_discarded(tmp_path):
    clock = Clock()
    conn = FakeConn()
    rig = Rig(tmp_path, clock, check_max=3, producers={"pg": [conn]})
    r = rig.half()
    for _ in range(3):
        clock.now += 7
        assert (await rig.checker.check_once()).checked == 1
    clock.now += 7
    s = await rig.checker.check_once()
    assert (s.checked, s.discarded) == (0, 1)
    assert [int(decode_record(c.body_bytes()).properties[PROP_CHECK_TIMES]) for c in conn.sent] == [1, 2, 3]
    [dropped] = read_queue(rig.store, CHECK_MAX_TOPIC, 0)
    assert dropped.properties["UNIQ_KEY"] == "U1" and dropped.properties["REAL_TOPIC"] == "T"
    # Discarded means resolved: a late commit does nothing, later rounds stay quiet.
    assert rig.svc.end("pg", r.queue_offset, r.physical_offset, EndType.COMMIT) is None
    assert rig.real() == []
    clock.now += 7
    s = await rig.checker.check_once()
    assert (s.checked, s.discarded) == (0, 0) and len(conn.sent) == 3
    rig.store.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_check_immunity_delays_the_first_check_without_blocking_others(tmp_path):
    clock = Clock()
    conn = FakeConn()
    rig = Rig(tmp_path, clock, producers={"pg": [conn]})
    rig.half(**{PROP_IMMUNITY: "20", "UNIQ_KEY": "LATE"})
    rig.half(UNIQ_KEY="SOON")
    clock.now += 7
    s = await rig.checker.check_once()
    assert (s.renewed, s.checked) == (1, 1)
    assert [c.get_str("msgId") for c in conn.sent] == ["SOON"]
    copy = read_queue(rig.store, HALF_TOPIC, 0)[2]
    assert copy.properties[PROP_IMMUNITY] == "20" and copy.properties[PROP_ROOT_OFFSET] == "0"
    assert copy.properties[PROP_NOT_BEFORE] == str(int((clock.now - 7 + 20) * 1000))
    for step in (6.5, 6.4):  # renewed again, its deadline unchanged (no drift)
        clock.now += step
        s = await rig.checker.check_once()
        assert s.renewed == 1 and "LATE" not in [c.get_str("msgId") for c in conn.sent]
    clock.now += 0.1  # 20 s after the first store
    await rig.checker.check_once()
    assert [c.get_str("msgId") for c in conn.sent] == ["SOON", "SOON", "SOON", "LATE"]
    rig.store.close_abruptly()


@pytest.mark.timeout(20, func_only=True)
async def test_progress_and_op_book_survive_a_restart(tmp_path):
    clock = Clock()
    conn = FakeConn()
    rig = Rig(tmp_path, clock, producers={"pg": [conn]})
    a = rig.half(UNIQ_KEY="A")
    rig.half(UNIQ_KEY="B")
    c = rig.half(UNIQ_KEY="C")
    rig.svc.end("pg", a.queue_offset, a.physical_offset, EndType.COMMIT)
    clock.now += 7
    s = await rig.checker.check_once()  # B and C are open: checked; A is resolved
    assert s.checked == 2
    rig.svc.end("pg", c.queue_offset, c.physical_offset, EndType.ROLLBACK)  # C answered late
    await rig.svc.persist()
    rig.store.close_abruptly()

    again = Rig(tmp_path, clock, producers={"pg": [conn]})
    assert again.svc.half_progress == rig.svc.half_progress == 3
    assert 2 in again.svc.book and 0 not in again.svc.book  # C's op replayed; A's pruned
    assert again.svc.open == {1: 3}  # B was checked: its copy at 3 is ahead of the checker
    # A late END for A (resolved, forgotten by the book) still writes nothing.
    assert again.svc.end("pg", a.queue_offset, a.physical_offset, EndType.COMMIT) is None
    clock.now += 7
    s = await again.checker.check_once()
    assert s.checked == 1  # only B again: C's copy is resolved through its root
    assert conn.sent[-1].get_str("msgId") == "B"
    # B resolved through its latest copy commits exactly once.
    b_copy = decode_record(conn.sent[-1].body_bytes())
    again.svc.end("pg", b_copy.queue_offset, b_copy.commit_log_offset, EndType.COMMIT)
    assert [m.properties["UNIQ_KEY"] for m in again.real()] == ["A", "B"]
    again.store.close_abruptly()


def test_check_request_body_round_trips_a_compressed_half(tmp_path):
    clock = Clock()
    rig = Rig(tmp_path, clock)
    req = send_req(body=b"zz")
    req.sys_flag |= SysFlag.COMPRESSED
    r = rig.svc.prepare(req)
    half = decode_record(rig.store.read_record(r.physical_offset))
    cmd = check_request(half, check_record(half))
    assert (cmd.code, cmd.is_oneway) == (RequestCode.CHECK_TRANSACTION_STATE, True)
    assert cmd.ext_fields["commitLogOffset"] == str(half.commit_log_offset)
    assert cmd.ext_fields["msgId"] == cmd.ext_fields["transactionId"] == half.properties["UNIQ_KEY"]
    back = decode_record(cmd.body_bytes())
    assert back.sys_flag & SysFlag.COMPRESSED and back.body == b"zz" and back.body_crc == half.body_crc
    assert back.store_host == "127.0.0.1:10911" and back.born_host == "10.0.0.2:4000"
    info = half_info(half)
    assert (info.real_topic, info.real_queue_id, info.group, info.root) == ("T", 1, "pg", 0)
    rig.store.close_abruptly()


# ------------------------------------------------------------------------------ real broker
def _send_cmd(topic: str, body: bytes, props: dict[str, str], sys_flag: int = 0) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
        "a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": sys_flag,
        "g": int(time.time() * 1000), "h": 0, "i": encode_properties(props), "j": 0,
    }, body)


def _end_cmd(group: str, queue_offset: int, offset_msg_id: str, kind: int, oneway: bool) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.END_TRANSACTION, {
        "producerGroup": group, "tranStateTableOffset": queue_offset,
        "commitLogOffset": decode_offset_msg_id(offset_msg_id)[1], "commitOrRollback": kind,
        "fromTransactionCheck": False, "msgId": "x",
    }, oneway=oneway)


def _pull_cmd(topic: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "g1", "topic": topic, "queueId": 0, "queueOffset": 0, "maxMsgNums": 32,
        "sysFlag": 0x4, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*",
        "subVersion": 0,
    })


async def test_broker_keeps_halves_invisible_until_end_transaction(cluster_factory):
    c = cluster_factory(extra_broker_args=["--transaction-check-interval", "600"])
    topic = f"txw_{uuid.uuid4().hex[:6]}"
    c.create_topic(topic, queues=1)

    cl = RemotingClient()
    try:
        addr = c.broker_addr
        props = {"TRAN_MSG": "true", "PGROUP": "pg", "UNIQ_KEY": "K1", "TAGS": "TagA"}
        h1 = await cl.invoke(addr, _send_cmd(topic, b"one", props, 0x4), 3)
        h2 = await cl.invoke(addr, _send_cmd(topic, b"two", {**props, "UNIQ_KEY": "K2"}), 3)
        before = await cl.invoke(addr, _pull_cmd(topic), 3)
        commit = await cl.invoke(addr, _end_cmd("pg", int(h1.ext_fields["queueOffset"]), h1.ext_fields["msgId"], 8, False), 3)
        wrong = await cl.invoke(addr, _end_cmd("nope", int(h2.ext_fields["queueOffset"]), h2.ext_fields["msgId"], 8, False), 3)
        await cl.invoke_oneway(addr, _end_cmd("pg", int(h2.ext_fields["queueOffset"]), h2.ext_fields["msgId"], 12, True))
        batch = await cl.invoke(addr, RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, {
            "a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 0, "h": 0,
            "i": encode_properties({"TRAN_MSG": "true"}), "j": 0, "m": "true"}, b"\0" * 30), 3)
        after = await cl.invoke(addr, _pull_cmd(topic), 3)
        topics = await cl.invoke(addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG), 3)
        half_pull = await cl.invoke(addr, _pull_cmd(HALF_TOPIC), 3)
    finally:
        await cl.close()

    assert h1.code == h2.code == ResponseCode.SUCCESS
    assert (h1.ext_fields["queueId"], h1.ext_fields["queueOffset"], h2.ext_fields["queueOffset"]) == ("0", "0", "1")
    assert before.code == ResponseCode.PULL_NOT_FOUND
    assert commit.code == ResponseCode.SUCCESS
    assert wrong.code == ResponseCode.SYSTEM_ERROR and "producer group" in wrong.remark
    assert batch.code == ResponseCode.MESSAGE_ILLEGAL
    assert after.code == ResponseCode.SUCCESS
    [m] = decode_records(after.body_bytes())
    assert (m.body, m.properties["UNIQ_KEY"], m.tags) == (b"one", "K1", "TagA")
    assert m.prepared_transaction_offset == decode_offset_msg_id(h1.ext_fields["msgId"])[1]
    table = orjson.loads(topics.body_bytes())["topicConfigTable"]
    assert not {HALF_TOPIC, OP_TOPIC, CHECK_MAX_TOPIC} & set(table)
    assert half_pull.code == ResponseCode.TOPIC_NOT_EXIST


@pytest.mark.timeout(20, func_only=True)
async def test_a_progress_file_ahead_of_the_store_is_clamped(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "tx.json").write_text('{"halfOffset": 99, "opOffset": 42}')
    clock = Clock()
    conn = FakeConn()
    rig = Rig(tmp_path, clock, producers={"pg": [conn]})
    assert (rig.svc.half_progress, len(rig.svc.book)) == (0, 0)
    rig.half()
    clock.now += 7
    assert (await rig.checker.check_once()).checked == 1
    rig.store.close_abruptly()


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
