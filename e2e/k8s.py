"""kubectl and helm against the e2e cluster: JSON in and out, every call bounded.

Invariants:
- Every call uses the kubeconfig file of the kind cluster (``KUBECONFIG``), never the user's
  current context, so switching contexts during a run changes nothing.
- Objects go in as JSON on stdin (``kubectl apply -f -``); answers come back parsed from ``-o json``.
- :func:`port_forward` owns its ``kubectl port-forward`` process: it is terminated (then killed)
  when the block exits, whatever happens inside.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.proc import CommandError, NotYet, Result, free_port, port_open, run, wait_for

log = logging.getLogger(__name__)

KUBECTL_TIMEOUT = 60.0
PORT_FORWARD_READY = 30.0


@dataclass(frozen=True, slots=True)
class Kube:
    """kubectl/helm bound to one kubeconfig and a default namespace."""

    kubeconfig: Path
    namespace: str

    @property
    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, timeout: float = KUBECTL_TIMEOUT, check: bool = True,
                input: str | None = None, namespace: str | None = None) -> Result:
        ns = ["--namespace", namespace or self.namespace]
        return run(["kubectl", *ns, *args], timeout=timeout, env=self.env, check=check, input=input)

    def helm(self, *args: str, timeout: float, log_file: Path | None = None) -> Result:
        return run(["helm", *args], timeout=timeout, env=self.env, log_file=log_file)

    # reading ------------------------------------------------------------------------------------
    def get(self, kind: str, name: str | None = None, *, selector: str | None = None,
            namespace: str | None = None, timeout: float = KUBECTL_TIMEOUT) -> dict[str, Any]:
        args = ["get", kind] + ([name] if name else []) + (["-l", selector] if selector else [])
        return json.loads(self.kubectl(*args, "-o", "json", namespace=namespace,
                                       timeout=timeout).stdout)

    def get_or_none(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self.get(kind, name, namespace=namespace)
        except CommandError as exc:
            if "NotFound" in exc.stderr or "not found" in exc.stderr:
                return None
            raise

    def items(self, kind: str, selector: str | None = None,
              namespace: str | None = None) -> list[dict[str, Any]]:
        return list(self.get(kind, selector=selector, namespace=namespace).get("items") or [])

    def table(self, kind: str, name: str | None = None) -> list[dict[str, str]]:
        """``kubectl get KIND [NAME]`` as printed (printer columns), one dict per row."""
        args = ["get", kind] + ([name] if name else [])
        return parse_table(self.kubectl(*args).stdout)

    def raw(self, path: str, timeout: float = KUBECTL_TIMEOUT) -> str:
        """``kubectl get --raw PATH`` (e.g. the API server's proxy to a pod's HTTP port)."""
        return run(["kubectl", "get", "--raw", path], timeout=timeout, env=self.env).stdout

    def logs(self, pod: str, container: str | None = None, previous: bool = False,
             tail_lines: int | None = None, namespace: str | None = None,
             timeout: float = KUBECTL_TIMEOUT) -> str:
        args = ["logs", pod] + (["-c", container] if container else [])
        args += (["--previous"] if previous else []) + ([f"--tail={tail_lines}"] if tail_lines else [])
        return self.kubectl(*args, namespace=namespace, timeout=timeout).stdout

    def exec(self, pod: str, command: Sequence[str], container: str | None = None,
             timeout: float = KUBECTL_TIMEOUT) -> str:
        args = ["exec", pod] + (["-c", container] if container else []) + ["--", *command]
        return self.kubectl(*args, timeout=timeout).stdout

    # writing ------------------------------------------------------------------------------------
    def apply(self, *objects: Mapping[str, Any], timeout: float = KUBECTL_TIMEOUT) -> None:
        doc = {"apiVersion": "v1", "kind": "List", "items": [dict(o) for o in objects]}
        self.kubectl("apply", "-f", "-", input=json.dumps(doc), timeout=timeout)

    def create(self, *objects: Mapping[str, Any], timeout: float = KUBECTL_TIMEOUT) -> None:
        doc = {"apiVersion": "v1", "kind": "List", "items": [dict(o) for o in objects]}
        self.kubectl("create", "-f", "-", input=json.dumps(doc), timeout=timeout)

    def patch(self, kind: str, name: str, patch: Mapping[str, Any], kind_of_patch: str = "merge",
              timeout: float = KUBECTL_TIMEOUT) -> None:
        self.kubectl("patch", kind, name, "--type", kind_of_patch, "-p", json.dumps(patch),
                     timeout=timeout)

    def delete(self, kind: str, name: str, wait: bool = False, timeout: float = KUBECTL_TIMEOUT,
               namespace: str | None = None) -> None:
        self.kubectl("delete", kind, name, "--ignore-not-found", f"--wait={str(wait).lower()}",
                     timeout=timeout, namespace=namespace)


# -- pure helpers ---------------------------------------------------------------------------------

def parse_table(text: str) -> list[dict[str, str]]:
    """Rows of kubectl's column output, cut at the header's column starts (values may be empty).

    kubectl pads columns with at least three spaces, so a single space belongs to a header
    (``NAME SERVERS``); cells are cut at the same offsets as their header.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    header = lines[0]
    found = list(re.finditer(r"\S+(?: \S+)*", header))
    starts = [m.start() for m in found]
    names = [m.group(0) for m in found]
    ends: list[int | None] = [*starts[1:], None]
    rows = []
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, ends, strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows


def condition(obj: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    """The status condition of type ``ctype`` (None when absent)."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return cond
    return None


def condition_is(obj: Mapping[str, Any], ctype: str, status: str = "True") -> bool:
    cond = condition(obj, ctype)
    return cond is not None and cond.get("status") == status


def conditions_text(obj: Mapping[str, Any]) -> str:
    conds = (obj.get("status") or {}).get("conditions") or []
    return ", ".join(f"{c.get('type')}={c.get('status')} ({c.get('reason')}: {c.get('message', '')[:120]})"
                     for c in conds) or "no conditions"


def pod_ready(pod: Mapping[str, Any]) -> bool:
    return (not (pod.get("metadata") or {}).get("deletionTimestamp")
            and condition_is(pod, "Ready"))


# -- port-forward ---------------------------------------------------------------------------------

class PortForwardError(RuntimeError):
    """The port-forward process exited."""


@contextmanager
def port_forward(kube: Kube, target: str, remote_port: int,
                 ready_timeout: float = PORT_FORWARD_READY) -> Iterator[int]:
    """``kubectl port-forward TARGET LOCAL:REMOTE`` on 127.0.0.1; yields the local port.

    ``target`` is ``svc/NAME``, ``pod/NAME`` ... Note that brokers advertise their pod DNS
    names, so only name-server-only calls (cluster info, routes) work through a forwarded name
    server; producers and consumers must run in the cluster.
    """
    local = free_port()
    args = ["kubectl", "--namespace", kube.namespace, "port-forward", "--address", "127.0.0.1",
            target, f"{local}:{remote_port}"]
    log.info("$ %s", " ".join(args))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **kube.env})
    try:
        def up() -> bool:
            if proc.poll() is not None:  # not an E2EError: wait_for must not retry a dead process
                raise PortForwardError(
                    f"kubectl port-forward {target} exited {proc.returncode}: "
                    f"{(proc.stderr.read() if proc.stderr else '')[-2000:]}")
            if not port_open(local):
                raise NotYet(f"127.0.0.1:{local} not accepting connections yet")
            return True

        wait_for(up, ready_timeout, f"port-forward to {target}:{remote_port}", interval=0.5)
        yield local
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
