"""Issue 14: attacks on a broker with ACL on, replayed with raw remoting frames against real
processes (the attack table in docs/reliability.md). Each test failed before the fix it names.

Accounts: ADMIN (admin), DENY_ALL (every topic and group DENY), APP (group SUB by default, topic
aclT PUB|SUB, topic denyT and group otherG DENY), HOG (topics and groups SUB, for the creation
limits). The broker allows 40 implicit creations per account and hour.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
import uuid
import zlib
from pathlib import Path

import orjson
import pytest

from tests.procs import Cluster
from tidemq.client import ClientConfig
from tidemq.client.sync import SyncAdmin
from tidemq.message import decode_offset_msg_id, decode_records, encode_batch, encode_properties
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.acl import AclSigner

ADMIN = ("adminKey01", "admin-secret-0001")
DENY_ALL = ("denyAll01", "deny-secret-0002")
APP = ("appKey0001", "app-secret-0003")
HOG = ("hogKey0001", "hog-secret-0004")

ACL = f"""accounts:
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
  - accessKey: {DENY_ALL[0]}
    secretKey: {DENY_ALL[1]}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
  - accessKey: {APP[0]}
    secretKey: {APP[1]}
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - aclT=PUB|SUB
      - denyT=DENY
    groupPerms:
      - otherG=DENY
  - accessKey: {HOG[0]}
    secretKey: {HOG[1]}
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
"""
IMPLICIT_LIMIT = 40


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("attacks")
    path = root / "plain_acl.yml"
    path.write_text(ACL)
    c = Cluster(root, extra_broker_args=[
        "--acl-file", str(path), "--implicit-create-limit", str(IMPLICIT_LIMIT),
        "--implicit-create-window", "3600", "--max-topics", "1000", "--max-groups", "1000"])
    try:
        c.start()
    except Exception:  # noqa: BLE001 (whatever failed, stop what started, then say why with the log)
        c.stop()
        raise RuntimeError(f"cluster did not start:\n{c.broker.log()[-3000:]}")
    admin_config = ClientConfig(name_servers=c.namesrv_addr, access_key=ADMIN[0], secret_key=ADMIN[1])
    with SyncAdmin(config=admin_config) as admin:
        for topic in ("aclT", "denyT"):
            assert admin.create_topic(topic, 2, 2, broker_addr=c.broker_addr) == [c.broker_addr]
    yield c
    c.stop()


async def calls(addr: str, cmds: list[RemotingCommand], creds, timeout: float = 10.0) -> list[RemotingCommand]:
    """``cmds`` one after another on one connection signed with ``creds`` (None: unsigned)."""
    client = RemotingClient(rpc_hook=AclSigner(*creds) if creds else None)
    try:
        return [await client.invoke(addr, cmd, timeout) for cmd in cmds]
    finally:
        await client.close()


async def call(addr: str, cmd: RemotingCommand, creds, timeout: float = 10.0) -> RemotingCommand:
    return (await calls(addr, [cmd], creds, timeout))[0]


def send_v2(topic: str, body: bytes = b"payload", props: dict[str, str] | None = None, group: str | None = None,
            code: int = RequestCode.SEND_MESSAGE_V2, sys_flag: int = 0) -> RemotingCommand:
    header = {"b": topic, "c": "TBW102", "d": 4, "e": -1, "f": sys_flag, "g": int(time.time() * 1000), "h": 0,
              "i": encode_properties(props or {}), "j": 0}
    if group is not None:
        header["a"] = group
    return RemotingCommand.request(code, header, body)


def heartbeat(groups: list[str], topic: str = "aclT") -> RemotingCommand:
    body = {"clientID": f"attacker@{uuid.uuid4().hex[:6]}", "producerDataSet": [], "consumerDataSet": [
        {"groupName": g, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
         "subscriptionDataSet": [{"topic": topic, "subString": "*", "subVersion": 1}]} for g in groups]}
    return RemotingCommand.request(RequestCode.HEART_BEAT, None, orjson.dumps(body))


async def topic_names(c: Cluster) -> set[str]:
    resp = await call(c.broker_addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG), ADMIN)
    return set(orjson.loads(resp.body_bytes())["topicConfigTable"])


async def group_names(c: Cluster) -> set[str]:
    resp = await call(c.broker_addr, RemotingCommand.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG), ADMIN)
    return set(orjson.loads(resp.body_bytes())["subscriptionGroupTable"])


async def max_offset(c: Cluster, topic: str, queue: int) -> int:
    resp = await call(c.broker_addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": queue}),
                ADMIN)
    return int(resp.ext_fields["offset"])


async def total_messages(c: Cluster, topic: str, queues: int = 2) -> int:
    return sum([await max_offset(c, topic, q) for q in range(queues)])


async def admin_send(c: Cluster, topic: str, body: bytes = b"secret", props: dict[str, str] | None = None,
               sys_flag: int = 0) -> RemotingCommand:
    resp = await call(c.broker_addr, send_v2(topic, body, props, group="adminPG", sys_flag=sys_flag), ADMIN)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return resp


def acl_refused(resp: RemotingCommand) -> bool:
    return resp.code == ResponseCode.SYSTEM_ERROR and (resp.remark or "").startswith("AclException")


async def still_serves(c: Cluster) -> None:
    body = uuid.uuid4().hex.encode()
    before = await total_messages(c, "aclT")
    assert (await call(c.broker_addr, send_v2("aclT", body, group="appPG"), APP)).code == ResponseCode.SUCCESS
    assert await total_messages(c, "aclT") == before + 1


# ---------------------------------------------------------------------------------------- high
async def test_all_deny_account_cannot_create_retry_topics(acl_cluster):
    """Item 1: a send to %RETRY%<x> without a producer group passed the ACL and created a topic
    and a group per name (50,000 took the broker down)."""
    c = acl_cluster
    names = [f"%RETRY%evil{i}_{uuid.uuid4().hex[:4]}" for i in range(30)]
    answers = await calls(c.broker_addr, [send_v2(t) for t in names], DENY_ALL)
    assert all(acl_refused(a) for a in answers), [(a.code, a.remark) for a in answers[:3]]
    assert not set(names) & await topic_names(c)
    assert not {n[len("%RETRY%"):] for n in names} & await group_names(c)
    await still_serves(c)


async def test_heartbeat_with_huge_group_names_is_refused_and_creates_nothing(acl_cluster):
    """Item 2: 90 groups of 100,000 characters in one heartbeat grew topics.json to 18 MB."""
    c = acl_cluster
    groups = [f"g{i}" + "x" * 100_000 for i in range(90)]
    resp = await call(c.broker_addr, heartbeat(groups), HOG, timeout=30)
    assert resp.code == ResponseCode.SYSTEM_ERROR
    assert "longer than group max length 255" in resp.remark and len(resp.remark) < 400
    assert not any(len(t) > 300 for t in await topic_names(c))
    assert not any(len(g) > 300 for g in await group_names(c))
    topics_json = c.store_dir / "config" / "topics.json"
    assert topics_json.stat().st_size < 100_000
    await still_serves(c)


@pytest.mark.parametrize("name", ["bad group", "new\nline", "", "x" * 256, "%RETRY%nested", "semi;colon", "dot.ted"])
async def test_invalid_group_names_are_refused_everywhere(acl_cluster, name):
    """Group names enter through heartbeats, admin updates, send-backs, offsets and pulls: each
    refuses a name outside RocketMQ's rules and creates nothing."""
    c = acl_cluster
    before = await group_names(c)
    hb = await call(c.broker_addr, heartbeat([name or " "]), HOG)
    assert hb.code == ResponseCode.SYSTEM_ERROR and "group" in hb.remark
    sub = await call(c.broker_addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None,
                                                      orjson.dumps({"groupName": name})), ADMIN)
    assert sub.code == ResponseCode.SYSTEM_ERROR and "group" in sub.remark
    pull = await call(c.broker_addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": name or " ", "topic": "aclT", "queueId": 0, "queueOffset": 0, "maxMsgNums": 1,
        "sysFlag": 0x4, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0}), HOG)
    assert pull.code in (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, ResponseCode.SYSTEM_ERROR), pull.remark
    off = await call(c.broker_addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": name or " ", "topic": "aclT", "queueId": 0, "commitOffset": 0}), HOG)
    assert off.code == ResponseCode.SYSTEM_ERROR
    back = await call(c.broker_addr, RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, {
        "group": name or " ", "offset": 0, "delayLevel": 0, "originMsgId": "x", "originTopic": "aclT"}), HOG)
    assert back.code != ResponseCode.SUCCESS
    assert await group_names(c) == before


async def test_implicit_creation_is_bounded_per_account_and_the_broker_restarts(acl_cluster):
    """Implicit creation (first heartbeat of a group: the group and its retry topic) stops at the
    account's window limit with a clear refusal; other accounts keep working; the counts are
    exported; the broker restarts on what it wrote."""
    c = acl_cluster
    answers = await calls(c.broker_addr, [heartbeat([f"hog{i}_{uuid.uuid4().hex[:4]}"]) for i in range(IMPLICIT_LIMIT)],
                    HOG)
    ok = [a for a in answers if a.code == ResponseCode.SUCCESS]
    refused = [a for a in answers if a.code != ResponseCode.SUCCESS]
    assert len(ok) == IMPLICIT_LIMIT // 2  # a group and its retry topic each
    assert refused and all("implicitCreateLimit" in a.remark and "retry later" in a.remark for a in refused)
    assert len([g for g in await group_names(c) if g.startswith("hog")]) == IMPLICIT_LIMIT // 2
    await still_serves(c)  # APP's budget is its own
    mine = await call(c.broker_addr, heartbeat([f"appG{uuid.uuid4().hex[:4]}"]), APP)
    assert mine.code == ResponseCode.SUCCESS, mine.remark
    text = urllib.request.urlopen(c.metrics_url, timeout=10).read().decode()
    assert re.search(r'tidemq_broker_creation_refusals_total\{[^}]*limit="rate"[^}]*\} ([0-9.]+)', text)
    assert float(re.search(r'tidemq_broker_creation_refusals_total\{[^}]*limit="rate"[^}]*\} ([0-9.]+)',
                           text).group(1)) >= len(refused)
    assert re.search(r"tidemq_broker_subscription_groups_limit\{[^}]*\} 1000", text)
    assert re.search(r"tidemq_broker_register_parts\{[^}]*\} 1\.0", text)  # the table fits one request
    c.restart_broker()
    await still_serves(c)


async def test_total_topic_limit_refuses_admin_and_auto_creation(cluster_factory):
    c = cluster_factory(extra_broker_args=["--auto-create-topic", "--max-topics", "20",
                                           "--implicit-create-limit", "1000"])
    statuses = []
    for i in range(30):
        r = await call(c.broker_addr, send_v2(f"auto{i}", group="pg"), None)
        statuses.append((r.code, r.remark))
    created = [s for s in statuses if s[0] == ResponseCode.SUCCESS]
    refused = [s for s in statuses if s[0] != ResponseCode.SUCCESS]
    assert created and refused
    assert all(code == ResponseCode.TOPIC_NOT_EXIST and "maxTopicCount" in remark for code, remark in refused)
    admin = await call(c.broker_addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": "oneMore", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}), None)
    assert admin.code == ResponseCode.SYSTEM_ERROR and "maxTopicCount" in admin.remark
    assert (await call(c.broker_addr, send_v2("auto0", group="pg"), None)).code == ResponseCode.SUCCESS
    c.restart_broker()
    assert (await call(c.broker_addr, send_v2("auto0", group="pg"), None)).code == ResponseCode.SUCCESS


# -------------------------------------------------------------------------------------- medium
async def test_reply_to_a_denied_topic_is_refused_and_not_stored(acl_cluster):
    """Item 3: SEND_REPLY_MESSAGE(_V2) to a DENY topic was stored although answered an error."""
    c = acl_cluster
    before = await total_messages(c, "denyT")
    props = {"REPLY_TO_CLIENT": "nobody@1", "CORRELATION_ID": "c1", "MSG_TYPE": "reply"}
    v2 = await call(c.broker_addr, send_v2("denyT", b"forged", props, group="appPG", code=RequestCode.SEND_REPLY_MESSAGE_V2),
              APP)
    v1 = await call(c.broker_addr, RemotingCommand.request(RequestCode.SEND_REPLY_MESSAGE, {
        "producerGroup": "appPG", "topic": "denyT", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
        "queueId": 0, "sysFlag": 0, "bornTimestamp": 0, "flag": 0, "properties": encode_properties(props),
        "reconsumeTimes": 0}, b"forged"), APP)
    assert acl_refused(v2) and acl_refused(v1)
    assert await total_messages(c, "denyT") == before


async def test_sends_into_another_groups_retry_topic_are_refused(acl_cluster):
    """Item 4: the retry topic's own group is checked, whatever (or whether) the header names."""
    c = acl_cluster
    admin_hb = await call(c.broker_addr, heartbeat(["otherG"]), ADMIN)
    assert admin_hb.code == ResponseCode.SUCCESS
    before = await max_offset(c, "%RETRY%otherG", 0)
    for group in ("appG", None):
        resp = await call(c.broker_addr, send_v2("%RETRY%otherG", b"injected", group=group), APP)
        assert acl_refused(resp), resp.remark
    assert await max_offset(c, "%RETRY%otherG", 0) == before


async def test_view_message_by_id_of_a_denied_topic_is_refused(acl_cluster):
    """Item 5: VIEW_MESSAGE_BY_ID returned a DENY topic's message."""
    c = acl_cluster
    sent = await admin_send(c, "denyT", b"top-secret")
    offset = decode_offset_msg_id(sent.ext_fields["msgId"])[1]
    view = RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
    resp = await call(c.broker_addr, view, APP)
    assert acl_refused(resp) and b"top-secret" not in resp.body_bytes()
    mine = await admin_send(c, "aclT", b"mine")
    ok = await call(c.broker_addr, RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {
        "offset": decode_offset_msg_id(mine.ext_fields["msgId"])[1]}), APP)
    assert ok.code == ResponseCode.SUCCESS and decode_records(ok.body_bytes())[0].body == b"mine"


async def test_send_back_of_a_denied_topics_message_is_refused(acl_cluster):
    """Item 6: CONSUMER_SEND_MSG_BACK copied any commit-log offset into the caller's retry topic."""
    c = acl_cluster
    group = f"appBack{uuid.uuid4().hex[:4]}"
    assert (await call(c.broker_addr, heartbeat([group]), APP)).code == ResponseCode.SUCCESS
    sent = await admin_send(c, "denyT", b"top-secret-2")
    offset = decode_offset_msg_id(sent.ext_fields["msgId"])[1]
    resp = await call(c.broker_addr, RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, {
        "group": group, "offset": offset, "delayLevel": -1, "originMsgId": sent.ext_fields["msgId"],
        "originTopic": "aclT", "maxReconsumeTimes": 16}), APP)
    assert acl_refused(resp), resp.remark
    assert f"%DLQ%{group}" not in await topic_names(c) or await max_offset(c, f"%DLQ%{group}", 0) == 0


async def test_end_transaction_needs_pub_on_the_half_messages_topic(acl_cluster):
    """Item 7: END_TRANSACTION by an account without PUB on the topic committed another
    producer's half message."""
    c = acl_cluster
    before = await total_messages(c, "denyT")
    half = await admin_send(c, "denyT", b"pending", {"TRAN_MSG": "true", "PGROUP": "txPG", "UNIQ_KEY": uuid.uuid4().hex},
                      sys_flag=0x4)
    end = RemotingCommand.request(RequestCode.END_TRANSACTION, {
        "producerGroup": "txPG", "tranStateTableOffset": int(half.ext_fields["queueOffset"]),
        "commitLogOffset": decode_offset_msg_id(half.ext_fields["msgId"])[1], "commitOrRollback": 8,
        "fromTransactionCheck": False, "msgId": half.ext_fields["msgId"]})
    resp = await call(c.broker_addr, end, APP)
    assert resp.code == ResponseCode.SYSTEM_ERROR and "AclException" in resp.remark
    assert await total_messages(c, "denyT") == before
    ok = await call(c.broker_addr, end, ADMIN)  # the half message is still there for its owner
    assert ok.code == ResponseCode.SUCCESS, ok.remark
    assert await total_messages(c, "denyT") == before + 1


# ------------------------------------------------------------------------------------------ low
async def test_consumer_offsets_refuse_bad_queues_and_keep_the_offset_on_minus_one(acl_cluster):
    """UPDATE_CONSUMER_OFFSET accepted queueId -7; commitOffset -1 was answered SYSTEM_ERROR
    (Java answers SUCCESS and keeps the stored offset)."""
    c = acl_cluster
    group = f"appOff{uuid.uuid4().hex[:4]}"

    async def commit(queue: int, offset: int) -> RemotingCommand:
        return await call(c.broker_addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": group, "topic": "aclT", "queueId": queue, "commitOffset": offset}), APP)

    async def query() -> RemotingCommand:
        return await call(c.broker_addr, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, {
            "consumerGroup": group, "topic": "aclT", "queueId": 1}), APP)

    assert (await commit(1, 0)).code == ResponseCode.SUCCESS
    for queue in (-7, 2, 1 << 20):
        bad = await commit(queue, 0)
        assert bad.code == ResponseCode.SYSTEM_ERROR and "queueId" in bad.remark
    await admin_send(c, "aclT", b"a")
    assert (await commit(1, 1)).code == ResponseCode.SUCCESS
    keep = await commit(1, -1)
    assert keep.code == ResponseCode.SUCCESS, keep.remark
    assert int((await query()).ext_fields["offset"]) == 1


async def test_heartbeat_answers_after_the_new_retry_topic_is_routable(acl_cluster):
    """Java registers a heartbeat's new %RETRY% topic with the name servers before answering; a
    client asking for that route right after its heartbeat must find it."""
    c = acl_cluster
    group = f"appRoute{uuid.uuid4().hex[:4]}"
    assert (await call(c.broker_addr, heartbeat([group]), APP)).code == ResponseCode.SUCCESS
    route = await call(c.namesrv_addr, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                         {"topic": f"%RETRY%{group}"}), None)
    assert route.code == ResponseCode.SUCCESS, route.remark


async def test_a_newline_in_a_name_cannot_forge_a_log_line(acl_cluster):
    c = acl_cluster
    marker = f"FORGED{uuid.uuid4().hex[:6]}"
    await call(c.broker_addr, heartbeat([f"x\n{marker} ERROR everything is fine"]), HOG)
    await call(c.broker_addr, send_v2(f"t\n{marker}"), HOG)
    await asyncio.sleep(0.3)
    log = Path(c.root / "broker.log").read_text(errors="replace")
    assert not any(line.startswith(marker) for line in log.splitlines())


# ------------------------------------------------------------------ found by the second review
async def test_a_reply_header_naming_two_topics_cannot_split_the_check_from_the_write(acl_cluster):
    """V2 reply headers with both ``b`` and ``topic`` (or an empty ``b``): the ACL checked one
    name and the processor wrote to the other."""
    c = acl_cluster
    before = await total_messages(c, "denyT")
    props = encode_properties({"REPLY_TO_CLIENT": "nobody@1", "CORRELATION_ID": "c2", "MSG_TYPE": "reply"})
    for b in ("aclT", ""):
        cmd = send_v2(b, b"forged", group="appPG", code=RequestCode.SEND_REPLY_MESSAGE_V2)
        cmd.ext_fields["topic"] = "denyT"
        cmd.ext_fields["i"] = props
        await call(c.broker_addr, cmd, APP)
    assert await total_messages(c, "denyT") == before


@pytest.mark.parametrize("topic", ["SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer", "RMQ_SYS_TRANS_HALF_TOPIC"])
async def test_topics_holding_other_topics_messages_are_admin_only(acl_cluster, topic):
    """A default topic permission reached the delay, timer and half-message topics: their pulls
    and key queries returned a DENY topic's messages."""
    c = acl_cluster
    key = uuid.uuid4().hex
    props = {"KEYS": key, "UNIQ_KEY": uuid.uuid4().hex}
    if topic == "SCHEDULE_TOPIC_XXXX":
        props["DELAY"] = "5"
    elif topic == "rmq_sys_wheel_timer":
        props["TIMER_DELAY_MS"] = "600000"
    else:
        props.update({"TRAN_MSG": "true", "PGROUP": "txPG2"})
    await admin_send(c, "denyT", b"held-secret", props, sys_flag=0x4 if "TRAN_MSG" in props else 0)
    query = RemotingCommand.request(RequestCode.QUERY_MESSAGE, {
        "topic": topic, "key": key, "maxNum": 32, "beginTimestamp": 0, "endTimestamp": int(time.time() * 1000) + 60_000})
    pulls = [RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "hogReader", "topic": topic, "queueId": q, "queueOffset": 0, "maxMsgNums": 32,
        "sysFlag": 0x4, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0})
        for q in range(4)]
    for resp in await calls(c.broker_addr, [query, *pulls], HOG):
        assert acl_refused(resp) and b"held-secret" not in resp.body_bytes(), (resp.code, resp.remark)


async def test_viewing_your_own_delayed_message_is_allowed(acl_cluster):
    """The stored-message check looks at the topic a delayed message was sent to, not at the
    delay topic that holds it (a regression of the first fix)."""
    c = acl_cluster
    sent = await call(c.broker_addr, send_v2("aclT", b"later", {"DELAY": "5"}, group="appPG"), APP)
    assert sent.code == ResponseCode.SUCCESS, sent.remark
    view = await call(c.broker_addr, RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {
        "offset": decode_offset_msg_id(sent.ext_fields["msgId"])[1]}), APP)
    assert view.code == ResponseCode.SUCCESS, view.remark


async def test_heartbeats_cannot_grow_the_client_registry_without_bound(acl_cluster):
    """Producer groups are not ACL-checked (as RocketMQ), so an all-DENY account filled memory
    with 50,000 producer groups per heartbeat (684 MB after 20)."""
    c = acl_cluster

    def producers(names: list[str]) -> RemotingCommand:
        body = {"clientID": f"p@{uuid.uuid4().hex[:6]}", "consumerDataSet": [],
                "producerDataSet": [{"groupName": n} for n in names]}
        return RemotingCommand.request(RequestCode.HEART_BEAT, None, orjson.dumps(body))

    big = await call(c.broker_addr, producers([f"pg{i}" for i in range(5000)]), DENY_ALL)
    assert big.code == ResponseCode.SYSTEM_ERROR and "more than 256" in big.remark
    # one connection, many heartbeats of 200 new groups each: the per-connection bound holds
    answers = await calls(c.broker_addr, [producers([f"pg{j}_{i}" for i in range(200)]) for j in range(3)], DENY_ALL)
    assert answers[0].code == ResponseCode.SUCCESS
    assert all(a.code == ResponseCode.SYSTEM_ERROR and "groups" in a.remark for a in answers[1:])
    await still_serves(c)


async def test_pipelined_big_compressed_batches_do_not_stall_other_clients(cluster_factory):
    """Sixteen 1.8 KB compressed batches of 32,767 messages each, sent at once on one connection: they
    were inflated, decoded and stored in one loop turn (a 2.8 s stall with 40 of them). Now each
    is prepared in slices, one at a time, and another client's requests are answered meanwhile."""
    c = cluster_factory()
    assert (await call(c.broker_addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": "bigB", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}), None)).code == 0
    body = zlib.compress(encode_batch([(0, b"x", "")] * 32_767))
    header = {"a": "pg", "b": "bigB", "c": "TBW102", "d": 4, "e": 0, "f": 1, "g": 0, "h": 0, "i": "", "j": 0,
              "m": "true"}

    sender, other = RemotingClient(), RemotingClient()
    try:
        await other.invoke(c.broker_addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {
            "topic": "bigB", "queueId": 0}), 10)
        waits: list[float] = []

        async def ping():
            for _ in range(60):
                t = time.perf_counter()
                await other.invoke(c.broker_addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {
                    "topic": "bigB", "queueId": 0}), 30)
                waits.append(time.perf_counter() - t)
                await asyncio.sleep(0.01)

        pinger = asyncio.create_task(ping())
        await asyncio.sleep(0.05)
        answers = await asyncio.gather(*[sender.invoke(c.broker_addr, RemotingCommand.request(
            RequestCode.SEND_BATCH_MESSAGE, header, body), 60) for _ in range(16)])
        await pinger
    finally:
        await sender.close()
        await other.close()

    stored = sum(1 for a in answers if a.code == ResponseCode.SUCCESS)
    assert stored >= 1 and all(a.code in (ResponseCode.SUCCESS, ResponseCode.SYSTEM_BUSY) for a in answers)
    assert await max_offset(c, "bigB", 0) == stored * 32_767  # whole batches only
    assert max(waits) < 0.8, f"another client waited {max(waits):.2f} s"
