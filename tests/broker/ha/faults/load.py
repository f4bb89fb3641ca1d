"""Load for the fault-injection suite (issue 17): producers sending sequence-numbered messages while
faults happen, recording every attempt, and a reader consuming a topic afterwards.

- :class:`OurProducer`: TideMQ's client (``SyncProducer``, sync sends with its retries and its
  fault-driven route refresh) in a thread, one send at a time.
- :class:`CppProducer`: the RocketMQ C++ client (``cpp_producer.py``) in its own process.

Both record :class:`Attempt` values with ``time.monotonic()`` stamps (one clock for every process
on the machine), so the time from a fault to the first new acknowledgement can be measured.
Only SEND_OK counts as acknowledged: FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE mean "stored on
the master, not replicated as promised", which a producer must not take as durable.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tidemq.client import ClientConfig
from tidemq.client.pull import PullStatus
from tidemq.client.send import build_send_request, prepare_message
from tidemq.client.sync import SyncProducer, SyncPullConsumer
from tidemq.errors import TideMQError
from tidemq.message import Message, decode_offset_msg_id
from tidemq.remoting import ResponseCode
from tidemq.remoting.transport import RemotingClient

CPP_PRODUCER = Path(__file__).with_name("cpp_producer.py")
CPP_STATUS = {0: "SEND_OK", 1: "FLUSH_DISK_TIMEOUT", 2: "FLUSH_SLAVE_TIMEOUT", 3: "SLAVE_NOT_AVAILABLE"}


@dataclass(frozen=True, slots=True)
class Attempt:
    """One send: its body, when it started and ended (monotonic seconds), its outcome (a send
    status name, or ``error: ...``) and the broker that stored it (host:port, from the answer's
    offset message id; "" when unknown, as for the C++ client)."""

    body: str
    started: float
    ended: float
    outcome: str
    store: str = ""

    @property
    def acked(self) -> bool:
        return self.outcome == "SEND_OK"


def first_ack_after(attempts: list[Attempt], t: float) -> float | None:
    """Seconds from ``t`` to the first acknowledgement of a send started after it (an answer the
    old master wrote just before the fault can arrive after ``t``: it is not a new one)."""
    ends = [a.ended for a in attempts if a.acked and a.started > t]
    return min(ends) - t if ends else None


class OurProducer:
    """TideMQ's producer sending ``<prefix>-<seq>`` in a thread until :meth:`stop`."""

    def __init__(self, namesrv: str, topic: str, prefix: str, timeout: float = 3.0, pace: float = 0.01) -> None:
        self.topic, self.prefix, self.timeout, self.pace = topic, prefix, timeout, pace
        self.attempts: list[Attempt] = []  # appended by the thread only; list.append is atomic
        self._producer = SyncProducer(f"fault-pg-{uuid.uuid4().hex[:6]}", namesrv,
                                      ClientConfig(request_timeout=timeout, retry_times_when_send_failed=2))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"producer-{prefix}", daemon=True)

    def start(self) -> "OurProducer":
        self._producer.start()
        self._thread.start()
        return self

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            body = f"{self.prefix}-{seq}"
            started = time.monotonic()
            store = ""
            try:
                result = self._producer.send(Message(self.topic, body.encode(), keys=[body]), timeout=self.timeout)
                outcome = result.status.value
                store = decode_offset_msg_id(result.offset_msg_id)[0]
            except TideMQError as exc:
                outcome = f"error: {type(exc).__name__}: {exc}"
            attempt = Attempt(body, started, time.monotonic(), outcome, store)
            self.attempts.append(attempt)
            seq += 1
            time.sleep(self.pace if attempt.acked else 0.05)  # failures come fast: do not spin

    def wait_acks(self, count: int, timeout: float) -> None:
        """Wait until ``count`` more sends than now have been acknowledged."""
        target = sum(a.acked for a in self.attempts) + count
        deadline = time.monotonic() + timeout
        while sum(a.acked for a in self.attempts) < target:
            if time.monotonic() > deadline:
                last = self.attempts[-1].outcome if self.attempts else "no attempt yet"
                raise AssertionError(f"producer {self.prefix}: {count} acknowledgements not within "
                                     f"{timeout:g} s (last outcome: {last})")
            time.sleep(0.05)

    def wait_new_ack(self, since: float, timeout: float) -> float:
        """Wait until a send started after ``since`` is acknowledged; seconds from ``since`` to it.
        (A send in flight at ``since`` may be acknowledged too, by a new master: it waits for one
        within its timeout; it is not a new acknowledgement.)"""
        deadline = time.monotonic() + timeout
        while (took := first_ack_after(self.attempts, since)) is None:
            if time.monotonic() > deadline:
                last = self.attempts[-1].outcome if self.attempts else "no attempt yet"
                raise AssertionError(f"producer {self.prefix}: no send started after the fault was "
                                     f"acknowledged within {timeout:g} s (last outcome: {last})")
            time.sleep(0.05)
        return took

    def stop(self) -> list[Attempt]:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(self.timeout + 10)
        try:
            assert not self._thread.is_alive(), f"producer {self.prefix}: a send hung past its timeout"
        finally:
            self._producer.close()
        return list(self.attempts)


class CppProducer:
    """The RocketMQ C++ client sending ``<prefix>-<seq>`` in its own process until :meth:`stop`."""

    def __init__(self, namesrv: str, topic: str, prefix: str, root: Path, timeout_ms: int = 3000) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        self.out, self.stop_file = root / f"{prefix}.jsonl", root / f"{prefix}.stop"
        self.args = {"namesrv": namesrv, "topic": topic, "prefix": prefix, "group": f"cpp-pg-{uuid.uuid4().hex[:6]}",
                     "out": str(self.out), "stop": str(self.stop_file), "timeout_ms": timeout_ms, "pace": 0.01}
        self.log = root / f"{prefix}.log"
        self.timeout = timeout_ms / 1000
        self.proc: subprocess.Popen | None = None

    def start(self) -> "CppProducer":
        with open(self.log, "ab") as log:
            # HOME: the C++ client writes its own logs under ~/logs/rocketmq-cpp
            self.proc = subprocess.Popen([sys.executable, str(CPP_PRODUCER)], stdin=subprocess.PIPE, stdout=log,
                                         stderr=subprocess.STDOUT, env=dict(os.environ, HOME=str(self.log.parent)))
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(self.args).encode())
        self.proc.stdin.close()
        return self

    @property
    def attempts(self) -> list[Attempt]:
        out = []
        if self.out.exists():
            for line in self.out.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # the line being written right now
                    continue
                outcome = CPP_STATUS.get(rec["status"], str(rec["status"])) if "status" in rec else \
                    f"error: {rec.get('error')}"
                out.append(Attempt(rec["body"], rec["started"], rec["ended"], outcome))
        return out

    def wait_acks(self, count: int, timeout: float) -> None:
        target = sum(a.acked for a in self.attempts) + count
        deadline = time.monotonic() + timeout
        while sum(a.acked for a in self.attempts) < target:
            assert self.proc is not None and self.proc.poll() is None, \
                f"the C++ producer exited ({self.proc and self.proc.returncode}): {self.log.read_text()[-2000:]}"
            if time.monotonic() > deadline:
                raise AssertionError(f"C++ producer {self.prefix}: {count} acknowledgements not within {timeout:g} s")
            time.sleep(0.1)

    def stop(self) -> list[Attempt]:
        self.stop_file.touch()
        assert self.proc is not None
        try:
            self.proc.wait(self.timeout * 4 + 15)  # a send in flight, its retries, then shutdown()
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the C++ producer {self.prefix} did not stop: a send hung") from None
        return self.attempts


def read_topic(namesrv: str, topic: str, timeout: float = 30.0) -> list[str]:
    """Every message body of ``topic`` as its master serves it now (queue by queue, from 0)."""
    bodies: list[str] = []
    deadline = time.monotonic() + timeout
    with SyncPullConsumer(f"fault-reader-{uuid.uuid4().hex[:6]}", namesrv, ClientConfig(request_timeout=5.0)) as c:
        for mq in c.fetch_queues(topic):
            offset = 0
            while time.monotonic() < deadline:
                r = c.pull(mq, offset, 32)
                bodies.extend(m.body.decode() for m in r.messages)
                if r.status is not PullStatus.FOUND or r.next_begin_offset == offset:
                    break
                offset = r.next_begin_offset
    return bodies


def direct_send(addr: str, topic: str, body: str, timeout: float = 3.0) -> Attempt:
    """One SEND_MESSAGE_V2 straight to the broker at ``addr``, to queue 0, no route and no retry:
    what a client with a stale route does to a replica that used to be master."""

    async def send() -> str:
        client = RemotingClient()
        try:
            out = prepare_message(Message(topic, body.encode(), keys=[body]), uuid.uuid4().hex.upper(), None)
            resp = await client.invoke(addr, build_send_request("fault-direct-pg", out, 0, int(time.time() * 1000)),
                                       timeout)
        except (TideMQError, OSError, asyncio.TimeoutError) as exc:
            return f"error: {type(exc).__name__}: {exc}"
        finally:
            await client.close()
        try:
            code = ResponseCode(resp.code)
        except ValueError:
            return f"code {resp.code}"
        return "SEND_OK" if code is ResponseCode.SUCCESS else code.name

    started = time.monotonic()
    outcome = asyncio.run(send())
    return Attempt(body, started, time.monotonic(), outcome)
