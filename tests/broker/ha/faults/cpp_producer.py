"""A RocketMQ C++ client producer (PyPI wheel `rocketmq`) for the fault-injection suite, run in its
own process: ``python cpp_producer.py`` with JSON arguments on stdin (namesrv, topic, prefix,
group, out, stop, timeout_ms, pace).

It sends ``<prefix>-<seq>`` with send_sync, one at a time, until the file ``stop`` exists, and
appends one JSON line per attempt to ``out`` as soon as the answer comes: seq, body, started and
ended (time.monotonic(), one clock for every process of the machine) and status (the C++
SendStatus: 0 SEND_OK, 2 FLUSH_SLAVE_TIMEOUT, 3 SLAVE_NOT_AVAILABLE) or error. Writing each line
at once keeps what was acknowledged even if this process is killed.

The C++ client reads a topic's route every 30 s and, unlike ours, does not refresh it after a
failed send: after a failover it keeps sending to the old master until its next poll. That is
what a RocketMQ 4.x application does, and the test wants it: a stale master must refuse them.
Bodies carry no NUL byte (the wheel's c_char_p reading stops at one).
"""

from __future__ import annotations

import json
import os
import sys
import time

from rocketmq.client import Message, Producer


def main() -> None:
    args = json.load(sys.stdin)
    producer = Producer(args["group"], timeout=args.get("timeout_ms", 3000))
    producer.set_namesrv_addr(args["namesrv"])
    producer.start()
    seq = 0
    try:
        with open(args["out"], "a", encoding="utf-8") as out:
            while not os.path.exists(args["stop"]):
                body = f"{args['prefix']}-{seq}"
                msg = Message(args["topic"])
                msg.set_keys(body)
                msg.set_body(body)
                started = time.monotonic()
                record: dict[str, object] = {"seq": seq, "body": body, "started": started}
                try:
                    result = producer.send_sync(msg)
                    record["status"] = int(result.status)
                except Exception as exc:  # noqa: BLE001 (every failed send is recorded, none ends the loop)
                    record["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                record["ended"] = time.monotonic()
                out.write(json.dumps(record) + "\n")
                out.flush()
                seq += 1
                # after a failure, back off a little: a stale master refuses at once, and a tight
                # loop of refusals would only load the machine the replicas run on
                time.sleep(args.get("pace", 0.01) if record.get("status") == 0 else 0.1)
    finally:
        producer.shutdown()


if __name__ == "__main__":
    main()
