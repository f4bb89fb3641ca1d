"""`tidemq send` and `tidemq consume` for quick manual use."""

from __future__ import annotations

import asyncio
import sys
import time

import click

from tidemq.cli.common import client_config, run_async, user_errors
from tidemq.client import Producer, PullConsumer
from tidemq.message import Message


def _addrs(namesrv: str) -> list[str]:
    return [a for a in namesrv.replace(",", ";").split(";") if a.strip()]


@click.command("send")
@click.option("-n", "--namesrv", envvar="NAMESRV_ADDR", required=True, help="Name server(s) (also $NAMESRV_ADDR).")
@click.option("-t", "--topic", required=True)
@click.option("-b", "--body", default=None, help="Message body (default: read stdin).")
@click.option("--tags", default=None)
@click.option("-k", "--keys", default=None)
@click.option("-c", "--count", type=click.IntRange(min=1), default=1, show_default=True, help="Send the body this many times.")
@click.option("-g", "--group", default="tidemq-cli-producer", show_default=True)
@user_errors
def send_cmd(namesrv, topic, body, tags, keys, count, group) -> None:
    """Send messages to a topic."""
    data = body.encode() if body is not None else sys.stdin.buffer.read()
    if not data:
        raise click.UsageError("the message body is empty: pass -b BODY or pipe data on stdin")

    async def main() -> None:
        async with Producer(group, name_servers=_addrs(namesrv), config=client_config()) as producer:
            started = time.monotonic()
            sent = 0

            def rate(_item: object) -> str:
                elapsed = time.monotonic() - started
                return f"{sent / elapsed:,.0f} msg/s" if sent and elapsed > 0 else ""

            label = f"sending {count:,} messages of {len(data):,} bytes to {topic}"
            with click.progressbar(length=count, label=label, file=sys.stderr, show_pos=True,
                                   item_show_func=rate) if count > 1 else _null() as bar:
                for i in range(count):
                    r = await producer.send(Message(topic, data, tags=tags, keys=keys))
                    if count == 1:
                        click.echo(f"SendResult [sendStatus={r.status.name}, msgId={r.msg_id}, offsetMsgId={r.offset_msg_id}, queueId={r.message_queue.queue_id}, queueOffset={r.queue_offset}]")
                    else:
                        sent += 1
                        bar.update(1)
            elapsed = time.monotonic() - started
        if count > 1:
            click.echo(f"sent {count:,} messages to {topic} in {elapsed:.2f} s "
                       f"({count / max(elapsed, 1e-9):,.0f} msg/s)")

    run_async(main)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, _n: int) -> None:
        pass


@click.command("consume")
@click.option("-n", "--namesrv", envvar="NAMESRV_ADDR", required=True, help="Name server(s) (also $NAMESRV_ADDR).")
@click.option("-t", "--topic", required=True)
@click.option("-g", "--group", default="tidemq-cli-consumer", show_default=True)
@click.option("-s", "--subExpression", "expression", default="*", show_default=True, help="Tag expression, e.g. 'TagA || TagB'.")
@click.option("-c", "--count", type=click.IntRange(min=1), default=None, help="Stop after this many messages.")
@click.option("--from-beginning", is_flag=True, help="Ignore committed offsets and start at each queue's first message.")
@click.option("--wait", type=click.FloatRange(min=0), default=3.0, show_default=True, help="Stop after this many idle seconds (0: never).")
@click.option("--no-commit", is_flag=True, help="Do not commit offsets for the group.")
@user_errors
def consume_cmd(namesrv, topic, group, expression, count, from_beginning, wait, no_commit) -> None:
    """Consume messages from a topic and print them (one per line)."""

    async def main() -> int:
        seen = 0
        async with PullConsumer(group, name_servers=_addrs(namesrv), config=client_config()) as consumer:
            queues = await consumer.fetch_queues(topic)
            offsets = {}
            for mq in queues:
                committed = None if from_beginning else await consumer.committed_offset(mq)
                offsets[mq] = committed if committed is not None else await consumer.min_offset(mq)
            idle_since = time.monotonic()
            while count is None or seen < count:
                progressed = False
                for mq in queues:
                    r = await consumer.pull(mq, offsets[mq], 32, expression=expression)
                    for m in r.messages:
                        click.echo(f"{m.topic}\t{mq.broker_name}/{mq.queue_id}@{m.queue_offset}\t{m.tags or ''}\t{m.body.decode('utf-8', errors='replace')}")
                        seen += 1
                        if count is not None and seen >= count:
                            offsets[mq] = m.queue_offset + 1
                            break
                    else:
                        if r.next_begin_offset != offsets[mq]:
                            offsets[mq] = r.next_begin_offset
                    progressed = progressed or bool(r.messages)
                    if count is not None and seen >= count:
                        break
                if progressed:
                    idle_since = time.monotonic()
                elif wait and time.monotonic() - idle_since > wait:
                    break
                else:
                    await asyncio.sleep(0.1)
            if not no_commit:
                for mq, off in offsets.items():
                    await consumer.commit(mq, off)
        return seen

    seen = run_async(main)
    click.echo(f"consumed {seen} messages", err=True)
