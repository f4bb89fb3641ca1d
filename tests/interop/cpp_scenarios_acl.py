"""ACL scenarios driven by the RocketMQ C++ client (PyPI wheel `rocketmq` 0.4.4) and its
``set_session_credentials``, one per process like cpp_scenarios.py: ``python cpp_scenarios_acl.py
SCENARIO`` with JSON arguments on stdin; prints one JSON document after a ``@@RESULT@@`` marker.

A refused send raises in the wheel; the scenario records the error text instead of failing, so the
test can check what the broker answered. The wheel's PullConsumer.pull loops for ever on a failed
pull, so refusals of consumers are observed with a PushConsumer and a deadline.
"""

from __future__ import annotations

import json
import sys
import threading

from rocketmq.client import Message, Producer, PushConsumer


def _credentials(client, a: dict) -> None:
    if a.get("access_key") is not None:
        client.set_session_credentials(a["access_key"], a["secret_key"], a.get("channel", "LOCAL"))


def produce(a: dict) -> dict:
    p = Producer(a.get("group", "cpp-acl-producer"))
    p.set_namesrv_addr(a["namesrv"])
    _credentials(p, a)
    p.start()
    out = []
    try:
        for body in a["bodies"]:
            m = Message(a["topic"])
            m.set_body(body)
            m.set_tags("acl")
            try:
                r = p.send_sync(m)
                out.append({"status": int(r.status), "msg_id": r.msg_id})
            except Exception as exc:  # noqa: BLE001 (the broker's refusal, as whichever error the wheel raises)
                out.append({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        p.shutdown()
    return {"results": out}


def push_consume(a: dict) -> dict:
    got: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def on_message(m) -> None:
        with lock:
            got.append(m.body.decode("utf-8", errors="replace"))
            if len(got) >= a["expect"]:
                done.set()

    c = PushConsumer(a["group"])
    c.set_namesrv_addr(a["namesrv"])
    _credentials(c, a)
    c.subscribe(a["topic"], on_message, "*")
    c.start()
    try:
        done.wait(a.get("wait", 30))
    finally:
        c.shutdown()
    return {"messages": got}


SCENARIOS = {"produce": produce, "push_consume": push_consume}

if __name__ == "__main__":
    result = SCENARIOS[sys.argv[1]](json.loads(sys.stdin.read()))
    sys.stdout.write("\n@@RESULT@@" + json.dumps(result) + "\n")
    sys.stdout.flush()
