"""Helpers shared by the request processors.

A processor refuses a request by raising the :class:`tidemq.errors.BrokerError` that
:func:`refused` builds; its handler turns it into a response with that code and remark.
"""

from __future__ import annotations

from tidemq.errors import BrokerError


def refused(code: int, remark: str) -> BrokerError:
    """The error that answers a request with ``code`` and ``remark``."""
    return BrokerError(remark, code, remark)
