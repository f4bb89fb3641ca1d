"""Run the `tidemq` CLI as a real process and talk to a broker directly, for the CLI tests."""

from __future__ import annotations

import os
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.procs import tidemq_cmd
from tidemq.remoting import RemotingClient, RemotingCommand
from tidemq.remoting import fastjson

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Run:
    args: tuple[str, ...]
    rc: int
    out: str
    err: str

    def ok(self) -> "Run":
        assert self.rc == 0, f"tidemq {' '.join(self.args)} exited {self.rc}:\n{self.out}\n{self.err}"
        assert "Traceback" not in self.out + self.err, self.err
        return self

    def lines(self) -> list[str]:
        return self.out.splitlines()


def _env(env: dict[str, str | None] | None) -> dict[str, str]:
    out = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def tidemq(*args: str, input: bytes | None = None, env: dict[str, str | None] | None = None,
           timeout: float = 60.0) -> Run:
    """Run `tidemq ARGS...` from the repository root; never raises on a non-zero exit.
    ``env`` adds variables (None removes one)."""
    r = subprocess.run(
        tidemq_cmd(*args), input=input if input is not None else b"", capture_output=True,
        timeout=timeout, cwd=REPO, env=_env(env),
    )
    return Run(tuple(args), r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace"))


def tidemq_parallel(*arg_lists: Sequence[str], env: dict[str, str | None] | None = None,
                    timeout: float = 60.0) -> list[Run]:
    """Run several independent `tidemq` commands at once (stdin empty); results in order."""
    procs = [
        subprocess.Popen(tidemq_cmd(*args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=REPO, env=_env(env))
        for args in arg_lists
    ]
    runs = []
    try:
        for args, p in zip(arg_lists, procs):
            out, err = p.communicate(timeout=timeout)
            runs.append(Run(tuple(args), p.returncode, out.decode(errors="replace"), err.decode(errors="replace")))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return runs


def assert_clean_failure(r: Run, *fragments: str) -> str:
    """Non-zero exit, no traceback, nothing on stdout and exactly one `Error: ...` line on stderr
    that contains every fragment (case-insensitive). Returns that line."""
    assert r.rc != 0, f"tidemq {' '.join(r.args)} should have failed:\n{r.out}"
    assert "Traceback" not in r.out + r.err, r.err
    assert r.out == "", f"unexpected stdout: {r.out!r}"
    errors = [line for line in r.err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, f"expected one 'Error:' line on stderr, got:\n{r.err}"
    for frag in fragments:
        assert frag.lower() in errors[0].lower(), f"{frag!r} not in {errors[0]!r}"
    return errors[0]


async def broker_request(addr: str, code: int, fields: dict[str, object] | None = None,
                         body: bytes | None = None) -> RemotingCommand:
    """One raw remoting request/response (no TideMQ client logic in between)."""
    client = RemotingClient()
    try:
        return await client.invoke(addr, RemotingCommand.request(code, fields, body), timeout=5.0)
    finally:
        await client.close()


def json_body(cmd: RemotingCommand) -> dict:
    return fastjson.loads(cmd.body)


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


SEND_RESULT = re.compile(r"sendStatus=(\w+), msgId=(\w+), offsetMsgId=(\w+), queueId=(\d+), queueOffset=(\d+)")
