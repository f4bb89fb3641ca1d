"""Running external commands (docker, kind, kubectl, helm) and waiting for conditions, bounded.

Invariants:
- Every command runs with a timeout; a command that overruns is killed and raises
  :class:`CommandError` carrying the command line and the tail of what it printed.
- :func:`wait_for` never sleeps past its deadline and never loops without sleeping; on timeout
  it raises :class:`WaitTimeout` naming what was awaited and the last value or error seen, so a
  failing e2e run says what it was waiting for.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tidemq.remoting.ports import free_port  # noqa: F401 (re-exported for the e2e suite)

log = logging.getLogger(__name__)

T = TypeVar("T")
TAIL_CHARS = 4000


class E2EError(RuntimeError):
    """Something the e2e machinery needed did not happen (a command, a wait)."""


class CommandError(E2EError):
    def __init__(self, args: Sequence[str], returncode: int | None, stdout: str, stderr: str,
                 timeout: float | None = None) -> None:
        self.args_ = list(args)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        what = f"timed out after {timeout:.0f}s" if timeout is not None else f"exited {returncode}"
        super().__init__(f"`{shlex.join(self.args_)}` {what}\n"
                         f"--- stderr (tail) ---\n{tail(stderr)}\n--- stdout (tail) ---\n{tail(stdout)}")


class WaitTimeout(E2EError):
    pass


def tail(text: str | bytes | None, limit: int = TAIL_CHARS) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return text if len(text) <= limit else "..." + text[-limit:]


@dataclass(frozen=True, slots=True)
class Result:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def run(args: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
        check: bool = True, input: str | None = None, cwd: Path | None = None,
        log_file: Path | None = None) -> Result:
    """Run ``args`` (no shell) and capture its output; ``log_file`` also keeps the whole output."""
    full_env = dict(os.environ, **env) if env else None
    log.debug("$ %s", shlex.join(args))
    try:
        proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                              env=full_env, input=input, cwd=cwd, check=False)
    except subprocess.TimeoutExpired as exc:
        _write_log(log_file, args, tail(exc.stdout, 10**7), tail(exc.stderr, 10**7))
        raise CommandError(args, None, tail(exc.stdout), tail(exc.stderr), timeout) from None
    except FileNotFoundError:
        raise CommandError(args, 127, "", f"{args[0]}: command not found") from None
    _write_log(log_file, args, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise CommandError(args, proc.returncode, proc.stdout, proc.stderr)
    return Result(tuple(args), proc.returncode, proc.stdout, proc.stderr)


def _write_log(path: Path | None, args: Sequence[str], stdout: str, stderr: str) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(args)}\n{stdout}\n--- stderr ---\n{stderr}\n")


class NotYet(Exception):
    """Raised by a :func:`wait_for` predicate: not there yet, and why (shown on timeout)."""


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 2.0,
             clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds pass.

    A predicate says "not yet" by returning a falsy value or raising :class:`NotYet` (with the
    state it saw). An :class:`E2EError` it raises counts as "not yet" too (the API server may be
    briefly unreachable while pods restart). The last of these is in the timeout message.
    """
    deadline = clock() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
        except NotYet as exc:
            value, last = None, str(exc)
        except E2EError as exc:
            value, last = None, f"error: {str(exc).splitlines()[0]}"
        else:
            if value:
                return value
            last = value
        left = deadline - clock()
        if left <= 0:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last}")
        sleep(min(interval, left))


def stays(predicate: Callable[[], object], duration: float, what: str, interval: float = 2.0,
          clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> None:
    """Check for ``duration`` seconds that ``predicate`` keeps holding (a truthy return, no
    :class:`NotYet`); raise :class:`E2EError` the first time it does not."""
    deadline = clock() + duration
    while True:
        try:
            ok = predicate()
        except NotYet as exc:
            ok, why = False, str(exc)
        else:
            why = repr(ok)
        if not ok:
            raise E2EError(f"{what} stopped holding: {why}")
        left = deadline - clock()
        if left <= 0:
            return
        sleep(min(interval, left))


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
