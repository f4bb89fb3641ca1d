"""`tidemq local --demo --exit-after-demo`: the one-process walk-through a new user runs first."""

from __future__ import annotations

from tests.cli.clirun import tidemq
from tests.procs import free_port

SEGMENT = 4 << 20  # not the 1 GiB default: each run would preallocate two segments (2 GiB) on disk


def test_local_demo_sends_consumes_and_exits(tmp_path):
    data = (tmp_path / "data").resolve()
    ns_port, broker_port, metrics_port = free_port(), free_port(), free_port()
    r = tidemq(
        "local", "--demo", "--exit-after-demo", "--data", str(data), "--namesrv-port", str(ns_port),
        "--broker-port", str(broker_port), "--metrics-port", str(metrics_port), "--segment-size", str(SEGMENT),
        timeout=60,
    ).ok()
    lines = r.lines()
    assert f"  name server : 127.0.0.1:{ns_port}   (export NAMESRV_ADDR=127.0.0.1:{ns_port})" in lines
    assert any(line.startswith(f"  broker      : 127.0.0.1:{broker_port} ") for line in lines), r.out
    assert f"  metrics     : http://127.0.0.1:{metrics_port}/metrics  (health: /healthz, /readyz)" in lines
    assert f"  data        : {data}" in lines
    assert sum(line.startswith("demo: sent #") for line in lines) == 5
    assert sum(line.startswith("demo: received 'hello from tidemq #") for line in lines) == 5
    assert "demo: 5 messages consumed by group 'demo-consumer'" in lines
    assert lines[-1] == "TideMQ local stopped."
    segments = sorted((data / "store" / "commitlog").iterdir())
    assert segments and all(f.stat().st_size == SEGMENT for f in segments)


def test_local_with_port_zero_advertises_the_real_broker_port(tmp_path):
    """--broker-port 0 must not advertise port 0 (the demo would then fail to connect)."""
    r = tidemq(
        "local", "--demo", "--exit-after-demo", "--data", str(tmp_path / "d"), "--namesrv-port", "0",
        "--broker-port", "0", "--metrics-port", "0", "--segment-size", str(SEGMENT), timeout=60,
    ).ok()
    assert "demo: 5 messages consumed by group 'demo-consumer'" in r.lines()
    assert "  broker      : 127.0.0.1:0 " not in r.out
