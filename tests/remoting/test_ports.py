"""free_port: servers started later get a port that outgoing connections cannot take meanwhile."""

from __future__ import annotations

import socket

import pytest

from tidemq.remoting import ports


def _ephemeral() -> tuple[int, int]:
    low, high = ports._RANGE_FILE.read_text().split()[:2]
    return int(low), int(high)


@pytest.mark.skipif(not ports._RANGE_FILE.exists(), reason="no /proc ephemeral port range on this OS")
def test_ports_lie_outside_the_ephemeral_range_and_are_never_handed_out_twice():
    low, high = _ephemeral()
    picked = [ports.free_port() for _ in range(300)]
    assert len(set(picked)) == len(picked)
    assert all(not (low <= p <= high) for p in picked), (low, high, picked)
    for p in picked[:20]:  # free: a server can bind it
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_taken_port_is_skipped(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        with socket.socket() as spare:  # a port known free for the third draw
            spare.bind(("127.0.0.1", 0))
            free = spare.getsockname()[1]
        draws = iter([taken, taken, free])
        monkeypatch.setattr(ports, "_candidate_range", lambda: (1024, 65535))
        monkeypatch.setattr(ports._draw, "randint", lambda a, b: next(draws))
        assert ports.free_port() == free


def test_unknown_range_falls_back_to_the_kernels_pick(monkeypatch, tmp_path):
    monkeypatch.setattr(ports, "_RANGE_FILE", tmp_path / "missing")
    p = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))


@pytest.mark.parametrize(("text", "expected"), [
    ("32768\t60999\n", (10_000, 32767)),
    ("1024\t60000\n", (60001, 65535)),
    ("1024\t65000\n", None),
    ("garbage\n", None),
])
def test_candidate_range(monkeypatch, tmp_path, text, expected):
    f = tmp_path / "range"
    f.write_text(text)
    monkeypatch.setattr(ports, "_RANGE_FILE", f)
    assert ports._candidate_range() == expected
