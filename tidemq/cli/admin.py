"""`tidemq admin ...`: RocketMQ mqadmin's commands with its flag letters."""

from __future__ import annotations

import asyncio
import datetime as dt
import string
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

import click
import orjson

from tidemq.cli.common import client_config, run_async, user_errors
from tidemq.client import Admin
from tidemq.client.route import ClusterInfo
from tidemq.client.validation import DLQ_GROUP_TOPIC_PREFIX, NOT_ALLOWED_SEND_TOPICS, RETRY_GROUP_TOPIC_PREFIX
from tidemq.errors import AdminError, ClientError, TideMQError
from tidemq.message import MessageExt
from tidemq.remoting.headers.admin import decode_attributes
from tidemq.remoting.headers.replica import HA_EPOCH, HA_IN_SYNC, HA_REPLICA_ID, HA_ROLE, MAX_REPLICA_ID

T = TypeVar("T")

SWITCHOVER_POLL = 0.2  # s between reads of the name servers' cluster info while a switchover settles

namesrv_option = click.option(
    "-n", "--namesrvAddr", "namesrv", envvar="NAMESRV_ADDR", required=True,
    help="Name server address(es), ADDR[;ADDR] (also $NAMESRV_ADDR).",
)


def _with_admin(namesrv: str, fn: Callable[[Admin], Awaitable[T]]) -> T:
    addrs = [a for a in namesrv.replace(",", ";").split(";") if a.strip()]

    async def main() -> T:
        async with Admin(name_servers=addrs, config=client_config()) as admin:
            return await fn(admin)

    return run_async(main)


@overload
def _bool(value: str, name: str) -> bool: ...
@overload
def _bool(value: None, name: str) -> None: ...
def _bool(value: str | None, name: str) -> bool | None:
    if value is None:
        return None
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise click.BadParameter(f"{value!r} is not true or false", param_hint=name)


def _target(cluster: str | None, broker: str | None) -> dict[str, str | None]:
    if bool(cluster) == bool(broker):
        raise click.UsageError("give exactly one of -c CLUSTER or -b BROKER_ADDR")
    return {"cluster": cluster, "broker_addr": broker}


def _ts(ms: int) -> str:
    if ms <= 0:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


@click.group("admin")
def admin_group() -> None:
    """Administer topics, groups and clusters (mqadmin-compatible flags)."""


@admin_group.command("updateTopic")
@namesrv_option
@click.option("-c", "--clusterName", "cluster", help="Create/update on every master of this cluster.")
@click.option("-b", "--brokerAddr", "broker", help="Create/update on this broker only.")
@click.option("-t", "--topic", required=True)
@click.option("-r", "--readQueueNums", "read", type=click.IntRange(1, 1024), default=8, show_default=True)
@click.option("-w", "--writeQueueNums", "write", type=click.IntRange(1, 1024), default=8, show_default=True)
@click.option("-p", "--perm", type=click.Choice(["2", "4", "6"]), default="6", show_default=True, help="2 write, 4 read, 6 both.")
@click.option("-o", "--order", default=None, help="true|false")
@click.option("-a", "--attributes", default=None,
              help="RocketMQ 5 topic attributes: +key=value sets, -key removes, comma-separated "
                   "(e.g. +message.type=FIFO); those not named keep their value.")
@user_errors
def update_topic(namesrv, cluster, broker, topic, read, write, perm, order, attributes) -> None:
    """Create or update a topic."""
    target = _target(cluster, broker)
    is_order = _bool(order, "-o") or False
    try:  # checked here, as a broker would refuse it, before anything is sent
        changes = dict(decode_attributes(attributes or ""))
    except ValueError as exc:
        raise click.BadParameter(f"{exc} (write +key=value,-key2)", param_hint="'-a' / '--attributes'") from None
    done = _with_admin(namesrv, lambda a: a.create_topic(topic, read_queues=read, write_queues=write, perm=int(perm), order=is_order,
                                                          cluster=target["cluster"], broker_addr=target["broker_addr"],
                                                          attributes=changes or None))
    for addr in done:
        click.echo(f"create topic to {addr} success.")
    shown = f", attributes={attributes}" if changes else ""
    click.echo(f"TopicConfig [topicName={topic}, readQueueNums={read}, writeQueueNums={write}, perm={perm}, order={is_order}{shown}]")


@admin_group.command("deleteTopic")
@namesrv_option
@click.option("-c", "--clusterName", "cluster", required=True)
@click.option("-t", "--topic", required=True)
@user_errors
def delete_topic(namesrv, cluster, topic) -> None:
    """Delete a topic from every broker of a cluster and from the name servers."""
    _with_admin(namesrv, lambda a: a.delete_topic(topic, cluster))
    click.echo(f"delete topic [{topic}] from cluster [{cluster}] success.")


@admin_group.command("topicList")
@namesrv_option
@user_errors
def topic_list(namesrv) -> None:
    """List every topic the name servers know."""
    for t in sorted(_with_admin(namesrv, lambda a: a.topic_list())):
        click.echo(t)


@admin_group.command("topicRoute")
@namesrv_option
@click.option("-t", "--topic", required=True)
@user_errors
def topic_route(namesrv, topic) -> None:
    """Show a topic's route (brokers and queues) as JSON."""
    route = _with_admin(namesrv, lambda a: a.topic_route(topic))
    click.echo(orjson.dumps(route.to_json(), option=orjson.OPT_INDENT_2).decode())


@admin_group.command("topicStatus")
@namesrv_option
@click.option("-t", "--topic", required=True)
@user_errors
def topic_status(namesrv, topic) -> None:
    """Show min/max offsets and last update time of every queue of a topic."""
    rows = _with_admin(namesrv, lambda a: a.topic_status(topic))
    click.echo(f"{'#Broker Name':<24}{'#QID':>5}  {'#Min Offset':>12}  {'#Max Offset':>12}  #Last Updated")
    for mq, mn, mx, last in sorted(rows, key=lambda r: (r[0].broker_name, r[0].queue_id)):
        click.echo(f"{mq.broker_name:<24}{mq.queue_id:>5}  {mn:>12}  {mx:>12}  {_ts(last)}")


async def _runtime_or_none(admin: Admin, addr: str) -> dict[str, str] | None:
    """A broker's runtime info, or None when it cannot be had (down, refused by its ACL, an
    older broker): clusterList still lists what the name servers know."""
    try:
        return await admin.get_broker_runtime_info(addr)
    except TideMQError:
        return None


async def _cluster_rows(admin: Admin) -> list[tuple[str, str, int, str, dict[str, str] | None]]:
    """(cluster, broker name, brokerId, address, runtime info) of every registered broker."""
    info = await admin.cluster_info()
    rows = []
    for cluster, names in sorted(info.cluster_addr_table.items()):
        for name in sorted(names):
            bd = info.broker_addr_table.get(name)
            for bid, addr in sorted((bd.broker_addrs if bd else {}).items()):
                rows.append((cluster, name, bid, addr))
    runtimes = await asyncio.gather(*(_runtime_or_none(admin, r[3]) for r in rows))
    return [(*r, rt) for r, rt in zip(rows, runtimes)]


def _replica_columns(rt: dict[str, str] | None) -> tuple[str, str, str]:
    """#Role (role/replica id), #Epoch, #InSync of a broker; "-" where it is not a replica or
    did not answer."""
    if not rt or HA_ROLE not in rt:
        return "-", "-", "-"
    return (f"{rt[HA_ROLE]}/{rt.get(HA_REPLICA_ID, '?')}", rt.get(HA_EPOCH) or "-", rt.get(HA_IN_SYNC) or "-")


@admin_group.command("clusterList")
@namesrv_option
@user_errors
def cluster_list(namesrv) -> None:
    """List clusters, brokers and their addresses; for replicated groups also each replica's
    role/replica id, epoch and the in-sync set it knows."""
    rows = _with_admin(namesrv, _cluster_rows)
    replicated = any(rt is not None and HA_ROLE in rt for *_, rt in rows)
    if not replicated:  # the columns RocketMQ's users and scripts know, unchanged
        click.echo(f"{'#Cluster Name':<22}{'#Broker Name':<22}{'#BID':<6}#Addr")
        for cluster, name, bid, addr, _rt in rows:
            click.echo(f"{cluster:<22}{name:<22}{bid:<6}{addr}")
        return
    width = max(22, *(len(r[3]) + 2 for r in rows))
    click.echo(f"{'#Cluster Name':<22}{'#Broker Name':<22}{'#BID':<6}{'#Addr':<{width}}{'#Role':<14}{'#Epoch':<8}"
               "#InSync")
    for cluster, name, bid, addr, rt in rows:
        role, epoch, in_sync = _replica_columns(rt)
        click.echo(f"{cluster:<22}{name:<22}{bid:<6}{addr:<{width}}{role:<14}{epoch:<8}{in_sync}")


def _master_addr(info: ClusterInfo, group: str) -> str | None:
    bd = info.broker_addr_table.get(group)
    return bd.broker_addrs.get(0) if bd is not None else None


async def _epoch(admin: Admin, addr: str) -> int | None:
    """The epoch the replica at ``addr`` reports (None: no answer, or not a replica)."""
    try:
        value = (await admin.get_broker_runtime_info(addr)).get(HA_EPOCH, "")
    except TideMQError:
        return None
    return int(value) if value.isdigit() else None


async def _switchover(admin: Admin, group: str, to: int | None, timeout: float,
                      progress: Callable[[str], None]) -> tuple[str, str, int, float]:
    """(old master address, new master address, replica id taking over, seconds it took)."""
    info = await admin.cluster_info()
    bd = info.broker_addr_table.get(group)
    if bd is None:
        known = ", ".join(sorted(info.broker_addr_table)) or "none"
        raise AdminError(f"broker group {group!r} is not known to the name servers (known groups: {known}); "
                         "check -b (the group's --broker-name) and that its brokers run")
    old = bd.broker_addrs.get(0)
    if old is None:
        ids = ", ".join(str(i) for i in sorted(bd.broker_addrs)) or "none"
        raise AdminError(f"broker group {group!r} has no master registered (registered brokerIds: {ids}): wait "
                         "for its election to finish (see the replicas' logs) and try again")
    epoch = await _epoch(admin, old)
    started = time.monotonic()
    target = await admin.switchover(old, group, to)
    target_addr = bd.broker_addrs.get(target + 1)  # a follower registers as replica id + 1
    deadline = started + timeout
    while True:
        new = _master_addr(await admin.cluster_info(), group)
        took = time.monotonic() - started
        # The hand-over names the target master of epoch + 1: a master elected after that (the
        # old one again, or another) means the target gave mastership up.
        if new is not None and target_addr is not None and new != target_addr and \
                (new != old or (epoch is not None and (e := await _epoch(admin, new)) is not None
                                and e > epoch + 1)):
            raise AdminError(f"replica {target} of {group!r} took mastership but did not keep it: {new} was "
                             f"elected instead and is brokerId 0 ({took:.1f} s); see replica {target}'s log "
                             "(e.g. its --ha-listen address could not be bound)")
        if new is not None and new != old:
            return old, new, target, took
        if time.monotonic() > deadline:
            raise AdminError(
                f"replica {target} of {group!r} did not register as brokerId 0 within {timeout:g} s (brokerId 0 "
                f"is {new or 'not registered'}): see the replicas' logs; an untaken hand-over lapses into an "
                "election after one lease")
        progress(f"waiting for replica {target} to register as brokerId 0 of {group} ({took:.1f} s)")
        await asyncio.sleep(SWITCHOVER_POLL)


@admin_group.command("switchover")
@namesrv_option
@click.option("-b", "--brokerName", "group", required=True, help="The replicated group (its --broker-name).")
@click.option("--to", "to", type=click.IntRange(0, MAX_REPLICA_ID), default=None,
              help="Replica id to take over (default: the in-sync follower furthest ahead).")
@click.option("--timeout", type=click.FloatRange(1, 600), default=30.0, show_default=True,
              help="Seconds to wait for the new master to register with the name servers.")
@user_errors
def switchover(namesrv, group, to, timeout) -> None:
    """Hand a replicated group's mastership to an in-sync follower (a planned switchover)."""
    tty = sys.stderr.isatty()

    def progress(line: str) -> None:
        if tty:  # one line rewritten in place; a log or pipe gets the result lines only
            click.echo(f"\r{line}", err=True, nl=False)

    try:
        old, new, target, took = _with_admin(namesrv, lambda a: _switchover(a, group, to, timeout, progress))
    finally:
        if tty:
            click.echo("", err=True)
    click.echo(f"switched over {group}: replica {target} at {new} is master (brokerId 0), was {old}; "
               f"{took:.1f} s")


@admin_group.command("updateSubGroup")
@namesrv_option
@click.option("-c", "--clusterName", "cluster")
@click.option("-b", "--brokerAddr", "broker")
@click.option("-g", "--groupName", "group", required=True)
@click.option("-s", "--consumeEnable", "consume_enable", default="true", show_default=True)
@click.option("-m", "--consumeFromMinEnable", "from_min", default="true", show_default=True)
@click.option("-d", "--consumeBroadcastEnable", "broadcast", default="true", show_default=True)
@click.option("-q", "--retryQueueNums", "retry_queues", type=click.IntRange(0, 64), default=1, show_default=True)
@click.option("-r", "--retryMaxTimes", "retry_max", type=click.IntRange(0, 64), default=16, show_default=True)
@user_errors
def update_sub_group(namesrv, cluster, broker, group, consume_enable, from_min, broadcast, retry_queues, retry_max) -> None:
    """Create or update a subscription (consumer) group."""
    target = _target(cluster, broker)
    done = _with_admin(
        namesrv,
        lambda a: a.update_subscription_group(
            group,
            consume_enable=_bool(consume_enable, "-s"),
            consume_from_min_enable=_bool(from_min, "-m"),
            consume_broadcast_enable=_bool(broadcast, "-d"),
            retry_queue_nums=retry_queues,
            retry_max_times=retry_max,
            **target,
        ),
    )
    for addr in done or []:
        click.echo(f"create subscription group to {addr} success.")


@admin_group.command("consumerProgress")
@namesrv_option
@click.option("-g", "--groupName", "group", required=True)
@click.option("-t", "--topicName", "topic", default=None)
@user_errors
def consumer_progress(namesrv, group, topic) -> None:
    """Show a group's committed offsets and lag per queue."""
    rows = _with_admin(namesrv, lambda a: a.consumer_progress(group, topic))
    if not len(rows):  # as mqadmin: an empty offset table is an error, not "Diff Total: 0"
        on_topic = f" on topic {topic!r}" if topic else ""
        raise click.ClickException(
            f"no consume stats for group {group!r}{on_topic}: it has committed no offsets "
            "(it has not consumed anything yet, or the group name is wrong)"
        )
    click.echo(f"{'#Topic':<32}{'#Broker Name':<20}{'#QID':>5}  {'#Broker Offset':>14}  {'#Consumer Offset':>16}  {'#Diff':>10}  #LastTime")
    total = 0
    for mq, broker_off, consumer_off, last in sorted(rows, key=lambda r: (r[0].topic, r[0].broker_name, r[0].queue_id)):
        diff = broker_off - consumer_off
        total += diff
        click.echo(f"{mq.topic:<32}{mq.broker_name:<20}{mq.queue_id:>5}  {broker_off:>14}  {consumer_off:>16}  {diff:>10}  {_ts(last)}")
    click.echo(f"\nDiff Total: {total}")


def _print_message(m) -> None:
    click.echo(f"OffsetID:            {m.offset_msg_id}")
    click.echo(f"Topic:               {m.topic}")
    click.echo(f"Tags:                [{m.tags or ''}]")
    click.echo(f"Keys:                [{' '.join(m.keys)}]")
    click.echo(f"Queue ID:            {m.queue_id}")
    click.echo(f"Queue Offset:        {m.queue_offset}")
    click.echo(f"CommitLog Offset:    {m.commit_log_offset}")
    click.echo(f"Reconsume Times:     {m.reconsume_times}")
    click.echo(f"Born Timestamp:      {_ts(m.born_timestamp)}")
    click.echo(f"Store Timestamp:     {_ts(m.store_timestamp)}")
    click.echo(f"Born Host:           {m.born_host}")
    click.echo(f"Store Host:          {m.store_host}")
    click.echo(f"System Flag:         {m.sys_flag}")
    click.echo(f"Properties:          {m.properties}")
    preview = m.body[:256].decode("utf-8", errors="replace")
    click.echo(f"Message Body:        {preview!r}{' ...' if len(m.body) > 256 else ''}")


@admin_group.command("queryMsgByKey")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-k", "--msgKey", "key", required=True)
@click.option("-c", "--maxNum", "max_num", type=click.IntRange(1, 1024), default=64, show_default=True)
@click.option("-b", "--beginTimestamp", "begin", type=click.IntRange(min=0), default=0, help="Stored at or after (ms since the epoch).")
@click.option("-e", "--endTimestamp", "end", type=click.IntRange(min=0), default=None, help="Stored at or before (ms; default now).")
@user_errors
def query_msg_by_key(namesrv, topic, key, max_num, begin, end) -> None:
    """Find messages by key, optionally within a store-time range."""
    msgs = _with_admin(namesrv, lambda a: a.query_msg_by_key(topic, key, max_num=max_num, begin_ms=begin, end_ms=end))
    if not msgs:
        raise click.ClickException(f"no message with key {key!r} in topic {topic!r}")
    click.echo(f"{'#Message ID':<34}{'#QID':>5}  #Offset")
    for m in msgs:
        click.echo(f"{m.msg_id:<34}{m.queue_id:>5}  {m.queue_offset}")


# A unique key without -t is looked up topic by topic (its index entries are keyed by topic, as
# RocketMQ's queryMsgByUniqueKey): bounded, so a cluster with very many topics asks for -t instead.
MAX_SEARCHED_TOPICS = 2000
SEARCH_CONCURRENCY = 16
_ID_LENGTHS = (32, 56)  # 16 or 28 bytes: IPv4 or IPv6 offset ids and unique keys


async def _find_anywhere(admin: Admin, msg_id: str) -> tuple[MessageExt, int]:
    """(message, topics searched) for an offset id or a unique key, without its topic."""
    try:
        return await admin.query_msg_by_id(None, msg_id), 0
    except (ClientError, AdminError) as exc:  # not an offset id, or nothing at the broker it names
        first = exc
    if len(msg_id.strip()) not in _ID_LENGTHS or any(c not in string.hexdigits for c in msg_id.strip()):
        raise ClientError(f"{msg_id!r} is not a message id: an offset message id or a unique key "
                          "(the msgId tidemq send prints) is 32 hexadecimal digits (56 with IPv6 hosts)")
    names = [t for t in await admin.topic_list() if t not in NOT_ALLOWED_SEND_TOPICS]
    # the topic a producer sent to first; retry and dead-letter copies keep the key too
    topics = sorted(names, key=lambda t: (t.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)), t))
    if len(topics) > MAX_SEARCHED_TOPICS:
        raise ClientError(f"{msg_id} is not found as an offset message id ({first}); the cluster has "
                          f"{len(topics)} topics, too many to search for a unique key: give its topic "
                          "with -t TOPIC")
    failures: list[str] = []

    async def look(topic: str) -> MessageExt | None:
        try:
            return await admin.query_msg_by_id(topic, msg_id)
        except AdminError:
            return None  # not in this topic
        except TideMQError as exc:
            failures.append(f"{topic}: {exc}")
            return None

    for i in range(0, len(topics), SEARCH_CONCURRENCY):
        for m in await asyncio.gather(*(look(t) for t in topics[i:i + SEARCH_CONCURRENCY])):
            if m is not None:
                return m, i + SEARCH_CONCURRENCY
    failed = f"; {len(failures)} lookup(s) failed, e.g. {failures[0]}" if failures else ""
    raise AdminError(f"no message with id or unique key {msg_id.strip().upper()} in any of the "
                     f"{len(topics)} topics of the cluster{failed}")


@admin_group.command("queryMsgById")
@namesrv_option
@click.option("-t", "--topic", default=None,
              help="Topic of a unique key (the msgId tidemq send prints); without it every topic is searched.")
@click.option("-i", "--msgId", "msg_id", required=True)
@user_errors
def query_msg_by_id(namesrv, topic, msg_id) -> None:
    """Show one message by offset message id or unique key."""
    if topic is not None:
        m = _with_admin(namesrv, lambda a: a.query_msg_by_id(topic, msg_id))
    else:
        m, searched = _with_admin(namesrv, lambda a: _find_anywhere(a, msg_id))
        if searched:
            click.echo(f"found in topic {m.topic} (looked up as a unique key topic by topic)", err=True)
    _print_message(m)
