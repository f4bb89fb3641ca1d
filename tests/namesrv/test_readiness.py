"""A name server is ready when it is useful (issue 18, item 10): once it holds routes, and not
before ``--ready-delay`` (a broker registration period: every live broker has registered by then),
or once its ``--ready-grace`` passed with no broker (nothing to wait for); without them, at once.

Real processes (tests/procs.py), plus the server in-process with a fake clock for the grace.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.http import status
from tests.procs import ServerProcess, free_port, tidemq_cmd, wait_ready
from tests.support.waiting import wait_until_sync
from tidemq.errors import ConfigError
from tidemq.namesrv import NamesrvConfig, NamesrvServer
from tidemq.remoting import Connection, RemotingCommand, RequestCode


def namesrv(root: Path, *args: str) -> tuple[ServerProcess, str, str]:
    """A name server started until alive (/healthz); its address and /readyz URL."""
    port, mport = free_port(), free_port()
    proc = ServerProcess(tidemq_cmd("namesrv", "--listen", f"127.0.0.1:{port}",
                                    "--metrics-listen", f"127.0.0.1:{mport}", *args),
                         root / "namesrv.log", f"http://127.0.0.1:{mport}/healthz").start()
    return proc, f"127.0.0.1:{port}", f"http://127.0.0.1:{mport}/readyz"


def test_a_name_server_expecting_brokers_is_ready_once_one_registered(tmp_path: Path) -> None:
    ns, addr, readyz = namesrv(tmp_path, "--ready-grace", "600")
    broker = None
    try:
        assert status(readyz) == 503  # alive, but it would answer every route lookup "no route"
        b_metrics = free_port()
        broker = ServerProcess(tidemq_cmd(
            "broker", "--namesrv", addr, "--listen", f"127.0.0.1:{free_port()}", "--store", str(tmp_path / "store"),
            "--segment-size", str(4 << 20), "--metrics-listen", f"127.0.0.1:{b_metrics}"),
            tmp_path / "broker.log", f"http://127.0.0.1:{b_metrics}/readyz").start()
        wait_ready(readyz, timeout=10)
        assert "registered broker-a" in broker.log()
        broker.stop()
        broker = None
        assert status(readyz) == 200  # the broker left (unregistered): ready stays, no rollout stalls on it
    finally:
        if broker is not None:
            broker.stop()
        ns.stop()


def test_a_name_server_with_routes_waits_its_delay(tmp_path: Path) -> None:
    ns, addr, readyz = namesrv(tmp_path, "--ready-delay", "4", "--ready-grace", "600")
    broker = None
    try:
        b_metrics = free_port()
        broker = ServerProcess(tidemq_cmd(
            "broker", "--namesrv", addr, "--listen", f"127.0.0.1:{free_port()}", "--store", str(tmp_path / "store"),
            "--segment-size", str(4 << 20), "--metrics-listen", f"127.0.0.1:{b_metrics}"),
            tmp_path / "broker.log", f"http://127.0.0.1:{b_metrics}/readyz").start()  # registered
        assert status(readyz) == 503  # other brokers may not have come round yet
        wait_ready(readyz, timeout=10)
    finally:
        if broker is not None:
            broker.stop()
        ns.stop()


def test_a_name_server_is_ready_after_its_grace_when_no_broker_comes(tmp_path: Path) -> None:
    ns, _addr, readyz = namesrv(tmp_path, "--ready-grace", "1.5")
    try:
        assert status(readyz) == 503
        wait_until_sync(lambda: status(readyz) == 200, "ready after the grace", timeout=10, interval=0.1)
    finally:
        ns.stop()


def test_without_a_grace_a_name_server_is_ready_at_once(tmp_path: Path) -> None:
    ns, _addr, readyz = namesrv(tmp_path)
    try:
        assert status(readyz) == 200
    finally:
        ns.stop()


def test_the_grace_option_refuses_a_negative_value(tmp_path: Path) -> None:
    from click.testing import CliRunner  # noqa: PLC0415

    from tidemq.cli.servers import namesrv_cmd  # noqa: PLC0415

    for flag in ("--ready-grace", "--ready-delay"):
        r = CliRunner().invoke(namesrv_cmd, [flag, "-1", "--listen", "127.0.0.1:0"])
        assert r.exit_code == 2 and flag in r.output and "Traceback" not in r.output
    for field in ("ready_grace", "ready_delay"):
        with pytest.raises(ConfigError, match=field):
            NamesrvConfig(**{field: -1})


class _Conn:
    """What the registration handler reads of a connection."""

    peer = "127.0.0.1:1"
    is_open = True


def _registration() -> RemotingCommand:
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, {
        "clusterName": "c", "brokerName": "b", "brokerAddr": "127.0.0.1:10911", "brokerId": 0},
        json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {}, "dataVersion": {}},
                    "filterServerList": []}).encode())


@pytest.mark.parametrize("broker_at", [None, 1.0])
async def test_readiness_follows_the_clock_and_the_first_registration(broker_at: float | None) -> None:
    now = [100.0]
    server = NamesrvServer(NamesrvConfig(listen_host="127.0.0.1", listen_port=0, ready_delay=33, ready_grace=40),
                           monotonic=lambda: now[0])
    assert not server.ready  # not listening
    await server.start()
    try:
        if broker_at is not None:
            now[0] += broker_at
            assert not server.ready
            conn: Connection = _Conn()  # type: ignore[assignment]
            resp = server.handle(conn, _registration())
            assert isinstance(resp, RemotingCommand) and resp.code == 0
            now[0] += 33 - broker_at - 0.1
            assert not server.ready  # holds routes, but other brokers may not have come round yet
            now[0] += 0.1
            assert server.ready  # a registration period: every live broker has registered
        else:
            now[0] += 39.9
            assert not server.ready
            now[0] += 0.1
            assert server.ready  # the grace passed with no broker
    finally:
        await server.stop()
    assert not server.ready
