"""Creation bounds (tidemq.broker.quota) and RocketMQ's group-name rules (tidemq.broker.topics),
as pure functions with an injected clock."""

from __future__ import annotations

import pytest

from tidemq.broker import quota as quota_mod
from tidemq.broker.quota import CreationLimits, CreationQuota
from tidemq.broker.topics import loggable, validate_group_name


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_principal_gets_its_window_budget_then_a_refusal_until_the_window_passes():
    clock = Clock()
    q = CreationQuota(CreationLimits(max_topics=100, max_groups=100, implicit_per_window=3, window=60), clock)
    assert [q.admit("ak", "group", 0) for _ in range(3)] == [None, None, None]
    refusal = q.admit("ak", "topic", 0)
    assert refusal is not None and "implicitCreateLimit" in refusal
    assert q.admit("other", "topic", 0) is None  # budgets are per principal
    clock.now += 59
    assert q.admit("ak", "group", 0) is not None
    clock.now += 1
    assert q.admit("ak", "group", 0) is None
    assert q.created == {"topic": 1, "group": 4} and q.refused == {"total": 0, "rate": 2}


def test_totals_refuse_explicit_and_implicit_creation():
    q = CreationQuota(CreationLimits(max_topics=5, max_groups=2), Clock())
    assert q.check_total("topic", 4) is None
    full = q.check_total("topic", 5)
    assert full is not None and "maxTopicCount" in full and "5" in full
    assert q.admit("ak", "group", 2) is not None and "maxSubscriptionGroupCount" in q.admit("ak", "group", 9)
    assert q.created == {"topic": 0, "group": 0}


def test_zero_means_no_implicit_creation():
    q = CreationQuota(CreationLimits(implicit_per_window=0), Clock())
    assert q.admit("ak", "group", 0) is not None


def test_the_window_table_stays_bounded(monkeypatch):
    monkeypatch.setattr(quota_mod, "MAX_PRINCIPALS", 10)
    clock = Clock()
    q = CreationQuota(CreationLimits(implicit_per_window=5, window=60), clock)
    for i in range(100):
        clock.now += 0.001
        assert q.admit(f"host {i}", "group", 0) is None
    assert len(q._windows) <= 10


@pytest.mark.parametrize("name,problem", [
    ("", "blank"), ("  ", "blank"), ("x" * 256, "longer than group max length 255"),
    ("a b", "illegal characters"), ("a\nb", "illegal characters"), ("dot.ted", "illegal characters"),
    ("é", "illegal characters"), ("%RETRY%g", "starts with %RETRY%"), ("%DLQ%g", "starts with %RETRY% or %DLQ%"),
])
def test_group_names_outside_rocketmqs_rules_are_refused(name, problem):
    found = validate_group_name(name)
    assert found is not None and problem in found
    assert len(found) < 300 and "\n" not in found


@pytest.mark.parametrize("name", ["g", "CID_app-1", "a|b%c", "x" * 255, "please_rename_unique_group_name"])
def test_valid_group_names_pass(name):
    assert validate_group_name(name) is None


def test_loggable_escapes_control_characters_and_cuts_long_names():
    assert loggable("plain-name") == "plain-name"
    assert "\n" not in loggable("a\nFORGED line") and "\\n" in loggable("a\nFORGED line")
    assert len(loggable("x" * 100_000)) < 120
