"""Delay-level and retry scenarios driven by the RocketMQ C++ client (PyPI wheel `rocketmq` 0.4.4),
one per process, like cpp_scenarios.py: ``python cpp_scenarios_retry.py SCENARIO`` with JSON
arguments on stdin; prints one JSON document after a ``@@RESULT@@`` marker.

The wheel's PushConsumer.subscribe always answers CONSUME_SUCCESS (its wrapper re-raises and the
C++ side never sees the status), so ``reconsume_later`` registers a raw callback that returns the
C++ ConsumeStatus itself (0 CONSUME_SUCCESS, 1 RECONSUME_LATER).
"""

from __future__ import annotations

import json
import sys
import threading
import time

from rocketmq.client import Message, Producer, PushConsumer, RecvMessage, _to_bytes, dll, ffi_check

CONSUME_SUCCESS = 0
RECONSUME_LATER = 1


def _text(v) -> str:
    return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)


def _record(m: RecvMessage) -> dict:
    return {
        "at": time.time(),
        "topic": _text(m.topic),
        "body": _text(m.body),
        "msg_id": _text(m.id),
        "reconsume_times": m.reconsume_times,
        "store_timestamp": m.store_timestamp,
        "queue_id": m.queue_id,
    }


def _producer(a: dict) -> Producer:
    p = Producer(a.get("producer_group", "cpp-retry-producer"))
    p.set_namesrv_addr(a["namesrv"])
    p.start()
    return p


def _send(p: Producer, topic: str, body: str, level: int = 0) -> dict:
    m = Message(topic)
    m.set_body(body)
    m.set_tags("T")
    if level:
        m.set_delay_time_level(level)
    t = time.time()
    r = p.send_sync(m)
    return {"sent_at": t, "status": int(r.status), "msg_id": r.msg_id}


def delayed(a: dict) -> dict:
    """Start a push consumer, then send one message with a delay level; report when it arrives."""
    got: list[dict] = []
    done = threading.Event()

    def on_message(m) -> None:
        got.append(_record(m))
        done.set()

    c = PushConsumer(a["group"])
    c.set_namesrv_addr(a["namesrv"])
    c.subscribe(a["topic"], on_message, "*")
    c.start()
    p = _producer(a)
    try:
        time.sleep(a.get("warmup", 1.0))  # let the consumer's first rebalance settle
        sent = _send(p, a["topic"], a["body"], a["level"])
        done.wait(a.get("timeout", 15))
        time.sleep(a.get("linger", 0))
    finally:
        p.shutdown()
        c.shutdown()
    return {"sent": sent, "messages": got}


def reconsume_later(a: dict) -> dict:
    """Answer RECONSUME_LATER to the first ``fail_times`` deliveries, then CONSUME_SUCCESS."""
    got: list[dict] = []
    lock = threading.Lock()
    done = threading.Event()
    fail_times = a["fail_times"]

    def raw(_consumer, msg) -> int:
        rec = _record(RecvMessage(msg))
        with lock:
            got.append(rec)
            if len(got) > fail_times:
                done.set()
                return CONSUME_SUCCESS
        return RECONSUME_LATER

    c = PushConsumer(a["group"])
    c.set_namesrv_addr(a["namesrv"])
    ffi_check(dll.Subscribe(c._handle, _to_bytes(a["topic"]), _to_bytes("*")))
    c._register_callback(raw)
    c.start()
    p = _producer(a)
    try:
        time.sleep(a.get("warmup", 1.0))
        sent = _send(p, a["topic"], a["body"])
        done.wait(a.get("timeout", 30))
        time.sleep(a.get("linger", 0))  # deliveries after the success would show up here
    finally:
        p.shutdown()
        c.shutdown()
    return {"sent": sent, "messages": got}


SCENARIOS = {"delayed": delayed, "reconsume_later": reconsume_later}

if __name__ == "__main__":
    result = SCENARIOS[sys.argv[1]](json.loads(sys.stdin.read()))
    sys.stdout.write("\n@@RESULT@@" + json.dumps(result) + "\n")
    sys.stdout.flush()
