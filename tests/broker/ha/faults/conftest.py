"""Fixtures of the fault-injection suite (issue 17): ``fault_group`` makes started
:class:`~tests.broker.ha.faults.group.ReplicaGroup` s on the module's etcd (tests/broker/ha/
conftest.py), each under its own broker name, and ends every process of them after the test,
failed or not."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.broker.ha.conftest import Etcd
from tests.broker.ha.faults.group import ReplicaGroup


@pytest.fixture
def fault_group(etcd: Etcd, tmp_path: Path) -> Iterator[Callable[..., ReplicaGroup]]:
    groups: list[ReplicaGroup] = []

    def make(**kw: object) -> ReplicaGroup:
        name = f"fg-{uuid.uuid4().hex[:6]}"
        group = ReplicaGroup(tmp_path / name, etcd.endpoint, name, **kw)  # type: ignore[arg-type]
        groups.append(group)
        return group.start()

    yield make
    for group in groups:
        group.close()
