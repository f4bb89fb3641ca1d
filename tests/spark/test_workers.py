"""register() checks that Spark's Python workers can import tidemq (issue 15, item 2).

A driver started as ``.venv/bin/python job.py`` without the venv on PATH runs its Python workers
under ``python3`` from PATH. The test makes that ``python3`` the venv's base interpreter (same
version, no tidemq) and runs one script in a fresh process (one JVM, three sessions in turn):
PYSPARK_PYTHON unset, then naming a file that does not exist, then set to the driver's Python as
the error says, which reads the topic.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark.support import send
from tests.support.topics import create_topic_sync
from tidemq.spark.workers import _reason

SCRIPT = """
import os, sys
from pyspark.sql import SparkSession
import tidemq.spark
from tidemq.spark.workers import WorkerPythonError

def session():
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark

for case, python in (("unset", None), ("missing", "/nonexistent/python3"), ("fixed", sys.executable)):
    if python is not None:
        os.environ["PYSPARK_PYTHON"] = python
    spark = session()
    try:
        tidemq.spark.register(spark)
    except WorkerPythonError as exc:
        print(case, "ERROR", exc, flush=True)
    else:
        n = spark.read.format("tidemq").option("nameServers", sys.argv[1]) \\
            .option("subscribe", sys.argv[2]).load().count()
        print(case, "COUNT", n, flush=True)
    spark.stop()
"""


def plain_python() -> str:
    """The venv's base interpreter: the Python version of the driver, without tidemq."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    if Path(base).resolve() == Path(sys.executable).resolve():
        pytest.skip("the tests do not run in a venv: no Python without tidemq at hand")
    probe = subprocess.run([base, "-c", "import tidemq"], capture_output=True, cwd="/", timeout=60)
    if probe.returncode == 0:
        pytest.skip(f"{base} (the venv's base Python) has tidemq installed too")
    return base


@pytest.mark.slow  # ~15-30 s: the default suite's 15-minute budget
def test_register_names_pyspark_python_when_workers_cannot_import_tidemq(cluster, tmp_path):
    topic = create_topic_sync(cluster, "spark-workers", 1)
    send(cluster, topic, 5, queues=1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(plain_python())
    venv_bin = str(Path(sys.executable).parent)
    path = [str(bin_dir)] + [p for p in os.environ.get("PATH", "").split(os.pathsep)
                             if p and Path(p).resolve() != Path(venv_bin).resolve()]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(path)
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script), cluster.namesrv_addr, topic],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    out = {line.split(" ", 1)[0]: line for line in r.stdout.splitlines()}
    assert set(out) == {"unset", "missing", "fixed"}, r.stdout + r.stderr[-3000:]

    unset = out["unset"]
    assert "ERROR Spark's Python workers run python3 (" in unset
    assert "which cannot import tidemq: ModuleNotFoundError: No module named 'tidemq'" in unset
    assert f"export PYSPARK_PYTHON={sys.executable}" in unset
    assert "spark.pyspark.python" in unset

    missing = out["missing"]
    assert "ERROR Spark's Python workers run /nonexistent/python3, which failed to start: " \
           'Cannot run program "/nonexistent/python3"' in missing
    assert "PYSPARK_PYTHON" in missing

    assert out["fixed"] == "fixed COUNT 5"


def test_reason_picks_the_line_that_says_why_a_worker_failed() -> None:
    java = ("An error occurred while calling o1.collect.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: Lost task 0.0 "
            '(executor driver): java.io.IOException: Cannot run program "/x/python": error=2, '
            "No such file or directory\n\tat java.lang.ProcessBuilder.start")
    assert _reason(RuntimeError(java)) == 'Cannot run program "/x/python": error=2, No such file or directory'
    mismatch = ("org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
                "pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] "
                "Python in worker has different version: 3.12 than that in driver: 3.11.")
    assert _reason(RuntimeError(mismatch)).startswith("[PYTHON_VERSION_MISMATCH] Python in worker")
    other = ("py4j.protocol.Py4JJavaError: An error occurred\n"
             "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
             '  File "worker.py", line 1\n'
             "ImportError: libarrow.so.1900: cannot open shared object file\n")
    assert _reason(RuntimeError(other)) == "ImportError: libarrow.so.1900: cannot open shared object file"
    assert len(_reason(RuntimeError("x" * 5000))) == 400
