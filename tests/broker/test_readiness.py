"""A broker is ready once a name server accepted its registration (issue 18, item 10): before
that, clients cannot find it, and a rollout that moved on would take routes away.

Real processes (tests/procs.py). A name server that refuses the broker (write protection, the
broker unsigned) is covered by tests/namesrv/test_namesrv_write_acl.py and
tests/operator/test_operator_clusterkey.py.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.http import status
from tests.procs import ServerProcess, free_port, tidemq_cmd
from tests.support.waiting import wait_until_sync


def test_a_broker_is_ready_only_once_a_name_server_took_its_registration(tmp_path: Path) -> None:
    ns_port, ns_metrics, b_metrics = free_port(), free_port(), free_port()
    # The default 30 s registration period: readiness soon after the name server comes shows the
    # quicker retries of a broker no name server accepted yet.
    broker = ServerProcess(tidemq_cmd(
        "broker", "--namesrv", f"127.0.0.1:{ns_port}", "--listen", f"127.0.0.1:{free_port()}",
        "--store", str(tmp_path / "store"), "--segment-size", str(4 << 20),
        "--metrics-listen", f"127.0.0.1:{b_metrics}"),
        tmp_path / "broker.log", f"http://127.0.0.1:{b_metrics}/healthz").start()
    ns = ServerProcess(tidemq_cmd("namesrv", "--listen", f"127.0.0.1:{ns_port}",
                                  "--metrics-listen", f"127.0.0.1:{ns_metrics}"),
                       tmp_path / "namesrv.log", f"http://127.0.0.1:{ns_metrics}/readyz")
    readyz = f"http://127.0.0.1:{b_metrics}/readyz"
    try:
        time.sleep(1.5)  # at least one failed round after the one at start
        assert status(readyz) == 503, broker.log()[-2000:]  # alive, no name server knows it
        ns.start()
        wait_until_sync(lambda: status(readyz) == 200, "the broker ready after the name server came",
                        timeout=15, interval=0.1)
        assert "registered broker-a" in broker.log()
        ns.stop()
        # A name server lost later does not take the broker out of service.
        assert status(readyz) == 200
    finally:
        broker.stop()
        ns.stop()
