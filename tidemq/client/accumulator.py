"""The producer's send accumulator: merges the sends of one topic made in the same event-loop
iteration into SEND_BATCH_MESSAGEs (``ClientConfig.coalesce_sends``; aiokafka's
``producer/message_accumulator.py`` role). No routing and no I/O of its own: it hands each merged
part to the ``send_merged`` it is given (the producer's sender) and answers each caller.

Invariants:
- a caller's future yields its own SendResult (its UNIQ_KEY, its offset id, the part's first
  queue offset plus its place in the part), or None when it was alone in its loop iteration (the
  caller then sends it the ordinary way), or the part's error;
- only sends with the same time budget are merged (one caller's short timeout must not become
  its neighbours'), and a part's budget is that timeout;
- a part holds at most MAX_MERGED messages and at most ``max_size`` bytes as the broker counts a
  batch; more pending sends go out as several parts, concurrently;
- a part refused whole for one element's sake (MESSAGE_ILLEGAL: the broker stored none of it) is
  resent one message at a time within what is left of its budget, so only the culprit's caller
  fails;
- every queued or in-flight future is answered: :meth:`SendAccumulator.abandon` (the producer
  closing) and a merge task cancelled before it answered fail the rest with a ClientError that
  says the outcome is unknown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tidemq.client.batching import BATCH_LOG_OVERHEAD
from tidemq.client.request_reply import REPLY_MESSAGE_FLAG
from tidemq.client.send import OutgoingMessage, SendResult
from tidemq.client.tasks import keep
from tidemq.client.validation import RETRY_GROUP_TOPIC_PREFIX
from tidemq.errors import BrokerError, ClientError
from tidemq.message import Prop
from tidemq.remoting import ResponseCode

log = logging.getLogger(__name__)

# Sends merged into one SEND_BATCH_MESSAGE at most (and max_message_size bytes). More pending sends
# go out as several requests, so the broker stores one part while the client prepares the next:
# 256 coroutines sending 1 KiB on the 2-core VM (one run each): parts of 16 -> 55k msg/s, 32 -> 65-77k,
# 64 -> 43-54k, 256 -> 30k; unmerged 18-25k.
MAX_MERGED = 32
MAX_MERGED_BODY = 64 * 1024  # larger bodies are sent alone
# Properties that keep a message out of a batch: a delay level (brokers refuse any DELAY key in a
# batch element, even "0") or a delivery time (RocketMQ 5 timer keys), transactions, and
# request-reply, which keeps its own path.
_NOT_MERGED_KEYS = frozenset({Prop.DELAY, "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS",
                              "__STARTDELIVERTIME", Prop.TRAN_MSG, Prop.CORRELATION_ID})

SendMerged = Callable[[str, list[OutgoingMessage], float], Awaitable[SendResult]]
SendOne = Callable[[OutgoingMessage, float], Awaitable[SendResult]]
_Pending = tuple[OutgoingMessage, "asyncio.Future[SendResult | None]"]


def mergeable(out: OutgoingMessage, props: dict[str, str]) -> bool:
    """Whether a send may join a SEND_BATCH_MESSAGE: a batch element has no sysFlag (so no
    compressed body or transaction flag), and brokers refuse delay levels and retry topics in
    batches; replies and WAIT=false keep their own request header. Large bodies gain nothing
    from merging and could push a batch past the broker's limit where the lone send would pass."""
    return (not out.sys_flag and len(out.body) <= MAX_MERGED_BODY
            and _NOT_MERGED_KEYS.isdisjoint(props)
            and props.get(Prop.WAIT, "true").lower() == "true" and props.get(Prop.MSG_TYPE) != REPLY_MESSAGE_FLAG
            and not out.topic.startswith(RETRY_GROUP_TOPIC_PREFIX))


def split_parts(topic: str, outs: list[OutgoingMessage], max_size: int) -> list[list[int]]:
    """Indexes of ``outs`` in parts of at most MAX_MERGED messages and ``max_size`` bytes (sizes as
    the broker counts a batch element); a message larger than ``max_size`` alone is a part of its own."""
    per_message = len(topic.encode()) + BATCH_LOG_OVERHEAD
    parts: list[list[int]] = []
    size = max_size
    for i, out in enumerate(outs):
        n = per_message + len(out.body) + len(out.properties.encode())
        if size + n > max_size or len(parts[-1]) >= MAX_MERGED:
            parts.append([])
            size = 0
        parts[-1].append(i)
        size += n
    return parts


class SendAccumulator:
    """Sends waiting for this loop iteration's merge, keyed by (topic, timeout).

    ``send_merged(topic, outs, timeout)`` sends one part; ``send_one(out, timeout)`` one message
    (after a MESSAGE_ILLEGAL refusal). ``default_timeout`` stands for a send without one;
    ``tasks`` keeps the merge tasks, so that the producer's close waits for them.
    """

    def __init__(self, send_merged: SendMerged, send_one: SendOne, *, max_size: int,
                 default_timeout: float, tasks: set[asyncio.Task]) -> None:
        self._send_merged = send_merged
        self._send_one = send_one
        self.max_size = max_size
        self.default_timeout = default_timeout
        self._tasks = tasks
        self._pending: dict[tuple[str, float], list[_Pending]] = {}

    def add(self, out: OutgoingMessage, timeout: float | None) -> asyncio.Future[SendResult | None]:
        """Queue ``out`` for this loop iteration's merge; the future yields its SendResult, or None
        when it was alone (the caller sends it as usual)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[SendResult | None] = loop.create_future()
        key = (out.topic, self.default_timeout if timeout is None else timeout)
        pending = self._pending.get(key)
        if pending is None:
            self._pending[key] = pending = []
            loop.call_soon(self._flush, key)
        pending.append((out, fut))
        return fut

    def abandon(self) -> None:
        """Answer every queued send with the "abandoned" error (the producer is closing)."""
        for entries in self._pending.values():
            _abandon(entries)
        self._pending.clear()

    def _flush(self, key: tuple[str, float]) -> None:
        entries = [e for e in self._pending.pop(key, ()) if not e[1].done()]  # cancelled callers drop out
        if len(entries) == 1:
            entries[0][1].set_result(None)
        elif entries:
            task = keep(self._tasks, self._send_all(key[0], key[1], entries))
            task.add_done_callback(lambda _t: _abandon(entries))  # e.g. cancelled by close() before it ran

    async def _send_all(self, topic: str, timeout: float, entries: list[_Pending]) -> None:
        parts = split_parts(topic, [e[0] for e in entries], self.max_size)
        await asyncio.gather(*(self._send_part(topic, timeout, [entries[i] for i in part])
                               for part in parts))

    async def _send_part(self, topic: str, timeout: float, part: list[_Pending]) -> None:
        outs = [e[0] for e in part]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            res = await self._send_merged(topic, outs, timeout)
        except Exception as exc:  # noqa: BLE001 (every merged send fails with it; cancellation: _abandon)
            if (len(part) > 1 and isinstance(exc, BrokerError) and exc.code == ResponseCode.MESSAGE_ILLEGAL
                    and deadline - loop.time() > 0):
                # Refused whole before anything was stored, for one element's sake (e.g. a broker whose
                # body limit is below ours): each goes alone, so only the culprit's caller fails.
                await asyncio.gather(*(self._send_alone(e, deadline) for e in part))
                return
            for _out, fut in part:
                if not fut.done():
                    fut.set_exception(exc)
            return
        ids = res.offset_msg_id.split(",")
        if len(ids) != len(outs):  # a broker that answers a batch with one id: all share it
            log.warning("broker answered a batch of %d with %d message ids", len(outs), len(ids))
            ids = [res.offset_msg_id] * len(outs)
        for i, (o, fut) in enumerate(part):
            if not fut.done():
                fut.set_result(SendResult(res.status, o.uniq_key, ids[i], res.message_queue, res.queue_offset + i))

    async def _send_alone(self, entry: _Pending, deadline: float) -> None:
        out, fut = entry
        if fut.done():
            return
        try:
            remaining = max(0.001, deadline - asyncio.get_running_loop().time())
            res = await self._send_one(out, remaining)
        except Exception as exc:  # noqa: BLE001 (the caller's own send: it gets the error)
            if not fut.done():
                fut.set_exception(exc)
        else:
            if not fut.done():
                fut.set_result(res)


def _abandon(entries: list[_Pending]) -> None:
    """Answer merged sends whose request was abandoned (the producer closed): an error that
    says the outcome is unknown, not a cancellation the caller never asked for."""
    for out, fut in entries:
        if not fut.done():
            fut.set_exception(ClientError(
                f"send of message {out.uniq_key} to topic {out.topic} was abandoned when the producer "
                "closed before the broker answered; it may or may not have been stored"))
