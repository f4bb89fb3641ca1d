"""The accounting for fault-injection tests (style-and-reliability.md B7): load a real broker with
producers and consumers, stop it abruptly, restart it, and check what the store kept.

Every body is unique and self-describing (``p{producer}-{cycle}-{seq}``); producers send without
retries, so a duplicate can only be the broker's fault. A send counts as acknowledged only on
SEND_OK (FLUSH_DISK_TIMEOUT and the like, timeouts and resets are indeterminate).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tidemq.errors import TideMQError
from tidemq.message import decode_records
from tidemq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from tests.broker.test_broker_protocol import pull_cmd, send_cmd

GROUP = "chaos-consumers"


@dataclass
class Ledger:
    """What the clients saw, across every cycle."""

    sent: set[bytes] = field(default_factory=set)
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # body -> (queue, queue offset)
    ack_time: dict[bytes, float] = field(default_factory=dict)  # body -> monotonic time of the ack
    indeterminate: set[bytes] = field(default_factory=set)
    failed: int = 0
    consumed: int = 0
    commits: int = 0


@dataclass
class Check:
    """Outcome of reading every queue back (B7 "the accounting")."""

    stored: dict[tuple[int, int], bytes]
    lost: list[bytes]
    misplaced: list[bytes]  # acked at one (queue, offset), stored at another
    duplicates: int  # bodies at two or more positions
    gaps: int  # missing offsets inside a queue
    phantoms: int  # bodies nobody sent
    indeterminate_stored: int
    max_offsets: dict[int, int]
    offsets_ahead: list[tuple[int, int, int]]  # (queue, committed offset, max offset)

    def summary(self, ledger: Ledger) -> str:
        return (f"acked={len(ledger.acked)} indeterminate={len(ledger.indeterminate)} "
                f"(stored {self.indeterminate_stored}) failed={ledger.failed} stored={len(self.stored)} "
                f"consumed={ledger.consumed} lost={len(self.lost)} misplaced={len(self.misplaced)} "
                f"duplicates={self.duplicates} gaps={self.gaps} phantoms={self.phantoms} "
                f"consumer_offsets_ahead={len(self.offsets_ahead)}")


async def _producer(addr: str, topic: str, queues: int, idx: int, cycle: int, ledger: Ledger,
                    stop: asyncio.Event) -> None:
    cl = RemotingClient()
    rnd = random.Random(idx * 1000 + cycle)
    seq = 0
    try:
        while not stop.is_set():
            body = f"p{idx}-{cycle}-{seq}".encode()
            seq += 1
            ledger.sent.add(body)
            try:
                r = await cl.invoke(addr, send_cmd(topic, body, queue_id=rnd.randrange(queues),
                                                   props={"TAGS": "TagA", "KEYS": body.decode()}), 3)
            except (TideMQError, OSError):
                ledger.indeterminate.add(body)
                return  # the broker is gone
            if r.code == ResponseCode.SUCCESS:
                ledger.acked[body] = (int(r.ext_fields["queueId"]), int(r.ext_fields["queueOffset"]))
                ledger.ack_time[body] = time.monotonic()
            elif r.code in (ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE,
                            ResponseCode.FLUSH_SLAVE_TIMEOUT):
                ledger.indeterminate.add(body)
            else:
                ledger.failed += 1
    finally:
        await cl.close()


async def _consumer(addr: str, topic: str, my_queues: list[int], ledger: Ledger, stop: asyncio.Event) -> None:
    cl = RemotingClient()
    try:
        offsets = {}
        for q in my_queues:
            r = await cl.invoke(addr, RemotingCommand.request(
                RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": topic, "queueId": q}), 3)
            offsets[q] = int(r.ext_fields["offset"]) if r.code == ResponseCode.SUCCESS else 0
        while not stop.is_set():
            got = 0
            for q in my_queues:
                r = await cl.invoke(addr, pull_cmd(topic, q, offsets[q], group=GROUP), 3)
                if r.code == ResponseCode.SUCCESS:
                    msgs = decode_records(r.body_bytes())
                    got += len(msgs)
                    ledger.consumed += len(msgs)
                    offsets[q] = int(r.ext_fields["nextBeginOffset"])
                    up = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
                        "consumerGroup": GROUP, "topic": topic, "queueId": q, "commitOffset": offsets[q]})
                    await cl.invoke_oneway(addr, up)
                    ledger.commits += 1
            if not got:
                await asyncio.sleep(0.02)
    except (TideMQError, OSError):
        return
    finally:
        await cl.close()


async def run_load(addr: str, topic: str, queues: int, cycle: int, ledger: Ledger, fault_after: float,
                   fault: Callable[[], None], producers: int = 4, consumers: int = 2) -> None:
    """Producers and consumers until ``fault()`` (called ``fault_after`` s in) takes the broker down."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_producer(addr, topic, queues, i, cycle, ledger, stop)) for i in range(producers)]
    tasks += [asyncio.create_task(_consumer(addr, topic, list(range(c, queues, consumers)), ledger, stop))
              for c in range(consumers)]
    await asyncio.sleep(fault_after)
    fault()
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)


async def _read_queue(cl: RemotingClient, addr: str, topic: str, q: int, start: int) -> list:
    out, offset = [], start
    while True:
        r = await cl.invoke(addr, pull_cmd(topic, q, offset, group="chaos-checker"), 5)
        if r.code != ResponseCode.SUCCESS:
            return out
        out.extend(decode_records(r.body_bytes()))
        offset = int(r.ext_fields["nextBeginOffset"])


async def check(addr: str, topic: str, queues: int, ledger: Ledger,
                known: dict[tuple[int, int], bytes] | None = None) -> Check:
    """Read every queue (from where ``known`` ends; positions in ``known`` were verified before)."""
    known = dict(known or {})
    cl = RemotingClient()
    try:
        max_offsets, ahead = {}, []
        for q in range(queues):
            start = max((off + 1 for (qq, off) in known if qq == q), default=0)
            for m in await _read_queue(cl, addr, topic, q, start):
                known[(q, m.queue_offset)] = m.body
            r = await cl.invoke(addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": q}), 3)
            max_offsets[q] = int(r.ext_fields["offset"])
            r = await cl.invoke(addr, RemotingCommand.request(
                RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": topic, "queueId": q}), 3)
            if r.code == ResponseCode.SUCCESS and int(r.ext_fields["offset"]) > max_offsets[q]:
                ahead.append((q, int(r.ext_fields["offset"]), max_offsets[q]))
    finally:
        await cl.close()
    where: dict[bytes, list[tuple[int, int]]] = {}
    for pos, body in known.items():
        where.setdefault(body, []).append(pos)
    lost, misplaced = [], []
    for body, pos in ledger.acked.items():
        if body not in where:
            lost.append(body)
        elif pos not in where[body]:
            misplaced.append(body)
    gaps = 0
    for q in range(queues):
        offs = sorted(off for (qq, off) in known if qq == q)
        gaps += (offs[-1] - offs[0] + 1 - len(offs)) if offs else 0
        gaps += max_offsets[q] - (offs[-1] + 1 if offs else 0)  # max offset says more exist
    return Check(
        stored=known, lost=lost, misplaced=misplaced,
        duplicates=sum(1 for v in where.values() if len(v) > 1),
        gaps=gaps,
        phantoms=sum(1 for b in where if b not in ledger.sent),
        indeterminate_stored=sum(1 for b in ledger.indeterminate if b in where),
        max_offsets=max_offsets, offsets_ahead=ahead,
    )
