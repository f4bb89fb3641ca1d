"""Exactly-once: a streaming query to a file sink, its driver killed with SIGKILL mid-run and
restarted from the checkpoint, ends with every message of the topic exactly once in the output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.spark.support import send
from tests.support.topics import create_topic_sync

JOB = Path(__file__).with_name("eo_job.py")


def _count(folder: Path) -> int:
    return len([p for p in folder.glob("*") if p.name.isdigit()]) if folder.is_dir() else 0


def _start(cluster, topic, out, ck, mode, log):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    return subprocess.Popen([sys.executable, str(JOB), cluster.namesrv_addr, topic, str(out), str(ck),
                             mode], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


# A kill-and-resume cycle of a Spark driver (~35 s): the slow set, with the crash tests.
@pytest.mark.slow
def test_killed_driver_resumes_from_checkpoint_with_each_message_once(spark, cluster, tmp_path):
    topic = create_topic_sync(cluster, "spark-exactly-once", 4)
    sent = send(cluster, topic, 1500)
    out, ck = tmp_path / "out", tmp_path / "checkpoint"
    log_path = tmp_path / "driver.log"
    with open(log_path, "wb") as log:
        driver = _start(cluster, topic, out, ck, "run", log)
        more: list = []
        sender = threading.Thread(target=lambda: more.extend(send(cluster, topic, 1500, start=5000)))
        try:
            deadline = time.monotonic() + 180
            # Kill once a few batches are committed and a newer one is planned but not committed:
            # the driver dies in the middle of writing a batch.
            while not (_count(ck / "commits") >= 3 and _count(ck / "offsets") > _count(ck / "commits")):
                assert driver.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "the query made no progress"
                if _count(ck / "commits") >= 1 and not sender.is_alive() and not more:
                    sender.start()  # more messages arrive while the query runs
                time.sleep(0.02)
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
            sender.join(60)
        committed_before = _count(ck / "commits")
        assert len(more) == 1500
        restarted = _start(cluster, topic, out, ck, "available-now", log)
        assert restarted.wait(240) == 0, log_path.read_text()[-3000:]
    assert _count(ck / "commits") > committed_before
    values = [r.value for r in spark.read.parquet(str(out)).select("value").collect()]
    expected = [v.decode() for _k, v, _t in sent + more]
    assert len(values) == len(expected)  # no duplicates from the killed batch
    assert sorted(values) == sorted(expected)
