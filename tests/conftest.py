"""Shared fixtures: real TideMQ processes on loopback (see tests/procs.py).

An ``async def`` test runs on a fresh event loop of its own (pytest-asyncio in auto mode, configured
in pyproject.toml); a tighter bound than pytest-timeout's default is ``pytest.mark.timeout(N)``.
Tests wait with tests/support/waiting.py and make topics with tests/support/topics.py.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from tests.procs import Cluster

# Property tests judge results, not speed: no per-example deadline (a loaded CI runner would turn a
# slow example into DeadlineExceeded/Flaky); a failure prints the blob that reproduces it.
settings.register_profile("tidemq", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile("tidemq")


def _start(tmp_path_factory: pytest.TempPathFactory, **kw) -> Cluster:
    c = Cluster(tmp_path_factory.mktemp("cluster"), **kw)
    try:
        c.start()
    except Exception:  # noqa: BLE001 (whatever failed, stop what started, then say why with the log)
        c.stop()
        raise RuntimeError(f"cluster did not start:\n{c.namesrv.log()[-3000:]}\n{c.broker.log()[-3000:]}")
    return c


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A name server + broker shared by the tests of one module (use unique topic names)."""
    c = _start(tmp_path_factory)
    yield c
    c.stop()


@pytest.fixture
def cluster_factory(tmp_path_factory):
    """Start clusters with custom settings (flush mode, expiry ...); all are stopped at the end."""
    started: list[Cluster] = []

    def make(**kw) -> Cluster:
        c = _start(tmp_path_factory, **kw)
        started.append(c)
        return c

    yield make
    for c in started:
        c.stop()
