"""Scenarios driven by the RocketMQ C++ client (PyPI wheel `rocketmq` 0.4.4), one per process.

Run as ``python cpp_scenarios.py SCENARIO`` with the JSON arguments on stdin; prints one JSON document on stdout. Each
scenario runs in its own process so the C++ library's threads and global state never leak into
pytest, and a crash in it is a failed test, not a dead test run.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from rocketmq.client import Message, PullConsumer, PushConsumer, Producer


def _msg(topic: str, body: str, tags: str | None = None, keys: str | None = None) -> Message:
    m = Message(topic)
    m.set_body(body)
    if tags:
        m.set_tags(tags)
    if keys:
        m.set_keys(keys)
    return m


def produce(a: dict) -> dict:
    p = Producer(a.get("group", "cpp-producer"), max_message_size=a.get("max_message_size", 4 * 1024 * 1024))
    p.set_namesrv_addr(a["namesrv"])
    p.start()
    out: dict[str, list] = {"sync": [], "oneway": 0, "orderly": [], "batch": None}
    try:
        topic = a["topic"]
        for i, spec in enumerate(a.get("sync", [])):
            r = p.send_sync(_msg(topic, spec["body"], spec.get("tags"), spec.get("keys")))
            out["sync"].append({"status": int(r.status), "msg_id": r.msg_id, "offset": r.offset})
        for spec in a.get("oneway", []):
            p.send_oneway(_msg(topic, spec["body"], spec.get("tags"), spec.get("keys")))
            out["oneway"] += 1
        for spec in a.get("orderly", []):
            r = p.send_orderly(_msg(topic, spec["body"], spec.get("tags"), spec.get("keys")), spec["arg"])
            out["orderly"].append({"status": int(r.status), "msg_id": r.msg_id, "offset": r.offset})
        if a.get("batch"):
            msgs = [_msg(topic, spec["body"], spec.get("tags"), spec.get("keys")) for spec in a["batch"]]
            r = p.send_batch(msgs)
            out["batch"] = {"status": int(r.status), "offset": r.offset}
        time.sleep(0.3 if a.get("oneway") else 0)  # let oneway frames leave before shutdown
    finally:
        p.shutdown()
    return out


def _recv(m) -> dict:
    return {
        "topic": m.topic,
        "body": m.body.decode("utf-8", errors="replace"),
        "tags": m.tags.decode() if isinstance(m.tags, bytes) else m.tags,
        "keys": m.keys.decode() if isinstance(m.keys, bytes) else m.keys,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "msg_id": m.id.decode() if isinstance(m.id, bytes) else m.id,
        "reconsume_times": m.reconsume_times,
    }


def push_consume(a: dict) -> dict:
    got: list[dict] = []
    lock = threading.Lock()
    done = threading.Event()
    expect = a["expect"]

    def on_message(m) -> None:
        with lock:
            got.append(_recv(m))
            if len(got) >= expect:
                done.set()

    c = PushConsumer(a["group"], orderly=a.get("orderly", False))
    c.set_namesrv_addr(a["namesrv"])
    if a.get("threads"):
        c.set_thread_count(a["threads"])
    c.subscribe(a["topic"], on_message, a.get("expression", "*"))
    c.start()
    try:
        done.wait(a.get("timeout", 40))
        # linger to catch messages that should NOT arrive (filters, resume)
        time.sleep(a.get("linger", 0))
    finally:
        c.shutdown()
    return {"messages": got}


def pull_consume(a: dict) -> dict:
    c = PullConsumer(a["group"])
    c.set_namesrv_addr(a["namesrv"])
    c.start()
    got = []
    try:
        for m in c.pull(a["topic"], a.get("expression", "*"), a.get("max_num", 32)):
            got.append(_recv(m))
    finally:
        c.shutdown()
    return {"messages": got}


SCENARIOS = {"produce": produce, "push_consume": push_consume, "pull_consume": pull_consume}

if __name__ == "__main__":
    result = SCENARIOS[sys.argv[1]](json.loads(sys.stdin.read()))
    sys.stdout.write("\n@@RESULT@@" + json.dumps(result) + "\n")
    sys.stdout.flush()
