"""Run the fuzz targets of tests/fuzz/targets.py (research matrix row H1).

    python tests/fuzz/run.py --minutes 10            # every target, 10 minutes each, one at a time
    python tests/fuzz/run.py --seconds 3 -t frame    # one target, a short run
    python tests/fuzz/run.py --write-seeds           # (re)write the seed corpus from our encoders

With atheris (libFuzzer, coverage-guided; tidemq's pure-Python modules are instrumented) each
target runs in its own process with ``-rss_limit_mb=512 -timeout=2 -max_len=65536``; the seed
corpus tests/fuzz/corpus/<target>/ is read, new inputs go to a scratch corpus under --work, and a
crash is written to tests/fuzz/corpus/<target>/crash-<sha1> so tests/fuzz/test_fuzz.py replays it
forever. Without atheris, hypothesis feeds random and mutated-seed bytes for the same time.
Exit status: 0 when every target ran clean, 1 otherwise. A summary line per target is printed.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPUS = HERE / "corpus"

# LATE IMPORTS: tests.fuzz.targets (and with it tidemq) is imported inside the functions that use
# it: `tests` is importable only once __main__ has put the root on sys.path, and the --child must
# import tidemq for the first time under atheris instrumentation, or its coverage goes unseen.


def have_atheris() -> bool:
    try:
        import atheris  # noqa: F401, PLC0415 (optional: the probe for it)
    except ImportError:
        return False
    return True


def write_seeds() -> None:
    from tests.fuzz.targets import seeds  # noqa: PLC0415 (see LATE IMPORTS above)

    for name, items in seeds().items():
        d = CORPUS / name
        d.mkdir(parents=True, exist_ok=True)
        for data in items:
            (d / f"seed-{hashlib.sha1(data).hexdigest()[:12]}").write_bytes(data)


def child(name: str, seconds: float, work: Path) -> None:
    """In the child process: fuzz one target with atheris until ``seconds`` pass."""
    import atheris  # noqa: PLC0415 (optional: only the --child of an atheris run needs it)

    with atheris.instrument_imports(include=["tidemq"]):
        from tests.fuzz.targets import TARGETS  # noqa: PLC0415 (see LATE IMPORTS above)

    target = TARGETS[name]
    scratch = work / name
    scratch.mkdir(parents=True, exist_ok=True)
    seeds = CORPUS / name
    seeds.mkdir(parents=True, exist_ok=True)
    argv = [sys.argv[0], str(scratch), str(seeds), f"-max_total_time={max(1, int(seconds))}",
            "-rss_limit_mb=512", "-timeout=10", "-max_len=65536", "-print_final_stats=1",
            f"-artifact_prefix={seeds}/"]
    atheris.Setup(argv, target)
    atheris.Fuzz()


def run_atheris(name: str, seconds: float, work: Path, log_dir: Path) -> tuple[bool, str]:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    # no PYTHONPATH: the repository root holds a folder named "operator" that would shadow the
    # standard library at interpreter start-up; the child adds the root to sys.path itself.
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.run([sys.executable, str(Path(__file__)), "--child", name, "--seconds", str(seconds),
                               "--work", str(work)], stdout=out, stderr=subprocess.STDOUT,
                              timeout=seconds + 120)
    text = log.read_text(errors="replace")
    runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", text)
    rss = re.findall(r"stat::peak_rss_mb:\s*(\d+)", text)
    crashes = [p.name for p in (CORPUS / name).glob("crash-*")]
    ok = proc.returncode == 0
    summary = (f"{name}: {'ok' if ok else 'FAILED (exit %d)' % proc.returncode}, "
               f"{runs[-1] if runs else '?'} runs in {time.monotonic() - started:.0f} s, peak RSS "
               f"{rss[-1] if rss else '?'} MiB, crash files {len(crashes)}; log {log}")
    return ok, summary


def run_hypothesis(name: str, seconds: float) -> tuple[bool, str]:
    from tests.fuzz.targets import TARGETS, seeds  # noqa: PLC0415 (see LATE IMPORTS above)

    rnd = random.Random(0)
    pool = seeds()[name]
    target = TARGETS[name]
    deadline = time.monotonic() + seconds
    runs = 0
    while time.monotonic() < deadline:
        if pool and rnd.random() < 0.7:
            data = bytearray(rnd.choice(pool))
            for _ in range(rnd.randint(1, 8)):
                op = rnd.random()
                i = rnd.randrange(len(data) + 1)
                if op < 0.4 and data:
                    data[min(i, len(data) - 1)] = rnd.randrange(256)
                elif op < 0.7:
                    data[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
                else:
                    del data[i:i + rnd.randint(1, 8)]
            data = bytes(data)
        else:
            data = bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 512)))
        try:
            target(data)
        except Exception:  # noqa: BLE001 (any escape from a target is a finding: saved, reported)
            crash = CORPUS / name / f"crash-{hashlib.sha1(data).hexdigest()}"
            crash.write_bytes(data)
            return False, f"{name}: FAILED after {runs} runs; input saved to {crash}"
        runs += 1
    return True, f"{name}: ok, {runs} runs in {seconds:.0f} s (random/mutation fallback, no atheris)"


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":  # before tidemq is imported uninstrumented
        ap = argparse.ArgumentParser()
        ap.add_argument("--child")
        ap.add_argument("--seconds", type=float)
        ap.add_argument("--work", type=Path)
        a = ap.parse_args()
        child(a.child, a.seconds, a.work)
        return 0
    from tests.fuzz.targets import TARGETS  # noqa: PLC0415 (see LATE IMPORTS above)

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, help="time per target in minutes")
    ap.add_argument("--seconds", type=float, help="time per target in seconds (default 10)")
    ap.add_argument("-t", "--target", action="append", choices=sorted(TARGETS), help="target(s) to run (default: all)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/tidemq-fuzz"), help="scratch corpus directory")
    ap.add_argument("--engine", choices=["auto", "atheris", "fallback"], default="auto")
    ap.add_argument("--write-seeds", action="store_true", help="write the seed corpus and exit")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    seconds = args.minutes * 60 if args.minutes is not None else (args.seconds if args.seconds is not None else 10.0)
    if args.child:
        child(args.child, seconds, args.work)
        return 0
    if args.write_seeds:
        write_seeds()
        return 0
    use_atheris = args.engine == "atheris" or (args.engine == "auto" and have_atheris())
    if args.engine == "atheris" and not have_atheris():
        print("atheris is not installed (pip install atheris)", file=sys.stderr)
        return 2
    all_ok = True
    for name in args.target or sorted(TARGETS):
        if use_atheris:
            ok, summary = run_atheris(name, seconds, args.work, args.work / "logs")
        else:
            ok, summary = run_hypothesis(name, seconds)
        all_ok &= ok
        print(summary, flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
