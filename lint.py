"""The static checks of `python3 dev.py lint` (and of `dev.py test`, which runs them first).

Each tool comes from the `test` extra and runs over the whole repository:

- ruff: the rules chosen in pyproject.toml's [tool.ruff.lint], on every Python file git knows;
- mypy: pyproject.toml's [tool.mypy] (strict where its overrides say so) on the packages as they
  are installed, plus the scripts of bench/, examples/ and spark/jobs/;
- lint-imports: the import-linter contracts of pyproject.toml (the layers of STYLE.md);
- shellcheck: every shell script (by extension or shebang; one with a shebang must be executable),
  every `run:` block of the GitHub workflows and the Dockerfile's shell-form RUN instructions;
- yamllint: every YAML file but Helm templates, with the repository's .yamllint.

mypy and import-linter find modules by folder, while our packages live in several top-level folders
(services/broker is installed as tidemq.broker, operator/tidemq_operator as tidemq.operator, ...)
and reach the `tidemq` namespace only through the installer. So both run on a tree of symlinks laid
out as installed (pyproject's [tool.setuptools] packages and package-dir), rebuilt on every run
under the venv; mypy's messages are turned back into repository paths.

Run with the venv's interpreter (dev.py does): `python lint.py [TOOL ...]` runs the named tools,
all by default. Exit status 0 when every tool passes, else 1 after a line per failing tool.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import yaml
from dockerfile_parse import DockerfileParser
from yamllint import linter
from yamllint.config import YamlLintConfig

ROOT = Path(__file__).resolve().parent
WORKFLOWS = ROOT / ".github" / "workflows"
YAMLLINT_CONFIG = ROOT / ".yamllint"
# The installed layout for mypy and import-linter; under the venv, which is never linted itself.
TREE = Path(sys.prefix) / "lint-tree"
MYPY_CACHE = Path(sys.prefix) / "mypy-cache"
# Scripts outside the packages that mypy checks too (each a program, not an importable module).
MYPY_SCRIPTS = ("bench", "examples", "spark/jobs", "dev.py", "lint.py")

# Folders never scanned (virtual environments, caches, build output, run artifacts).
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache", ".mypy_cache",
             ".import_linter_cache", "node_modules", "build", "dist", "tidemq-data", "tidemq-store",
             "e2e-artifacts"}
SHELLS = ("sh", "bash", "dash", "ksh")
# `${{ expression }}` in workflow run blocks: GitHub substitutes it before the shell sees the script.
GHA_EXPR = re.compile(r"\$\{\{.*?\}\}", re.S)


# ---- what the repository holds ---------------------------------------------------------------

def _skipped(rel: Path) -> bool:
    return any(p in SKIP_DIRS or p.startswith(".venv") or p.endswith(".egg-info") for p in rel.parts[:-1])


@cache
def repo_files() -> tuple[Path, ...]:
    """Every file of the repository (relative paths), as git sees it or, without git, walked."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
        rels = [Path(p) for p in out.decode().split("\0") if p]
    except (OSError, subprocess.SubprocessError):
        rels = []
        for dirpath, dirnames, filenames in os.walk(ROOT):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".venv")
                           and not d.endswith(".egg-info")]
            rels += [Path(dirpath, f).relative_to(ROOT) for f in filenames]
    return tuple(sorted(r for r in set(rels) if not _skipped(r) and (ROOT / r).is_file()))


def shebang(path: Path) -> str:
    try:
        with path.open("rb") as f:
            head = f.readline(200)
    except OSError:
        return ""
    return head.decode(errors="replace").strip() if head.startswith(b"#!") else ""


def is_shell_script(rel: Path) -> bool:
    if rel.suffix in (".sh", ".bash"):
        return True
    words = shebang(ROOT / rel)[2:].split()
    if not words:
        return False
    prog = Path(words[0]).name
    if prog == "env":
        prog = next((w for w in words[1:] if not w.startswith("-")), "")
    return prog in SHELLS


def shell_scripts() -> list[Path]:
    return [r for r in repo_files() if is_shell_script(r)]


def is_helm_template(rel: Path) -> bool:
    """Inside a chart's templates/ folder (Go templates, not YAML)."""
    for i, part in enumerate(rel.parts[:-1]):
        if part == "templates" and (ROOT.joinpath(*rel.parts[:i]) / "Chart.yaml").is_file():
            return True
    return False


def yaml_files() -> list[Path]:
    return [r for r in repo_files()
            if (r.suffix in (".yaml", ".yml") or r.name == ".yamllint") and not is_helm_template(r)]


def load_workflow(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a workflow is a mapping")
    if True in doc and "on" not in doc:  # YAML 1.1 reads the key `on` as the boolean true
        doc["on"] = doc.pop(True)
    return doc


@cache
def workflows() -> dict[str, dict]:
    """Workflow file name -> parsed workflow (files that do not parse are left to yamllint and the tests)."""
    out = {}
    for path in sorted(WORKFLOWS.glob("*.y*ml")) if WORKFLOWS.is_dir() else []:
        try:
            out[path.name] = load_workflow(path)
        except (yaml.YAMLError, ValueError):
            continue
    return out


def steps(workflow: dict) -> Iterator[tuple[str, dict, dict]]:
    """(job id, job, step) for every step of a workflow."""
    for job_id, job in (workflow.get("jobs") or {}).items():
        for step in job.get("steps") or []:
            yield job_id, job, step


def run_blocks() -> list[tuple[str, str, str]]:
    """(id, shell, script) for every `run:` step of every workflow."""
    out = []
    for name, wf in workflows().items():
        default_shell = ((wf.get("defaults") or {}).get("run") or {}).get("shell")
        for n, (job_id, job, step) in enumerate(steps(wf)):
            if "run" not in step:
                continue
            job_shell = ((job.get("defaults") or {}).get("run") or {}).get("shell")
            shell = step.get("shell") or job_shell or default_shell or "bash"
            label = step.get("name") or step["run"].splitlines()[0]
            out.append((f"{name}:{job_id}:{n}:{label[:40]}", shell, step["run"]))
    return out


def script_text(script: str) -> str:
    """A run block as the shell sees it, with each expression replaced by a plain word."""
    return GHA_EXPR.sub("GHA_EXPRESSION", script)


# ---- the installed layout --------------------------------------------------------------------

def package_dirs() -> dict[str, Path]:
    """Each package of pyproject's [tool.setuptools] -> the folder it is installed from."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    mapping = cfg.get("package-dir", {})
    out = {}
    for pkg in cfg["packages"]:
        base = max((k for k in mapping if k and (pkg == k or pkg.startswith(k + "."))), key=len, default="")
        rel = pkg[len(base):].lstrip(".").replace(".", "/")
        out[pkg] = ROOT / mapping.get(base, "") / rel
    return out


def top_level_modules() -> dict[str, Path]:
    """pyproject's py-modules -> their files (found in package-dir's "" folder)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    folder = ROOT / cfg.get("package-dir", {}).get("", "")
    return {name: folder / f"{name}.py" for name in cfg.get("py-modules", [])}


def installed_tree(dest: Path = TREE) -> Path:
    """Lay the packages out under `dest` as pip installs them, one symlink per module file, so
    that mypy and import-linter (which find modules by folder) see tidemq.broker and the rest."""
    shutil.rmtree(dest, ignore_errors=True)
    for pkg, src in package_dirs().items():
        folder = dest.joinpath(*pkg.split("."))
        folder.mkdir(parents=True, exist_ok=True)
        for f in sorted(src.glob("*.py")):
            (folder / f.name).symlink_to(f)
    for name, src in top_level_modules().items():
        (dest / f"{name}.py").symlink_to(src)
    return dest


# ---- the tools -------------------------------------------------------------------------------

def _tool(name: str) -> str:
    """A console tool of the `test` extra: beside this interpreter, else on PATH."""
    for folder in (Path(sysconfig.get_path("scripts")), Path(sys.executable).parent):
        if (folder / name).is_file():
            return str(folder / name)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"`{name}` is not installed: it comes with the test extra "
                                f"(`python3 dev.py lint` installs it, or pip install -e '.[test]')")
    return found


def _run(cmd: list[str], *, cwd: Path | None = None, input: str | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd or ROOT, input=input, capture_output=True, text=True, env=env, timeout=900)


def _shown(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stdout + proc.stderr).strip()


def ruff() -> list[str]:
    fmt = "github" if os.environ.get("GITHUB_ACTIONS") == "true" else "concise"
    proc = _run([sys.executable, "-m", "ruff", "check", "--no-cache", f"--output-format={fmt}", "."])
    return [] if proc.returncode == 0 else [_shown(proc)]


def _mypy_scripts() -> list[Path]:
    return [r for r in repo_files() if r.suffix == ".py" and any(
        r.is_relative_to(folder) for folder in MYPY_SCRIPTS)]


def _repository_path(tree: Path, line: str) -> str:
    """A mypy message with the tree's symlink turned back into the file's repository path."""
    head, sep, rest = line.partition(":")
    link = tree / head
    if sep and link.is_symlink():
        return f"{link.resolve().relative_to(ROOT)}{sep}{rest}"
    return line.removeprefix(f"{ROOT}{os.sep}")


def mypy() -> list[str]:
    tree = installed_tree()
    # One run: the packages as installed (paths in the tree), then the scripts (repository paths;
    # mypy puts each script's folder on its search path, the tree and the root come from MYPYPATH).
    targets = ["tidemq", *(f"{name}.py" for name in top_level_modules()), *(str(ROOT / r) for r in _mypy_scripts())]
    proc = _run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                 "--cache-dir", str(MYPY_CACHE), *targets],
                cwd=tree, env=dict(os.environ, MYPYPATH=os.pathsep.join((str(tree), str(ROOT)))))
    if proc.returncode == 0:
        return []
    return ["\n".join(_repository_path(tree, ln) for ln in _shown(proc).splitlines())]


def import_contracts(tree: Path | None = None) -> list[str]:
    """The import-linter contracts of pyproject.toml, over the installed layout (laid out in
    ``tree``, default .venv/lint-tree)."""
    tree = installed_tree() if tree is None else installed_tree(tree)
    proc = _run([_tool("lint-imports"), str(ROOT / "pyproject.toml"), "--no-cache"],
                cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)))
    return [] if proc.returncode == 0 else [_shown(proc)]


def shellcheck() -> list[str]:
    exe = _tool("shellcheck")
    problems = []
    scripts = shell_scripts()
    proc = _run([exe, "--color=never", "--external-sources", *map(str, scripts)])
    if proc.returncode != 0:
        problems.append(_shown(proc))
    problems += [f"{rel} has a shebang but is not executable (chmod +x)" for rel in scripts
                 if rel.suffix not in (".sh", ".bash") and not os.access(ROOT / rel, os.X_OK)]
    for label, shell, script in run_blocks():
        name = shell.split()[0]
        if name not in SHELLS:
            continue
        # GitHub runs `bash -e {0}` (`bash --noprofile --norc -eo pipefail {0}` for `shell: bash`)
        text = f"#!/usr/bin/env {name}\nset -e\n{script_text(script)}"
        proc = _run([exe, "--color=never", f"--shell={name}", "-"], input=text)
        if proc.returncode != 0:
            problems.append(f"the run block {label} (line 3 = its first line; ${{{{ }}}} expressions "
                            f"shown as GHA_EXPRESSION):\n{_shown(proc)}")
    # The Dockerfile's shell-form RUN commands run under the Debian base images' /bin/sh (dash).
    dockerfile = DockerfileParser(path=str(ROOT / "Dockerfile"))
    for ins in dockerfile.structure:
        if ins["instruction"] != "RUN" or ins["value"].startswith("["):
            continue
        cmd = re.sub(r"^(--\S+\s+)+", "", ins["value"])  # RUN --mount=... flags are not shell
        proc = _run([exe, "--color=never", "--shell=dash", "-"], input=cmd)
        if proc.returncode != 0:
            problems.append(f"Dockerfile line {ins['startline'] + 1}: {ins['value'][:80]}...\n{_shown(proc)}")
    return problems


def yamllint() -> list[str]:
    config = YamlLintConfig(file=str(YAMLLINT_CONFIG))
    problems = []
    for rel in yaml_files():
        if config.is_file_ignored(str(rel)):
            continue
        text = (ROOT / rel).read_text(encoding="utf-8")
        problems += [f"{rel}:{p.line}:{p.column}: [{p.level}] {p.message} ({p.rule})"
                     for p in linter.run(text, config, str(rel))]
    return problems


TOOLS: dict[str, tuple[Callable[[], list[str]], str]] = {
    "ruff": (ruff, "fix the code, or `ruff check --fix` for the fixable ones; rules: [tool.ruff.lint]"),
    "mypy": (mypy, "fix the types; options and per-package overrides: [tool.mypy] in pyproject.toml"),
    "imports": (import_contracts, "an import breaks a layer contract of pyproject.toml [tool.importlinter]"),
    "shellcheck": (shellcheck, "fix the scripts (each message links the shellcheck wiki page)"),
    "yamllint": (yamllint, "fix the YAML files; rules: .yamllint"),
}


def say(msg: str) -> None:
    print(f"[lint] {msg}", flush=True)  # noqa: T201 (the command's own report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tools", nargs="*", metavar="TOOL",
                        help=f"the tools to run ({', '.join(TOOLS)}); all by default")
    chosen = parser.parse_args(argv).tools or list(TOOLS)
    unknown = [t for t in chosen if t not in TOOLS]
    if unknown:
        parser.error(f"unknown tool {', '.join(unknown)}: choose from {', '.join(TOOLS)}")
    failed = []
    for name in chosen:
        check, advice = TOOLS[name]
        try:
            problems = check()
        except (OSError, subprocess.SubprocessError) as exc:
            problems = [f"could not run: {exc}"]
        if problems:
            failed.append(name)
            print("\n".join(problems), flush=True)  # noqa: T201 (the tool's own messages)
            say(f"{name}: FAILED ({advice})")
        else:
            say(f"{name}: ok")
    if failed:
        say(f"failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
