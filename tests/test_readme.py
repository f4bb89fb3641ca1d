"""README.md runs as written (issue 15): every command block and snippet, and the examples/ it runs.

The README's fenced code blocks are read in order (tests/support/readme.py). A block without a
marker runs; a block that cannot run here follows

    <!-- readme-test: skip (REASON) -->

and is checked for syntax only; a block marked ``<!-- readme-test: file PATH -->`` must equal that
file. Every block, run or not, is checked for syntax:

- shell: ``bash -n``; then each simple command: ``tidemq ...`` is parsed by the CLI's own click
  parser (unknown commands and options, bad values and missing required options fail; a file that
  does not exist on this machine does not), ``kubectl``/``helm`` lines must name known subcommands,
  resources our CRDs or Kubernetes define, files that exist in the repository and chart values that
  exist in values.yaml, ``python3 dev.py X`` a command of dev.py, ``bash FILE`` an existing script,
  and any other program must be a known one (so an unquoted ``a:9876;b:9876`` shows up as a
  command named ``b:9876``);
- Python: compiled; YAML: parsed, and a ``plain_acl.yml`` (a mapping with ``accounts``) must load
  with the broker's ACL parser.

Runnable blocks run top to bottom, as a reader runs them, against one ``tidemq local`` started on
free ports for this module (later blocks may use what earlier ones created, e.g. the topic
``orders``). The address substitution is textual and documented in the README: before a block runs,
``127.0.0.1:9876`` (name server), ``127.0.0.1:10911`` (broker) and ``127.0.0.1:9877`` (metrics)
become this test's addresses. The environment adds ``NAMESRV_ADDR`` (the name server; examples/
scripts read it), ``EXAMPLE_NAMESRV_PORT``/``EXAMPLE_BROKER_PORT`` (fresh free ports, for examples
that start servers of their own) and the venv's bin folder first on PATH (``tidemq``, ``python``),
and drops any ``TIDEMQ_*`` variable of the caller. Shell blocks run with ``bash -euo pipefail``,
Python blocks with this interpreter, both from the repository root; a non-zero exit fails the test
with the block's output. Every examples/ script must be run by some runnable block.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import click
import pytest
import yaml

from tidemq.broker.acl import parse_acl_config
from tidemq.cli.main import cli
from tidemq.errors import ConfigError

from tests.procs import ServerProcess, free_port, tidemq_cmd
from tests.support.readme import (
    Block,
    ReadmeError,
    block_ids,
    blocks,
    indented_code_lines,
    shell_commands,
    substitute,
)

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
EXAMPLES = ROOT / "examples"
CHART_VALUES = ROOT / "charts" / "tidemq" / "values.yaml"
RUN_TIMEOUT = 240  # seconds per block (the Spark snippet starts a JVM)

try:
    BLOCKS = blocks(README.read_text())
    PARSE_ERROR = None
except ReadmeError as exc:
    BLOCKS, PARSE_ERROR = [], str(exc)
RUNNABLE = [b for b in BLOCKS if b.runs]

# Programs a README shell block may call without a deeper check.
PLAIN_PROGRAMS = {"cat", "cd", "curl", "echo", "export", "grep", "openssl", "pip", "sed", "sleep", "true"}
KUBECTL_SUBCOMMANDS = {"annotate", "apply", "config", "create", "delete", "describe", "edit", "exec",
                       "get", "label", "logs", "patch", "port-forward", "rollout", "scale", "wait"}
KUBECTL_RESOURCE_VERBS = {"get", "describe", "delete", "edit", "label", "annotate", "patch", "wait"}
KUBERNETES_RESOURCES = {  # built-in kinds, by the names kubectl accepts (plural, singular, short)
    "all", "configmap", "configmaps", "cm", "crd", "crds", "customresourcedefinitions", "deploy",
    "deployment", "deployments", "event", "events", "ev", "job", "jobs", "namespace", "namespaces",
    "ns", "networkpolicies", "netpol", "node", "nodes", "no", "persistentvolumeclaims", "pvc", "pod",
    "pods", "po", "poddisruptionbudgets", "pdb", "secret", "secrets", "service", "services", "svc",
    "serviceaccounts", "sa", "statefulset", "statefulsets", "sts", "roles", "rolebindings",
    "clusterroles", "clusterrolebindings",
}
HELM_SUBCOMMANDS = {"install", "upgrade", "uninstall", "template", "lint", "status", "list", "get"}
HELM_VALUE_FLAGS = {"-n", "--namespace", "--version", "--kube-context", "--timeout", "-o", "--output"}


# ---- syntax checks ---------------------------------------------------------------------------

@cache
def crd_resource_names() -> frozenset[str]:
    names = set()
    for path in (ROOT / "crds").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            n = spec["names"]
            for name in (n["plural"], n.get("singular"), n["kind"].lower(), *n.get("shortNames", [])):
                if name:
                    names.update({name, f"{n['plural']}.{spec['group']}"})
    return frozenset(names)


def check_tidemq(args: list[str]) -> str | None:
    """Parse ``tidemq ARGS`` with the CLI's click commands without running them."""
    cmd: click.Command = cli
    path = ["tidemq"]
    while isinstance(cmd, click.Group):
        if cmd.invoke_without_command and (not args or args[0].startswith("-")):
            break  # a group that runs itself (`tidemq operator -A`) takes its own options
        if args and args[0] in {opt for p in cmd.params for opt in p.opts}:
            break  # the group's own eager option (`tidemq --version`)
        if not args:
            return f"`{' '.join(path)}` needs a subcommand"
        sub = cmd.get_command(click.Context(cmd), args[0])
        if sub is None:
            return f"`{' '.join(path)}` has no command {args[0]!r}"
        path.append(args[0])
        cmd, args = sub, args[1:]
    try:
        cmd.make_context(" ".join(path), list(args))
    except click.exceptions.Exit:
        pass  # --help / --version
    except click.BadParameter as exc:
        if "does not exist" not in exc.format_message():  # a file on the reader's machine
            return f"`{' '.join(path)}`: {exc.format_message()}"
    except click.UsageError as exc:
        return f"`{' '.join(path)}`: {exc.format_message()}"
    return None


def check_kubectl(args: list[str]) -> str | None:
    words = [a for a in args if not a.startswith("-")]
    if not words or words[0] not in KUBECTL_SUBCOMMANDS:
        return f"unknown kubectl subcommand in `kubectl {' '.join(args)}`"
    for i, arg in enumerate(args):
        if arg in ("-f", "--filename"):
            target = args[i + 1] if i + 1 < len(args) else ""
            if target != "-" and not (ROOT / target).exists():
                return f"`kubectl ... -f {target}`: no such file or folder in the repository"
    if words[0] in KUBECTL_RESOURCE_VERBS and "-f" not in args and len(words) > 1:
        for res in words[1].split(","):
            res = res.split("/")[0]
            if res not in KUBERNETES_RESOURCES and res not in crd_resource_names():
                return f"`kubectl {words[0]} {words[1]}`: {res!r} is neither a Kubernetes resource nor one of our CRDs"
    return None


def check_helm(args: list[str]) -> str | None:
    if not args or args[0] not in HELM_SUBCOMMANDS:
        return f"unknown helm subcommand in `helm {' '.join(args)}`"
    values = yaml.safe_load(CHART_VALUES.read_text())
    positional = []
    i = 1
    while i < len(args):
        arg = args[i]
        if arg in ("--set", "--set-string"):
            key = args[i + 1].split("=", 1)[0] if i + 1 < len(args) else ""
            node = values
            for part in key.split("."):
                if not isinstance(node, dict) or part not in node:
                    return f"`helm --set {key}`: no such value in {CHART_VALUES.relative_to(ROOT)}"
                node = node[part]
            i += 1
        elif arg in ("-f", "--values"):
            if i + 1 >= len(args) or not (ROOT / args[i + 1]).is_file():
                return f"`helm {arg}`: no such values file in the repository"
            i += 1
        elif arg in HELM_VALUE_FLAGS:
            i += 1
        elif not arg.startswith("-"):
            positional.append(arg)
        i += 1
    if args[0] in ("install", "upgrade", "template") and len(positional) >= 2:
        chart = positional[1]
        if not (ROOT / chart / "Chart.yaml").is_file():
            return f"`helm {args[0]}`: {chart} is not a chart folder of the repository"
    return None


def check_python(args: list[str]) -> str | None:
    if args[:1] == ["-m"]:
        if len(args) < 2 or importlib.util.find_spec(args[1]) is None:
            return f"`python -m {' '.join(args[1:2])}`: no such module here"
        return None
    if args[:1] == ["dev.py"]:
        if len(args) < 2 or f'"{args[1]}"' not in (ROOT / "dev.py").read_text():
            return f"`python3 dev.py {' '.join(args[1:2])}`: dev.py has no such command"
        return None
    if args and not (ROOT / args[0]).is_file():
        return f"`python {args[0]}`: no such script in the repository"
    return None


def check_command(argv: list[str]) -> str | None:
    """Why ``argv`` (one simple command of a README shell block) is wrong, or None."""
    prog, args = argv[0], argv[1:]
    if prog == "tidemq":
        return check_tidemq(args)
    if prog == "kubectl":
        return check_kubectl(args)
    if prog == "helm":
        return check_helm(args)
    if prog in ("python", "python3") or prog.endswith("/bin/python"):
        return check_python(args)
    if prog in ("bash", "sh"):
        if args and not (ROOT / args[0]).is_file():
            return f"`{prog} {args[0]}`: no such script in the repository"
        return None
    if prog in PLAIN_PROGRAMS:
        return None
    return f"unknown program {prog!r} (a `;` or `|` the shell splits on? quote it)"


def check_shell(text: str) -> list[str]:
    r = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=30)
    problems = [f"bash -n: {r.stderr.strip()}"] if r.returncode else []
    for argv in shell_commands(text):
        problem = check_command(argv)
        if problem:
            problems.append(problem)
    return problems


def check_yaml(text: str) -> list[str]:
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        return [f"YAML: {exc}"]
    if any(isinstance(d, dict) and "accounts" in d for d in docs):
        try:
            parse_acl_config(text, "the README's plain_acl.yml")
        except ConfigError as exc:
            return [str(exc)]
    return []


def syntax_problems(block: Block) -> list[str]:
    if block.file is not None:
        path = ROOT / block.file
        if not path.is_file():
            return [f"marked as the content of {block.file}, which does not exist"]
        if block.text != path.read_text():
            return [f"differs from {block.file} (copy the file into the block)"]
    if block.kind == "shell":
        return check_shell(block.text)
    if block.kind == "python":
        try:
            compile(block.text, f"README.md:{block.line}", "exec")
        except SyntaxError as exc:
            return [f"Python: {exc}"]
        return []
    if block.kind == "yaml":
        return check_yaml(block.text)
    return []


# ---- the server the runnable blocks use ------------------------------------------------------

class Local:
    def __init__(self, root: Path) -> None:
        self.ns_port, self.broker_port, self.metrics_port = free_port(), free_port(), free_port()
        self.proc = ServerProcess(
            tidemq_cmd("local", "--data", str(root / "data"), "--namesrv-port", str(self.ns_port),
                       "--broker-port", str(self.broker_port), "--metrics-port", str(self.metrics_port),
                       "--segment-size", str(64 * 1024 * 1024)),
            root / "local.log", f"http://127.0.0.1:{self.metrics_port}/readyz",
        )

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.ns_port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_") and k != "NAMESRV_ADDR"}
        env.update(
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            NAMESRV_ADDR=self.namesrv,
            EXAMPLE_NAMESRV_PORT=str(free_port()),
            EXAMPLE_BROKER_PORT=str(free_port()),
            PYTHONUNBUFFERED="1",
        )
        return env

    def prepare(self, text: str) -> str:
        return substitute(text, self.namesrv, f"127.0.0.1:{self.broker_port}", f"127.0.0.1:{self.metrics_port}")


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    server = Local(tmp_path_factory.mktemp("readme-local"))
    server.proc.start()
    yield server
    server.proc.stop()


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


# ---- tests -----------------------------------------------------------------------------------

def test_readme_follows_the_block_conventions():
    assert PARSE_ERROR is None, PARSE_ERROR
    unknown = [f"line {b.line}: {b.kind}" for b in BLOCKS if b.kind not in ("shell", "python", "yaml", "text")]
    assert not unknown, f"code blocks in a language the test cannot check (use sh, python, yaml or text): {unknown}"
    assert not indented_code_lines(README.read_text()), (
        "indented code blocks cannot be marked or run: fence them (```sh) on lines "
        f"{indented_code_lines(README.read_text())}")
    kinds = {b.kind for b in RUNNABLE}
    assert {"shell", "python"} <= kinds, f"no runnable {({'shell', 'python'} - kinds)} block found"


@pytest.mark.parametrize("block", BLOCKS, ids=block_ids(BLOCKS))
def test_block_syntax(block: Block, monkeypatch):
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)  # a command without -n must fail here too
    problems = syntax_problems(block)
    assert not problems, f"README.md line {block.line} ({block.section}):\n" + "\n".join(problems)


# A Spark block starts a JVM and a Spark job (~30 s here): it runs in the slow set, which CI runs.
RUN_CASES = [pytest.param(b, id=i, marks=[pytest.mark.slow] if "spark" in i else [])
             for b, i in zip(RUNNABLE, block_ids(RUNNABLE))]


@pytest.mark.parametrize("block", RUN_CASES)
def test_block_runs(block: Block, local: Local, tmp_path):
    script = tmp_path / ("block.sh" if block.kind == "shell" else "block.py")
    script.write_text(local.prepare(block.text))
    argv = ["bash", "-euo", "pipefail", str(script)] if block.kind == "shell" else [sys.executable, str(script)]
    try:
        r = subprocess.run(argv, cwd=ROOT, env=local.env(), capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"README.md line {block.line} ({block.section}) ran over {RUN_TIMEOUT} s:\n"
                    f"{_tail(str(exc.stdout or ''))}\n{_tail(str(exc.stderr or ''))}")
    assert r.returncode == 0, (
        f"README.md line {block.line} ({block.section}) exited {r.returncode}:\n--- stdout\n{_tail(r.stdout)}"
        f"\n--- stderr\n{_tail(r.stderr)}\n--- server log\n{_tail(local.proc.log(), 15)}")
    assert "Traceback (most recent call last)" not in r.stderr, _tail(r.stderr)


def test_every_example_is_run_by_the_readme():
    run_text = "\n".join(b.text for b in RUNNABLE)
    readme = README.read_text()
    files = sorted(p for p in EXAMPLES.iterdir() if p.is_file())
    assert files, "examples/ is empty"
    run_examples = [p for p in files if p.relative_to(ROOT).as_posix() in run_text]
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        # a shell helper counts as run when an example the README runs sources it
        sourced = any(f'source "$(dirname "$0")/{path.name}"' in p.read_text() for p in run_examples)
        if path.suffix in (".py", ".sh"):
            assert rel in run_text or sourced, f"{rel} is not run by any runnable README block"
        else:
            assert rel in readme, f"{rel} is not mentioned in the README"


# The checks themselves: the mistakes of issue 15 are caught.
@pytest.mark.parametrize("line, expected", [
    ('tidemq broker --namesrv 10.0.0.1:9876;10.0.0.2:9876 --listen 0.0.0.0:10911', "'10.0.0.2:9876'"),
    ("tidemq admin topicList | topicRoute -t T | clusterList", "'topicRoute'"),
    ("tidemq admin topicRoute -t T", "-n"),
    ("tidemq admin updateSubGroup -n 127.0.0.1:9876 -g g [-r 16]", "[-r"),
    ("tidemq broker --acl-file plain_acl.yml ...", "..."),
    ("tidemq broker --tls-mode strict", "strict"),
    ("helm install tidemq charts/tidemq --set operator.noSuchValue=true", "operator.noSuchValue"),
    ("kubectl apply -f crds/no-such-file.yaml", "no-such-file"),
    ("kubectl get tmqc,tmqx", "tmqx"),
])
def test_syntax_check_catches(line, expected, monkeypatch):
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)
    problems = check_shell(line + "\n")
    assert problems and any(expected in p for p in problems), problems


@pytest.mark.parametrize("line", [
    'tidemq broker --namesrv "10.0.0.1:9876;10.0.0.2:9876" --acl-file /etc/tidemq/plain_acl.yml',
    "TIDEMQ_TLS=1 tidemq admin clusterList -n 127.0.0.1:9876 2>&1 | grep -q DefaultCluster",
    "kubectl get tmqc,tmqt,tmqg,pods",
    "helm install tidemq charts/tidemq -n tidemq --set operator.watchAllNamespaces=true",
])
def test_syntax_check_accepts(line, monkeypatch):
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)
    assert check_shell(line + "\n") == []


def test_substitution_replaces_only_the_documented_addresses():
    text = 'a 127.0.0.1:9876 b "127.0.0.1:10911" c 127.0.0.1:9877/metrics d 127.0.0.1:98765 e 10.0.0.1:9876'
    assert substitute(text, "N", "B", "M") == 'a N b "B" c M/metrics d 127.0.0.1:98765 e 10.0.0.1:9876'


def test_markers_are_parsed_strictly():
    assert blocks("<!-- readme-test: skip (no cluster) -->\n```sh\nkubectl get pods\n```\n")[0].skip == "no cluster"
    for bad in ("<!-- readme-test: skip -->\n```sh\nx\n```\n",
                "<!-- readme-test: skipp (x) -->\n```sh\nx\n```\n",
                "<!-- readme-test: skip (x) -->\ntext\n```sh\nx\n```\n",
                "```sh\nx\n"):
        with pytest.raises(ReadmeError):
            blocks(bad)
    assert re.search("readme-test: skip", README.read_text()), "the README marks no block"


def test_admin_commands_in_messages_are_complete():
    """A hint that shows a `tidemq admin` command with arguments names the name server (`-n`), so
    pasting it works; a bare command name (`tidemq admin topicRoute`) only names the command."""
    hint = re.compile(r"`tidemq admin (\w+)([^`]*)`")
    incomplete = []
    for folder in ("tidemq", "services", "operator", "spark"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for m in hint.finditer(path.read_text()):
                args = re.sub(r'"\s*\n\s*f?"', "", m[2])  # an f-string continued on the next line
                if args.strip() and not re.search(r"(^|\s)-n\s", args):
                    incomplete.append(f"{path.relative_to(ROOT)}: `tidemq admin {m[1]}{args}`")
    assert not incomplete, "hints without -n NAMESRV:\n" + "\n".join(incomplete)
