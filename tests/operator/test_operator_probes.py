"""The probes a managed Cluster's pods get mean useful (issue 18, item 10).

A name server is ready once a broker registration period has passed since it started
(``--ready-delay``: every live broker has registered with it again by then) and a broker
registered (``--ready-grace`` bounds the wait when no broker exists). The StatefulSet controller
rolls the name servers (podManagementPolicy Parallel) pod by pod on readiness alone, so a roll
moves on only after every live broker re-registered with the new pod; the operator's rollout
waits on availableReplicas (tests/operator/test_operator_rollout.py). The name-server args the
operator writes are run here as a real process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.http import status
from tests.procs import ServerProcess, free_port, tidemq_cmd, wait_ready
from tidemq.operator import workloads


def cluster(config: dict[str, str] | None = None) -> dict[str, Any]:
    brokers: dict[str, Any] = {"groups": 1}
    if config is not None:
        brokers["config"] = config
    return {"apiVersion": "tidemq.io/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "demo", "namespace": "ns", "uid": "u-1"},
            "spec": {"image": "tidemq:1", "brokers": brokers}}


def namesrv_sts(c: dict[str, Any], **kw: bool) -> dict[str, Any]:
    return next(o for o in workloads.desired_objects(c, **kw)
                if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "demo-namesrv")


def args_of(sts: dict[str, Any]) -> list[str]:
    return list(sts["spec"]["template"]["spec"]["containers"][0]["args"])


def arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize(("config", "delay", "grace"), [
    (None, "33", "40"),                                        # the brokers' default 30 s
    ({"registerNameServerPeriod": "60000"}, "63", "70"),       # RocketMQ's key, in milliseconds
    ({"register-interval": "5"}, "8", "15"),                   # our option name, in seconds
    ({"registerNameServerPeriod": "soon"}, "33", "40"),        # no number: the broker refuses it
    ({"registerNameServerPeriod": "-1"}, "33", "40"),
])
def test_name_servers_are_ready_a_registration_period_after_start(config, delay, grace) -> None:
    sts = namesrv_sts(cluster(config))
    assert arg(args_of(sts), "--ready-delay") == delay
    assert arg(args_of(sts), "--ready-grace") == grace
    assert sts["spec"]["podManagementPolicy"] == "Parallel"  # why readiness, not minReadySeconds, paces it


def test_every_server_is_probed_for_readiness_on_readyz() -> None:
    for sts in (o for o in workloads.desired_objects(cluster()) if o["kind"] == "StatefulSet"):
        probe = sts["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
        assert probe["httpGet"]["path"] == "/readyz" and probe["periodSeconds"] <= 5


def test_the_operators_name_server_args_make_a_name_server_ready_only_with_routes(tmp_path: Path) -> None:
    """The args as the StatefulSet gives them (ports moved to free loopback ones; brokers
    registering every second): not ready while no broker registered, ready once one did and a
    registration period passed."""
    args = args_of(namesrv_sts(cluster({"register-interval": "1"}), namesrv_acl=False))
    port, mport = free_port(), free_port()
    args[args.index("--listen") + 1] = f"127.0.0.1:{port}"
    args[args.index("--metrics-listen") + 1] = f"127.0.0.1:{mport}"
    ns = ServerProcess(tidemq_cmd("namesrv", *args), tmp_path / "namesrv.log",
                       f"http://127.0.0.1:{mport}/healthz").start()
    broker = None
    try:
        assert status(f"http://127.0.0.1:{mport}/readyz") == 503
        b_metrics = free_port()
        broker = ServerProcess(tidemq_cmd(
            "broker", "--namesrv", f"127.0.0.1:{port}", "--listen", f"127.0.0.1:{free_port()}",
            "--store", str(tmp_path / "store"), "--segment-size", str(4 << 20), "--register-interval", "1",
            "--metrics-listen", f"127.0.0.1:{b_metrics}"),
            tmp_path / "broker.log", f"http://127.0.0.1:{b_metrics}/readyz").start()
        wait_ready(f"http://127.0.0.1:{mport}/readyz", timeout=10)
    finally:
        if broker is not None:
            broker.stop()
        ns.stop()
