"""Producer and consumer for the kind e2e suite, run inside the cluster by Jobs of the TideMQ image.

    python tmqload.py produce --namesrv ADDR --topic T --run R --count N [--rate R] [--stop-file F]
    python tmqload.py consume --namesrv ADDR --topic T --group G [--run R] [--expect N | --max-messages N]
    python tmqload.py routes --namesrv ADDR;ADDR --topic T [--interval S] [--stop-file F]

The suite mounts this file from a ConfigMap (it is not part of the image) and reads what the Job
printed: ``TMQLOAD-PROGRESS {json}`` lines while it runs and one ``TMQLOAD-SUMMARY {json}`` line at
the end. Message ids travel in the body (``RUN:ID``); id sets are printed as sorted
``[first, last]`` ranges so that 10 000 ids take a few bytes.

Invariants:
- A message counts as acknowledged only when its send returned SEND_OK (with SYNC_FLUSH brokers:
  after it is on disk). A failed or non-OK send is retried (after a growing, bounded pause) until
  it is acknowledged or ``--retry-for`` seconds pass; every failed attempt is counted. Every id
  the producer started is in ``acked`` or ``gave_up`` when it prints its summary.
- The producer stops early when ``--stop-file`` appears (the suite creates it with kubectl exec),
  after finishing the messages already being sent; ``--max-seconds`` bounds it in any case.
- The consumer commits, for every queue it read, the offset after the last message it counted
  (unless ``--no-commit``), so a consumer group's lag and a Topic's draining see its progress;
  ``--max-messages N`` stops after exactly N messages.
- ``routes`` asks every name server of ``--namesrv`` separately for the topic's route every
  ``--interval`` seconds (as clients do, which use one name server at a time) and classifies each
  answer: ``route`` (writable queues), ``none`` (answered without one: the table lacks the
  topic's brokers) or ``down`` (no answer). A sample is *empty* when no name server served a route.
  Times are wall-clock seconds (the suite compares them with pods' condition times).
- Only the standard library and tidemq are imported: this runs in the image's Python as a file,
  shipped as one ConfigMap key (hence one module: the pure helpers the suite reads the output
  with live here too).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

SUMMARY = "TMQLOAD-SUMMARY "
PROGRESS = "TMQLOAD-PROGRESS "
ROUTE_WAIT = 120.0        # seconds to wait for the topic's route before giving up
REFRESH_QUEUES = 10.0     # consumer: seconds between re-reads of the topic's queues
PULL_BATCH = 32

log = logging.getLogger("tmqload")


# -- pure helpers (the suite imports these to read the Jobs' output) ------------------------------

def to_ranges(ids: Iterable[int]) -> list[list[int]]:
    """Sorted, merged ``[first, last]`` ranges of ``ids``."""
    out: list[list[int]] = []
    for i in sorted(set(ids)):
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def from_ranges(ranges: Iterable[Sequence[int]]) -> set[int]:
    return {i for first, last in ranges for i in range(int(first), int(last) + 1)}


def body(run: str, i: int) -> bytes:
    return f"{run}:{i}".encode()


def id_of(data: bytes, run: str | None) -> int | None:
    """The id of a ``RUN:ID`` body (of run ``run`` when given), else None."""
    text = data.decode("utf-8", errors="replace")
    head, sep, tail = text.rpartition(":")
    if not sep or not tail.isdigit() or (run is not None and head != run):
        return None
    return int(tail)


def _last_line(text: str, marker: str) -> dict[str, Any] | None:
    found = None
    for line in text.splitlines():
        at = line.find(marker)
        if at >= 0:
            found = line[at + len(marker):]
    return json.loads(found) if found is not None else None


def parse_summary(log_text: str) -> dict[str, Any] | None:
    return _last_line(log_text, SUMMARY)


def parse_progress(log_text: str) -> dict[str, Any] | None:
    return _last_line(log_text, PROGRESS)


def parse_tags(spec: str | None) -> list[tuple[str | None, int]]:
    """``red=3,green=2`` -> [("red", 3), ("green", 2)]."""
    if not spec:
        return []
    out = []
    for part in spec.split(","):
        tag, _, n = part.partition("=")
        if not tag or not n.isdigit():
            raise argparse.ArgumentTypeError(f"--tags wants TAG=N[,TAG=N...], got {part!r}")
        out.append((tag, int(n)))
    return out


def emit(marker: str, data: dict[str, Any]) -> None:
    print(marker + json.dumps(data, sort_keys=True), flush=True)


def _error_key(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"


# -- shared ---------------------------------------------------------------------------------------

async def wait_for_route(namesrv: str, topic: str, timeout: float = ROUTE_WAIT) -> None:
    from tidemq.client import Admin  # noqa: PLC0415
    from tidemq.errors import TideMQError  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    async with Admin(namesrv) as admin:
        while True:
            try:
                route = await admin.topic_route(topic)
                if route.publish_queues(topic) or route.subscribe_queues(topic):
                    return
            except (TideMQError, OSError, TimeoutError) as exc:
                log.info("no route for %s yet: %s", topic, exc)
            if time.monotonic() > deadline:
                raise SystemExit(f"tmqload: topic {topic} has no route after {timeout:.0f}s")
            await asyncio.sleep(1.0)


# -- produce --------------------------------------------------------------------------------------

class ProduceState:
    def __init__(self) -> None:
        self.acked: set[int] = set()
        self.gave_up: set[int] = set()
        self.started = 0
        self.failures = 0
        self.by_broker: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        # The longest time without any acknowledgement, and when it ended (seconds from the start):
        # across a failover, the time from the last acknowledgement of the old master to the
        # first of the new one.
        self.last_ack: float | None = None
        self.max_gap = 0.0
        self.max_gap_end = 0.0

    def acknowledged(self, now: float, begin: float) -> None:
        if self.last_ack is not None and now - self.last_ack > self.max_gap:
            self.max_gap, self.max_gap_end = now - self.last_ack, now - begin
        self.last_ack = now

    def progress(self) -> dict[str, Any]:
        return {"acked": len(self.acked), "failures": self.failures, "started": self.started,
                "gave_up": len(self.gave_up), "max_ack_gap_seconds": round(self.max_gap, 3)}


async def produce(args: argparse.Namespace) -> dict[str, Any]:
    from tidemq.client import ClientConfig, Producer, SendStatus  # noqa: PLC0415
    from tidemq.errors import TideMQError  # noqa: PLC0415
    from tidemq.message import Message  # noqa: PLC0415

    tags = parse_tags(args.tags)
    plan: list[str | None] = [t for t, n in tags for _ in range(n)] or [args.tag] * args.count
    state = ProduceState()
    ids: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(plan)):
        ids.put_nowait(i)
    stop_at = time.monotonic() + args.max_seconds
    await wait_for_route(args.namesrv, args.topic)
    begin = time.monotonic()  # --rate paces from here

    def stopping() -> bool:
        return time.monotonic() > stop_at or bool(args.stop_file and os.path.exists(args.stop_file))

    config = ClientConfig(request_timeout=args.request_timeout)
    async with Producer(args.group, name_servers=args.namesrv, config=config) as producer:
        async def send_until_acked(data: bytes, tag: str | None) -> str | None:
            """The broker that acknowledged ``data``, None when --retry-for ran out."""
            deadline = time.monotonic() + args.retry_for
            pause = 0.1
            while True:
                try:
                    result = await producer.send(Message(args.topic, data, tags=tag))
                    if result.status == SendStatus.SEND_OK:
                        return result.message_queue.broker_name
                    state.errors[f"status {result.status.name}"] += 1
                except (TideMQError, OSError, TimeoutError) as exc:
                    state.errors[_error_key(exc)] += 1
                state.failures += 1
                if time.monotonic() + pause > deadline:
                    return None
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)

        async def send_one(i: int) -> None:
            broker = await send_until_acked(body(args.run, i), plan[i])
            if broker is None:
                state.gave_up.add(i)
            else:
                state.acked.add(i)
                state.by_broker[broker] += 1
                state.acknowledged(time.monotonic(), begin)

        async def worker() -> None:
            while not ids.empty() and not stopping():
                if args.rate:  # pace the whole producer at --rate messages per second
                    due = begin + state.started / args.rate
                    if due > time.monotonic():
                        await asyncio.sleep(due - time.monotonic())
                        continue
                i = ids.get_nowait()
                state.started += 1
                await send_one(i)

        async def reporter() -> None:
            while True:
                emit(PROGRESS, state.progress())
                await asyncio.sleep(args.progress_every)

        report = asyncio.create_task(reporter())
        try:
            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
            if args.closing_tag and not stopping():
                await asyncio.sleep(args.closing_after)
                if await send_until_acked(f"{args.run}:closing".encode(), args.closing_tag) is None:
                    state.errors["closing message not acknowledged"] += 1
        finally:
            report.cancel()
    return {"role": "producer", "run": args.run, "topic": args.topic, "planned": len(plan),
            "started": state.started, "acked": to_ranges(state.acked),
            "acked_count": len(state.acked), "gave_up": to_ranges(state.gave_up),
            "send_failures": state.failures, "by_broker": dict(state.by_broker),
            "errors": dict(state.errors.most_common(10)),
            "max_ack_gap_seconds": round(state.max_gap, 3), "max_ack_gap_end": round(state.max_gap_end, 3),
            "seconds": round(time.monotonic() - begin, 3)}


# -- routes ---------------------------------------------------------------------------------------

ROUTE, NONE, DOWN = "route", "none", "down"
KEEP_TIMES = 2000  # most times kept per list in the summary (a 10-minute watch at 2 Hz: 1200 rounds)


class RouteWatch:
    """What the name servers answered, sample by sample (pure: the suite's tests drive it)."""

    def __init__(self, addrs: Sequence[str]) -> None:
        self.addrs = list(addrs)
        self.samples = 0
        self.counts = {a: {ROUTE: 0, NONE: 0, DOWN: 0} for a in self.addrs}
        self.none_at: dict[str, list[float]] = {a: [] for a in self.addrs}  # answered, no route
        self.empty_at: list[float] = []  # samples where no name server served a route
        self.empty = 0
        self.most_brokers = 0  # the most broker groups one answer routed to

    def sample(self, at: float, answers: Sequence[tuple[str, int]]) -> None:
        """One round: ``answers[i]`` = (ROUTE | NONE | DOWN, broker groups routed) of ``addrs[i]``."""
        self.samples += 1
        for addr, (kind, brokers) in zip(self.addrs, answers):
            self.counts[addr][kind] += 1
            self.most_brokers = max(self.most_brokers, brokers)
            if kind == NONE and len(self.none_at[addr]) < KEEP_TIMES:
                self.none_at[addr].append(round(at, 3))
        if not any(kind == ROUTE for kind, _ in answers):
            self.empty += 1
            if len(self.empty_at) < KEEP_TIMES:
                self.empty_at.append(round(at, 3))

    def progress(self) -> dict[str, Any]:
        return {"samples": self.samples, "empty": self.empty,
                "none": sum(c[NONE] for c in self.counts.values())}

    def summary(self) -> dict[str, Any]:
        return {"samples": self.samples, "empty": self.empty, "empty_at": self.empty_at,
                "counts": self.counts, "none_at": self.none_at, "most_brokers": self.most_brokers}


async def routes(args: argparse.Namespace) -> dict[str, Any]:
    from tidemq.client.route import TopicRouteData  # noqa: PLC0415
    from tidemq.errors import TideMQError  # noqa: PLC0415
    from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode  # noqa: PLC0415

    addrs = [a.strip() for a in args.namesrv.replace(",", ";").split(";") if a.strip()]
    watch = RouteWatch(addrs)  # from the first round: the suite starts it once the topic is Ready
    begin = time.monotonic()
    client = RemotingClient(connect_timeout=args.request_timeout)

    async def ask(addr: str) -> tuple[str, int]:
        cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": args.topic})
        try:
            resp = await client.invoke(addr, cmd, args.request_timeout)
            if resp.code != ResponseCode.SUCCESS:
                return NONE, 0
            route = TopicRouteData.from_json(resp.body_bytes())
        except (TideMQError, OSError, TimeoutError) as exc:
            log.info("%s: %s", addr, _error_key(exc))
            return DOWN, 0
        brokers = {mq.broker_name for mq in route.publish_queues(args.topic)}
        return (ROUTE if brokers else NONE), len(brokers)

    async def report() -> None:
        while True:
            emit(PROGRESS, watch.progress())
            await asyncio.sleep(args.progress_every)

    reporter = asyncio.create_task(report())
    try:
        while time.monotonic() - begin < args.max_seconds and not (
                args.stop_file and os.path.exists(args.stop_file)):
            at = time.time()
            watch.sample(at, await asyncio.gather(*(ask(a) for a in addrs)))
            await asyncio.sleep(args.interval)
    finally:
        reporter.cancel()
        await client.close()
    return {"role": "routes", "topic": args.topic, "addrs": addrs, **watch.summary(),
            "seconds": round(time.monotonic() - begin, 3)}


# -- consume --------------------------------------------------------------------------------------

class ConsumeState:
    def __init__(self) -> None:
        self.ids: set[int] = set()
        self.received = 0
        self.duplicates = 0
        self.pull_errors = 0
        self.by_broker: collections.Counter[str] = collections.Counter()
        self.tags: collections.Counter[str] = collections.Counter()
        self.bodies: list[str] = []
        self.errors: collections.Counter[str] = collections.Counter()

    def progress(self) -> dict[str, Any]:
        return {"received": self.received, "distinct": len(self.ids), "pull_errors": self.pull_errors}


async def consume(args: argparse.Namespace) -> dict[str, Any]:
    from tidemq.client import PullConsumer  # noqa: PLC0415
    from tidemq.errors import TideMQError  # noqa: PLC0415

    state = ConsumeState()
    begin = time.monotonic()
    await wait_for_route(args.namesrv, args.topic)
    idle_limit = args.idle_seconds
    reason = "deadline"
    async with PullConsumer(args.group, name_servers=args.namesrv) as consumer:
        offsets: dict[Any, int] = {}

        async def refresh() -> None:
            for mq in await consumer.fetch_queues(args.topic):
                if mq in offsets:
                    continue
                committed = None if args.from_beginning else await consumer.committed_offset(mq)
                offsets[mq] = committed if committed is not None else await consumer.min_offset(mq)

        def done() -> bool:
            if args.expect is not None and len(state.ids) >= args.expect:
                return True
            return args.max_messages is not None and state.received >= args.max_messages

        async def report() -> None:
            while True:
                emit(PROGRESS, state.progress())
                await asyncio.sleep(args.progress_every)

        reporter = asyncio.create_task(report())
        try:
            await refresh()
            refreshed = idle_since = time.monotonic()
            while not done():
                now = time.monotonic()
                if now - begin > args.max_seconds:
                    break
                if now - idle_since > idle_limit:
                    reason = "idle"
                    break
                if now - refreshed > REFRESH_QUEUES:
                    try:
                        await refresh()
                    except (TideMQError, OSError, TimeoutError) as exc:
                        state.errors[_error_key(exc)] += 1
                    refreshed = now
                progressed = await _pull_round(consumer, offsets, state, args)
                if progressed:
                    idle_since = time.monotonic()
                else:
                    await asyncio.sleep(0.1)
            else:
                reason = "expected" if args.expect is not None else "max-messages"
            if not args.no_commit:
                for mq, offset in offsets.items():
                    await _commit(consumer, mq, offset, state)
        finally:
            reporter.cancel()
    out = {"role": "consumer", "run": args.run, "topic": args.topic, "group": args.group,
           "reason": reason, "received": state.received, "distinct": len(state.ids),
           "ids": to_ranges(state.ids), "duplicates": state.duplicates,
           "by_broker": dict(state.by_broker), "tags": dict(state.tags),
           "pull_errors": state.pull_errors, "errors": dict(state.errors.most_common(10)),
           "seconds": round(time.monotonic() - begin, 3)}
    if args.print_bodies:
        out["bodies"] = state.bodies
    return out


async def _pull_round(consumer: Any, offsets: dict[Any, int], state: ConsumeState,
                      args: argparse.Namespace) -> bool:
    """One pull per queue; True when a message arrived."""
    from tidemq.errors import TideMQError  # noqa: PLC0415

    progressed = False
    for mq in sorted(offsets, key=lambda q: (q.broker_name, q.queue_id)):
        try:
            result = await consumer.pull(mq, offsets[mq], PULL_BATCH)
        except (TideMQError, OSError, TimeoutError) as exc:
            state.pull_errors += 1
            state.errors[_error_key(exc)] += 1
            continue
        for m in result.messages:
            _count(m, mq.broker_name, state, args)
            offsets[mq] = m.queue_offset + 1
            progressed = True
            if args.max_messages is not None and state.received >= args.max_messages:
                return True
        if not result.messages and result.next_begin_offset != offsets[mq]:
            offsets[mq] = result.next_begin_offset
    return progressed


def _count(m: Any, broker: str, state: ConsumeState, args: argparse.Namespace) -> None:
    state.received += 1
    state.by_broker[broker] += 1
    if args.run is None or m.body.startswith(f"{args.run}:".encode()):
        state.tags[m.tags or ""] += 1
    i = id_of(m.body, args.run)
    if i is not None:
        if i in state.ids:
            state.duplicates += 1
        state.ids.add(i)
    if args.print_bodies and len(state.bodies) < args.max_bodies:
        state.bodies.append(m.body.decode("utf-8", errors="replace"))


async def _commit(consumer: Any, mq: Any, offset: int, state: ConsumeState) -> None:
    from tidemq.errors import TideMQError  # noqa: PLC0415

    for attempt in range(5):
        try:
            await consumer.commit(mq, offset)
            return
        except (TideMQError, OSError, TimeoutError) as exc:
            state.errors[_error_key(exc)] += 1
            await asyncio.sleep(0.5 * (attempt + 1))


# -- command line ---------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tmqload", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("produce", "consume", "routes"):
        s = sub.add_parser(name)
        s.add_argument("--namesrv", required=True, help="name server address(es), ADDR[;ADDR]")
        s.add_argument("--topic", required=True)
        s.add_argument("--run", default=None, help="run id carried in bodies as RUN:ID")
        s.add_argument("--max-seconds", type=float, default=600.0, help="hard bound of the whole run")
        s.add_argument("--progress-every", type=float, default=1.0)
    pr = sub.choices["produce"]
    pr.add_argument("--count", type=int, default=1)
    pr.add_argument("--tag", default=None)
    pr.add_argument("--tags", default=None, help="TAG=N[,TAG=N...] (instead of --count/--tag)")
    pr.add_argument("--group", default="tmqload-producer")
    pr.add_argument("--concurrency", type=int, default=16)
    pr.add_argument("--rate", type=float, default=0.0, help="messages per second (0: as fast as possible)")
    pr.add_argument("--retry-for", type=float, default=120.0, help="seconds to keep retrying one message")
    pr.add_argument("--request-timeout", type=float, default=5.0)
    pr.add_argument("--stop-file", default=None)
    pr.add_argument("--closing-tag", default=None, help="after everything, send one message with this tag")
    pr.add_argument("--closing-after", type=float, default=2.0)
    co = sub.choices["consume"]
    co.add_argument("--group", required=True)
    co.add_argument("--expect", type=int, default=None, help="stop once this many distinct ids arrived")
    co.add_argument("--max-messages", type=int, default=None, help="stop after exactly this many messages")
    co.add_argument("--idle-seconds", type=float, default=30.0, help="stop after this long without a message")
    co.add_argument("--from-beginning", action="store_true")
    co.add_argument("--no-commit", action="store_true")
    co.add_argument("--print-bodies", action="store_true")
    co.add_argument("--max-bodies", type=int, default=10_000)
    ro = sub.choices["routes"]
    ro.add_argument("--interval", type=float, default=0.5, help="seconds between rounds of lookups")
    ro.add_argument("--request-timeout", type=float, default=2.0)
    ro.add_argument("--stop-file", default=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "produce" and args.run is None:
        args.run = "run"
    run = {"produce": produce, "consume": consume, "routes": routes}[args.command]
    emit(SUMMARY, asyncio.run(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
