"""Are docker (with a reachable engine), kind, kubectl and helm here? One line says what is missing."""

from __future__ import annotations

import shutil
from collections.abc import Callable

from e2e.proc import CommandError, run

INSTALL = {
    "docker": "https://docs.docker.com/engine/install/",
    "kind": "https://kind.sigs.k8s.io/docs/user/quick-start/#installation",
    "kubectl": "https://kubernetes.io/docs/tasks/tools/",
    "helm": "https://helm.sh/docs/intro/install/",
}
DOCKER_INFO_TIMEOUT = 30.0


def _docker_engine_problem() -> str | None:
    try:
        run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=DOCKER_INFO_TIMEOUT)
    except CommandError as exc:
        said = (exc.stderr or exc.stdout or "").strip().splitlines()
        first = said[0].strip() if said else f"exit status {exc.returncode}"
        return f"no Docker engine answers `docker info` ({first[:160]}): start Docker"
    return None


def missing_tools(which: Callable[[str], str | None] = shutil.which,
                  engine_problem: Callable[[], str | None] = _docker_engine_problem) -> str | None:
    """None when everything is there, else one line naming what is missing and where to get it."""
    absent = [name for name in INSTALL if which(name) is None]
    problems = [f"{name} (install: {INSTALL[name]})" for name in absent]
    if "docker" not in absent:
        engine = engine_problem()
        if engine:
            problems.insert(0, engine)
    if not problems:
        return None
    return "kind e2e suite needs docker, kind, kubectl and helm; missing: " + "; ".join(problems)
