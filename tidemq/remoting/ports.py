"""Pick a free TCP port for a server that is started later (``--listen host:0`` in the CLI, test and
benchmark clusters).

Invariant: the port is outside the kernel's ephemeral range when the kernel says what that range is.
Binding to port 0 hands out a port from that range, and every outgoing connection on the machine
takes its local port from the same range, so between the pick and the server's own bind a client's
connection could take the port ("address already in use"). Ports below the range are never handed
out implicitly; one of them is free when a probe bind succeeds and no other caller in this process
was given it. Another process picking the same port at the same moment is still possible, but only
by a random draw among ~20,000 ports, not by the kernel's sequential allocation.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000  # below this live well-known services (and RocketMQ's 9876/10911)
_given: set[tuple[str, int]] = set()
_draw = random.SystemRandom()  # not the test's seeded `random`: two runs must not draw alike


def _candidate_range() -> tuple[int, int] | None:
    """The ports below (or above) the ephemeral range, or None when the range is unknown."""
    try:
        low, high = (int(x) for x in _RANGE_FILE.read_text().split()[:2])
    except (OSError, ValueError):
        return None
    if low - 1 - _LOWEST >= 1000:
        return _LOWEST, low - 1
    if 65535 - high >= 1000:
        return high + 1, 65535
    return None


def _bind_probe(host: str, port: int) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, port))
        bound: int = s.getsockname()[1]
        return bound


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, outside the ephemeral range where possible (see module doc)."""
    span = _candidate_range()
    if span is not None:
        for _ in range(200):
            port = _draw.randint(*span)
            if (host, port) in _given:
                continue
            try:
                _bind_probe(host, port)
            except OSError:
                continue
            _given.add((host, port))
            return port
    port = _bind_probe(host, 0)  # unknown range or a crowded machine: the kernel's pick
    _given.add((host, port))
    return port
