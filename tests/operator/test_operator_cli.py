"""`tidemq operator` before and around kopf: a missing or unreachable Kubernetes API is one line per
attempt and one `Error:` line (no tracebacks), ports in use name their option, and the liveness
endpoint's default is the same in the code, --help, the README and the chart."""

from __future__ import annotations

import io
import logging
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.procs import free_port, tidemq_cmd
from tidemq.cli.common import OneLineFormatter
from tidemq.cli.kube import OneLineConnectionErrors
from tidemq.cli.operator import operator_cmd

pytest.importorskip("kopf")

REPO = Path(__file__).resolve().parents[2]
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


def _kubeconfig(root: Path, server: str) -> Path:
    path = root / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters:\n- name: c\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\n"
        "users:\n- name: u\n  user:\n    token: abc\n"
        "contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n")
    return path


def _operator(*args: str, env: dict[str, str | None], timeout: float = 60) -> tuple[int, str, float]:
    full = dict(os.environ, PYTHONUNBUFFERED="1")
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    t0 = time.monotonic()
    r = subprocess.run(tidemq_cmd("operator", "-n", "default", "--standalone", *args), capture_output=True,
                       timeout=timeout, env=full, cwd=REPO)
    return r.returncode, (r.stdout + r.stderr).decode(errors="replace"), time.monotonic() - t0


def _one_error(out: str) -> str:
    assert "Traceback" not in out, out
    lines = out.splitlines()
    assert all(STAMP.match(line) or line.startswith("Error: ") for line in lines), out
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1, out
    return errors[0]


def test_an_unreachable_kubernetes_api_is_one_line_per_attempt_then_one_error(tmp_path):
    """kopf retried nine times over a minute and died with tracebacks; now the API is probed
    first, each failed attempt is one warning naming the server, its source and the reason."""
    dead = f"https://127.0.0.1:{free_port()}"
    conf = _kubeconfig(tmp_path, dead)
    rc, out, took = _operator("--api-wait", "1.5", "--liveness", "", "--metrics-listen", "",
                              env={"KUBECONFIG": str(conf)})
    assert rc == 1 and took < 30, out
    error = _one_error(out)
    assert f"cannot reach the Kubernetes API at {dead} (from KUBECONFIG={conf})" in error, error
    assert "Connection refused" in error and "--api-wait" in error, error
    attempts = [line for line in out.splitlines() if "WARNING" in line and "not reachable" in line]
    assert len(attempts) >= 2 and all(dead in a and "Connection refused" in a for a in attempts), out


def test_no_kubeconfig_and_no_service_account_is_one_error(tmp_path):
    if os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"):
        pytest.skip("running in a pod: the service account is found")
    rc, out, _ = _operator("--liveness", "", "--metrics-listen", "", env={"KUBECONFIG": None, "HOME": str(tmp_path)})
    assert rc == 1, out
    error = _one_error(out)
    assert "no Kubernetes cluster to talk to" in error and "KUBECONFIG" in error, error


def test_ports_in_use_name_their_option(tmp_path):
    with socket.socket() as api:  # accepts connections (the probe passes) and never answers
        api.bind(("127.0.0.1", 0))
        api.listen(16)
        port = api.getsockname()[1]
        conf = _kubeconfig(tmp_path, f"https://127.0.0.1:{port}")
        env = {"KUBECONFIG": str(conf)}
        rc, out, _ = _operator("--metrics-listen", f"127.0.0.1:{port}", "--liveness", "", env=env)
        assert rc == 1 and "pick a free port with --metrics-listen" in _one_error(out), out
        rc, out, _ = _operator("--metrics-listen", "", "--liveness", f"http://127.0.0.1:{port}/healthz", env=env)
        assert rc == 1, out
        error = [line for line in out.splitlines() if line.startswith("Error: ")]
        assert error == [f"Error: cannot listen on 127.0.0.1:{port} (--liveness): Address already in use; "
                         "another process holds the port: pick a free port with --liveness"], out
        assert "Traceback" not in out, out


def test_liveness_is_on_by_default_in_the_code_help_readme_and_chart():
    """Item 12 of issue 15: on by default (a pod's liveness probe needs it), said everywhere."""
    default = "http://0.0.0.0:8080/healthz"
    param = next(p for p in operator_cmd.params if p.name == "liveness")
    assert param.default == default
    help_text = " ".join(CliRunner().invoke(operator_cmd, ["--help"]).output.split())
    assert "on by default" in help_text and "'' turns it off" in help_text and default in help_text
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"on by default at `{default}`" in readme and "`--liveness ''` turns it off" in readme
    deployment = (REPO / "charts/tidemq/templates/operator-deployment.yaml").read_text()
    assert "- --liveness=http://0.0.0.0:{{ $op.healthPort }}/healthz" in deployment
    assert re.search(r"livenessProbe:\s+httpGet:\s+path: /healthz\s+port: health", deployment)


def test_kopf_connection_errors_lose_their_tracebacks():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(OneLineFormatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(OneLineConnectionErrors())
    kopf_log, asyncio_log, ours = (logging.getLogger(n) for n in ("kopf._core.reactor.running", "asyncio", "tidemq.x"))
    for lg in (kopf_log, asyncio_log, ours):
        lg.addHandler(handler)
        lg.propagate = False
    try:
        try:
            try:
                raise ConnectionRefusedError(111, "Connection refused")
            except OSError as exc:
                raise RuntimeError("Cannot connect to host 127.0.0.1:1") from exc
        except RuntimeError:
            kopf_log.exception("Resource observer has failed: Cannot connect to host 127.0.0.1:1")
            asyncio_log.error("Task exception was never retrieved\nfuture: <Task>", exc_info=True)
            ours.exception("our own failure keeps its traceback")
        kopf_log.error("Request attempt #1/9 failed; will retry: GET https://127.0.0.1:1/api -> "
                       "ClientConnectorError(ConnectionKey(host='127.0.0.1', port=1, is_ssl=True), "
                       "ConnectionRefusedError(111, 'Connect call failed'))")
    finally:
        for lg in (kopf_log, asyncio_log, ours):
            lg.removeHandler(handler)
            lg.propagate = True
    lines = out.getvalue().splitlines()
    assert lines[0] == ("ERROR kopf._core.reactor.running: Resource observer has failed: Cannot connect to "
                        "host 127.0.0.1:1 (Connection refused)")
    assert lines[1] == "ERROR tidemq.x: our own failure keeps its traceback" and lines[2] == "Traceback (most recent call last):"
    assert "Task exception was never retrieved" not in out.getvalue()
    assert lines[-1] == ("ERROR kopf._core.reactor.running: Request attempt #1/9 failed; will retry: GET "
                         "https://127.0.0.1:1/api -> ClientConnectorError(ConnectionRefusedError(111, 'Connect call failed'))")
