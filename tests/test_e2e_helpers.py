"""The kind e2e suite's pieces that run without a cluster (issue 18): the Helm wait flag, the
name-server roll's route checks, and tmqload's ``routes`` watch against real name servers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from e2e.incluster import tmqload
from e2e.install import wait_flag
from e2e.scenario import answers_without_routes_once_ready
from tests.procs import Cluster, ServerProcess, free_port, tidemq_cmd

TMQLOAD = Path(__file__).resolve().parents[1] / "e2e" / "incluster" / "tmqload.py"


def test_helm_4_is_asked_for_helm_3s_wait() -> None:
    assert wait_flag("v3.19.5\n") == "--wait"
    assert wait_flag("v4.0.0") == wait_flag("v4.2.1") == "--wait=legacy"
    assert wait_flag("") == "--wait"  # unknown: Helm 3's flag, which Helm 4 also accepts


def test_a_route_watch_counts_rounds_where_no_name_server_had_the_route() -> None:
    w = tmqload.RouteWatch(["a:1", "b:1"])
    w.sample(10.0, [(tmqload.ROUTE, 2), (tmqload.DOWN, 0)])
    w.sample(10.5, [(tmqload.NONE, 0), (tmqload.DOWN, 0)])
    w.sample(11.0, [(tmqload.ROUTE, 1), (tmqload.NONE, 0)])
    s = w.summary()
    assert (s["samples"], s["empty"], s["empty_at"], s["most_brokers"]) == (3, 1, [10.5], 2)
    assert s["none_at"] == {"a:1": [10.5], "b:1": [11.0]}
    assert s["counts"]["b:1"] == {"route": 0, "none": 1, "down": 2}


def test_no_route_answers_count_against_a_name_server_only_once_its_pod_was_ready() -> None:
    routes = {"none_at": {"tidemq-namesrv-0.tidemq-namesrv-headless.ns.svc:9876": [100.0, 104.0, 107.5],
                          "tidemq-namesrv-1.tidemq-namesrv-headless.ns.svc:9876": [50.0]}}
    late = answers_without_routes_once_ready(routes, {"tidemq-namesrv-0": 105.0, "tidemq-namesrv-1": 60.0})
    assert late == {"tidemq-namesrv-0.tidemq-namesrv-headless.ns.svc:9876": [107.5]}  # 104 is within the slack


def test_tmqload_routes_tells_route_no_route_and_down_apart(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "c").start()
    bare_port, bare_metrics, dead = free_port(), free_port(), free_port()
    bare = ServerProcess(tidemq_cmd("namesrv", "--listen", f"127.0.0.1:{bare_port}",
                                    "--metrics-listen", f"127.0.0.1:{bare_metrics}"),
                         tmp_path / "bare.log", f"http://127.0.0.1:{bare_metrics}/readyz").start()
    try:
        cluster.create_topic("watched", queues=2)
        addrs = [cluster.namesrv_addr, f"127.0.0.1:{bare_port}", f"127.0.0.1:{dead}"]
        proc = subprocess.run([sys.executable, str(TMQLOAD), "routes", "--namesrv", ";".join(addrs),
                               "--topic", "watched", "--interval", "0.2", "--max-seconds", "2",
                               "--request-timeout", "1"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = tmqload.parse_summary(proc.stdout)
        assert summary is not None, proc.stdout[-2000:]
        counts = summary["counts"]
        assert counts[addrs[0]]["route"] == summary["samples"] > 0, json.dumps(summary)
        assert counts[addrs[1]]["none"] == summary["samples"] and summary["none_at"][addrs[1]]
        assert counts[addrs[2]]["down"] == summary["samples"]
        assert summary["empty"] == 0 and summary["most_brokers"] == 1
    finally:
        bare.stop()
        cluster.stop()
