"""The verdicts of the fault-injection suite (issue 17), pure functions over what the producers
recorded, what a consumer read and what the replicas logged.

- every acknowledged (SEND_OK) body is consumed at least once (duplicates are allowed: a retry
  after a lost answer sends the same body again);
- nothing is consumed that no producer tried to send;
- at most one replica became master of any epoch.
"""

from __future__ import annotations

from collections.abc import Iterable

from tests.broker.ha.faults.load import Attempt


def lost(attempts: Iterable[Attempt], consumed: Iterable[str]) -> list[str]:
    """Acknowledged bodies nobody consumed, in send order."""
    seen = set(consumed)
    return [a.body for a in attempts if a.acked and a.body not in seen]


def unknown(attempts: Iterable[Attempt], consumed: Iterable[str]) -> list[str]:
    """Consumed bodies no producer tried to send."""
    sent = {a.body for a in attempts}
    return sorted({b for b in consumed if b not in sent})


def shared_epochs(masters_by_epoch: dict[int, set[int]]) -> dict[int, set[int]]:
    """Epochs that more than one replica claimed as master."""
    return {epoch: rids for epoch, rids in masters_by_epoch.items() if len(rids) > 1}


def verdict(attempts: list[Attempt], consumed: list[str], masters_by_epoch: dict[int, set[int]]) -> list[str]:
    """Every check's failure as a sentence (empty when all hold)."""
    problems = []
    if missing := lost(attempts, consumed):
        problems.append(f"{len(missing)} acknowledged message(s) lost, e.g. {missing[:10]}")
    if extra := unknown(attempts, consumed):
        problems.append(f"{len(extra)} consumed message(s) never sent, e.g. {extra[:10]}")
    if shared := shared_epochs(masters_by_epoch):
        problems.append(f"more than one master in an epoch: {shared}")
    if not any(a.acked for a in attempts):
        problems.append("no send was acknowledged at all: the run proves nothing")
    return problems
