"""Fuzzing in the default suite (research matrix rows H1/H2): replay tests/fuzz/corpus/ (seeds and
every crash ever found), hypothesis over random and mutated bytes for each target, and a short
atheris run of every target through tests/fuzz/run.py (the long run: `--minutes 10`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.targets import TARGETS, seeds

CORPUS = Path(__file__).parent / "corpus"
SEEDS = seeds()


def _corpus_files() -> list[tuple[str, Path]]:
    return [(d.name, f) for d in sorted(CORPUS.iterdir()) if d.is_dir() for f in sorted(d.iterdir())]


@pytest.mark.parametrize("target,path", _corpus_files(), ids=lambda v: v.name if isinstance(v, Path) else v)
def test_corpus_replays_clean(target, path):
    TARGETS[target](path.read_bytes())


def test_every_target_has_seeds_in_the_corpus():
    for name in TARGETS:
        assert any((CORPUS / name).glob("seed-*")), f"no seed for {name}: run tests/fuzz/run.py --write-seeds"


@st.composite
def _mutated(draw, name: str):
    data = bytearray(draw(st.sampled_from(SEEDS[name])))
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["set", "insert", "delete"]))
        if op == "set" and data:
            data[min(i, len(data) - 1)] = draw(st.integers(0, 255))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[i:i + draw(st.integers(1, 8))]
    return bytes(data)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_random_and_mutated_bytes_raise_only_codec_errors(name):
    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.one_of(st.binary(max_size=2048), _mutated(name)))
    def run(data):
        TARGETS[name](data)

    run()


# ~40 s (an atheris process per target); the corpus replay above runs in the default suite.
@pytest.mark.slow
def test_short_atheris_run_of_every_target(tmp_path):
    pytest.importorskip("atheris", reason="atheris is not installed (pip install atheris; Linux x86_64 wheels)")
    run = Path(__file__).parent / "run.py"
    proc = subprocess.run([sys.executable, str(run), "--seconds", "1", "--work", str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.count(": ok,") == len(TARGETS)
