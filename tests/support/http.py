"""Plain HTTP probes of our servers' health and metrics endpoints."""

from __future__ import annotations

import urllib.error
import urllib.request


def status(url: str) -> int:
    """The HTTP status ``url`` answers (an error status is an answer, not an exception)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
