"""The waiting helpers: the value they return, how often they look, what a timeout says."""

from __future__ import annotations

import itertools

import pytest

from tests.support.waiting import wait_until, wait_until_sync


async def test_wait_until_returns_the_first_truthy_value_of_a_plain_check() -> None:
    calls = itertools.count()
    assert await wait_until(lambda: next(calls) >= 3 and "ready", "three calls", interval=0) == "ready"
    assert next(calls) == 4


async def test_wait_until_awaits_a_coroutine_check() -> None:
    seen: list[int] = []

    async def check() -> list[int]:
        seen.append(len(seen))
        return seen if len(seen) == 2 else []

    assert await wait_until(check, "two looks", interval=0) == [0, 1]


async def test_wait_until_names_what_it_waited_for_and_the_last_value_on_timeout() -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for the broker to register "
                                              r"\(last value: \[\]\)"):
        await wait_until(list, "the broker to register", timeout=0.05, interval=0.01)


async def test_wait_until_looks_once_even_with_no_time_left() -> None:
    calls: list[None] = []
    with pytest.raises(AssertionError, match="waiting for nothing"):
        await wait_until(lambda: calls.append(None), "nothing", timeout=0)
    assert len(calls) == 1


def test_wait_until_sync_polls_a_plain_check_and_says_what_timed_out() -> None:
    calls = itertools.count()
    assert wait_until_sync(lambda: next(calls) == 2, "the third call", interval=0) is True
    with pytest.raises(AssertionError, match=r"after 0 s waiting for a non-zero count \(last value: 0\)"):
        wait_until_sync(lambda: 0, "a non-zero count", timeout=0)
