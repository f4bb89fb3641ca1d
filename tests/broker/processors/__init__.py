"""Adapter tests run handlers as the broker does: through a hook-less Dispatcher, which turns a
service's refusal (BrokerError) into the answer with its code and remark."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tidemq.broker.hooks import Dispatcher


class _AnyCode(Mapping[int, Any]):
    """Every request code to one handler (tests call handlers with placeholder codes)."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler

    def __getitem__(self, code: int) -> Any:
        return self.handler

    def __iter__(self) -> Iterator[int]:
        return iter(())

    def __len__(self) -> int:
        return 0


def dispatched(handler: Any) -> Any:
    """``handler`` as the broker runs it, whatever the request's code."""
    return Dispatcher(_AnyCode(handler), ()).handle


class Dispatched:
    """An adapter whose handler methods run through :func:`dispatched`."""

    def __init__(self, proc: Any) -> None:
        self._proc = proc

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._proc, name)
        if name == "handlers":
            return lambda: {code: dispatched(h) for code, h in attr().items()}
        return dispatched(attr) if callable(attr) else attr


def assert_bad_request(resp: Any, problem: str) -> None:
    """A header or body the adapter cannot decode: the dispatcher's SYSTEM_ERROR naming it."""
    assert resp.code == 1 and resp.remark.startswith("bad request (code ") and problem in resp.remark, resp
