"""A ConsumerGroup's lag in `kubectl get tmqg` follows what its consumers have committed."""

from __future__ import annotations

import pytest

from e2e import resources
from e2e.install import Deployed
from e2e.jobs import LoadJobs
from e2e.k8s import Kube
from e2e.proc import NotYet, wait_for
from e2e.scenario import apply_group, apply_topic, brief

pytestmark = pytest.mark.e2e

SENT = 1000
FIRST = 300
LAG_TIMEOUT = 120.0  # operator timerInterval is 5 s in values-e2e.yaml


def _lag_column(kube: Kube, group: str, want: int) -> dict[str, str]:
    """`kubectl get tmqg GROUP` once its Lag column shows ``want`` (status.totalLag agreeing)."""
    def shown() -> dict[str, str]:
        row = kube.table("tmqg", group)[0]
        total = (kube.get(resources.GROUPS, group).get("status") or {}).get("totalLag")
        if row.get("LAG") != str(want) or total != want:
            raise NotYet(f"LAG column {row.get('LAG')!r}, status.totalLag {total!r}")
        return row

    return wait_for(shown, LAG_TIMEOUT, f"kubectl get tmqg {group} to show lag {want}", interval=3.0)


def test_consumer_group_lag_shows_in_kubectl_get(kube: Kube, tidemq: Deployed, load: LoadJobs,
                                                 run_id: str) -> None:
    topic, group = f"e2e-lag-{run_id}", f"e2e-lag-{run_id}"
    apply_topic(kube, tidemq, topic, queues=4)
    apply_group(kube, tidemq, group)
    sent = load.produce(topic, run_id, SENT)
    assert sent["acked_count"] == SENT, brief(sent)

    first = load.consume(topic, run_id, group, "--max-messages", str(FIRST))
    assert first["received"] == FIRST, brief(first)
    row = _lag_column(kube, group, SENT - FIRST)
    assert row["READY"] == "True" and row["GROUP"] == group, row
    lag = {e["topic"]: e["lag"] for e in kube.get(resources.GROUPS, group)["status"]["lag"]}
    assert lag == {topic: SENT - FIRST}

    rest = load.consume(topic, run_id, group, "--expect", str(SENT - FIRST))
    assert rest["distinct"] == SENT - FIRST, brief(rest)
    _lag_column(kube, group, 0)
