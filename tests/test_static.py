"""Static checks of what the rest of the suite cannot run: scripts, YAML, CI workflows, the e2e suite.

These run in the normal suite everywhere (`python3 dev.py test`, here and in CI), with no Docker
engine, no kind and no network. Each check runs a real tool from the `test` extra or a parser and,
when it fails, shows that tool's output:

- yaml.safe_load_all on every YAML file except Helm templates (Go templates: tests/charts renders
  and validates them); every JSON file parses;
- `python3 dev.py lint` (lint.py, which runs shellcheck, yamllint, ruff, mypy and import-linter)
  finds what it must check and fails when a tool does, and CI runs it;
- e2e/kind-config.yaml against kind's v1alpha4 Cluster config, which kind decodes strictly
  (unknown fields are errors), plus the checks of kind's own validation;
- e2e/values-e2e.yaml merged over the chart's values.yaml against values.schema.json, and Helm's
  lint of the chart with them (the helm-sdkpy engine of tests/charts);
- the workflows against GitHub's workflow schema (check-jsonschema's vendored copy, offline), and
  against the repository: the paths, dev.py commands, Dockerfile targets, kind config, images,
  e2e environment variables and artifact folder they name exist and agree with the e2e suite;
- the e2e modules import without Docker/kind/Kubernetes, and `pytest --collect-only -m e2e e2e`
  collects at least one test from every e2e/test_*.py while the default run collects none of them.

The repository's files, shell scripts, YAML files and workflows are found by lint.py's functions
(the files git knows: tracked, or untracked and not ignored), so both check the same files.
"""

from __future__ import annotations

import ast
import importlib.util
import ipaddress
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

import lint
from lint import load_workflow, repo_files, script_text, shell_scripts, steps, workflows, yaml_files
from tests.charts import test_chart as chart_tests

ROOT = Path(__file__).resolve().parent.parent
E2E = ROOT / "e2e"
WORKFLOWS = ROOT / ".github" / "workflows"
KIND_CONFIG = E2E / "kind-config.yaml"
VALUES_E2E = E2E / "values-e2e.yaml"
CHART = ROOT / "charts" / "tidemq"


# ---- helpers ---------------------------------------------------------------------------------

def run_tool(cmd: list[str], *, input: str | None = None, timeout: float = 120,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, input=input, capture_output=True, text=True, timeout=timeout,
                          env=env)


def output(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"


def uses(workflow: dict, action: str) -> list[dict]:
    """The steps of a workflow that use `action` (owner/name, any version)."""
    return [s for _j, _job, s in steps(workflow)
            if str(s.get("uses", "")).split("@")[0].lower() == action.lower()]


def all_env(workflow: dict) -> dict[str, str]:
    """Every env entry of a workflow (workflow, job and step level) merged."""
    env = dict(workflow.get("env") or {})
    for _j, job in (workflow.get("jobs") or {}).items():
        env.update(job.get("env") or {})
    for _j, _job, step in steps(workflow):
        env.update(step.get("env") or {})
    return {k: str(v) for k, v in env.items()}


def resolve(value: str, env: dict[str, str]) -> str:
    """Substitute `${{ env.NAME }}` in a workflow value."""
    return re.sub(r"\$\{\{\s*env\.(\w+)\s*\}\}", lambda m: env.get(m.group(1), m.group(0)), value)


def e2e_sources() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(E2E.glob("*.py")))


def dockerfile_stages() -> list[str]:
    stages = []
    for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        m = re.match(r"\s*FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.I)
        if m:
            stages.append((m.group(1) or f"stage{len(stages)}").lower())
    return stages


def dev_commands() -> set[str]:
    """The commands dev.py's main() accepts (the tuple `sys.argv[1]` is checked against)."""
    tree = ast.parse((ROOT / "dev.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Compare) and any(isinstance(op, ast.NotIn) for op in node.ops)
                and "sys.argv[1]" in ast.unparse(node.left)):
            values = ast.literal_eval(node.comparators[0])
            return set(values)
    raise AssertionError("dev.py: no `sys.argv[1] not in (...)` command check found")


def e2e_test_files() -> list[Path]:
    return sorted(r for r in repo_files() if r.parent == Path("e2e") and r.name.startswith("test_")
                  and r.suffix == ".py")


def e2e_modules() -> list[str]:
    """Module names of every Python file in e2e/, sub-folders included (`e2e`, `e2e.conftest`, ...)."""
    names = set()
    for r in repo_files():
        if r.parts[0] == "e2e" and r.suffix == ".py":
            parts = r.with_suffix("").parts
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names)


def e2e_scripts() -> list[Path]:
    """Python files of e2e/ that are run as programs (in the cluster): `if __name__ == "__main__"`."""
    return [r for r in repo_files() if r.parts[0] == "e2e" and r.suffix == ".py"
            and re.search(r"^if __name__ == .__main__.:", (ROOT / r).read_text(encoding="utf-8"), re.M)]


def child_env() -> dict[str, str]:
    """Environment for a child pytest: none of the parent run's options (CI sets PYTEST_ADDOPTS
    with --junitxml/--basetemp, which a child must not share)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}


# ---- shell scripts ---------------------------------------------------------------------------

def test_shell_scripts_are_found():
    scripts = shell_scripts()
    assert Path(".ci/run") in scripts, f"the shebang scan misses .ci/run; found {scripts}"


# ---- YAML and JSON ---------------------------------------------------------------------------

def test_yaml_files_are_found():
    found = {str(r) for r in yaml_files()}
    assert {"charts/tidemq/values.yaml", ".yamllint"} <= found, sorted(found)
    assert not any("/templates/" in f for f in found if f.startswith("charts/")), "Helm templates are not YAML"


@pytest.mark.parametrize("rel", yaml_files(), ids=str)
def test_yaml_parses(rel: Path):
    try:
        docs = list(yaml.safe_load_all((ROOT / rel).read_text(encoding="utf-8")))
    except yaml.YAMLError as exc:
        pytest.fail(f"{rel} is not valid YAML:\n{exc}")
    assert any(d is not None for d in docs), f"{rel} holds no YAML document"


@pytest.mark.parametrize("rel", [r for r in repo_files() if r.suffix == ".json"], ids=str)
def test_json_parses(rel: Path):
    try:
        json.loads((ROOT / rel).read_text(encoding="utf-8"))
    except ValueError as exc:
        pytest.fail(f"{rel} is not valid JSON: {exc}")


# ---- the kind config -------------------------------------------------------------------------

_PORT = {"type": "integer", "minimum": -1, "maximum": 65535}
_PATCH6902 = {"type": "object", "additionalProperties": False, "required": ["group", "version", "kind", "patch"],
              "properties": {k: {"type": "string"} for k in ("group", "version", "kind", "patch")}}
_STRINGS = {"type": "array", "items": {"type": "string"}}
# kind's v1alpha4 Cluster (sigs.k8s.io/kind/pkg/apis/config/v1alpha4/types.go). kind decodes the
# file with KnownFields(true), so an unknown or misspelt field fails `kind create cluster`.
KIND_V1ALPHA4 = {
    "type": "object",
    "additionalProperties": False,
    "required": ["kind", "apiVersion"],
    "properties": {
        "kind": {"const": "Cluster"},
        "apiVersion": {"const": "kind.x-k8s.io/v1alpha4"},
        "name": {"type": "string", "pattern": "^[a-z0-9.-]+$"},
        "nodes": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "role": {"enum": ["control-plane", "worker"]},
                "image": {"type": "string", "minLength": 1},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "extraMounts": {"type": "array", "items": {
                    "type": "object", "additionalProperties": False, "required": ["containerPath"],
                    "properties": {
                        "containerPath": {"type": "string"}, "hostPath": {"type": "string"},
                        "readOnly": {"type": "boolean"}, "selinuxRelabel": {"type": "boolean"},
                        "propagation": {"enum": ["None", "HostToContainer", "Bidirectional"]},
                    }}},
                "extraPortMappings": {"type": "array", "items": {
                    "type": "object", "additionalProperties": False, "required": ["containerPort"],
                    "properties": {
                        "containerPort": _PORT, "hostPort": _PORT, "listenAddress": {"type": "string"},
                        "protocol": {"enum": ["TCP", "UDP", "SCTP"]},
                    }}},
                "kubeadmConfigPatches": _STRINGS,
                "kubeadmConfigPatchesJSON6902": {"type": "array", "items": _PATCH6902},
            },
        }},
        "networking": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "ipFamily": {"enum": ["ipv4", "ipv6", "dual"]},
                "apiServerPort": _PORT,
                "apiServerAddress": {"type": "string"},
                "podSubnet": {"type": "string"},
                "serviceSubnet": {"type": "string"},
                "disableDefaultCNI": {"type": "boolean"},
                "kubeProxyMode": {"enum": ["iptables", "ipvs", "nftables", "none"]},
                "dnsSearch": _STRINGS,
            },
        },
        "featureGates": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "runtimeConfig": {"type": "object", "additionalProperties": {"type": "string"}},
        "kubeadmConfigPatches": _STRINGS,
        "kubeadmConfigPatchesJSON6902": {"type": "array", "items": _PATCH6902},
        "containerdConfigPatches": _STRINGS,
        "containerdConfigPatchesJSON6902": _STRINGS,
    },
}


@pytest.fixture(scope="module")
def kind_config() -> dict:
    assert KIND_CONFIG.is_file(), f"{KIND_CONFIG.relative_to(ROOT)} is missing (the e2e cluster's kind config)"
    docs = [d for d in yaml.safe_load_all(KIND_CONFIG.read_text(encoding="utf-8")) if d is not None]
    assert len(docs) == 1, f"kind reads one document from its config; {KIND_CONFIG.name} has {len(docs)}"
    return docs[0]


def test_kind_config_matches_kinds_schema(kind_config):
    errors = sorted(jsonschema.Draft202012Validator(KIND_V1ALPHA4).iter_errors(kind_config), key=str)
    assert not errors, "e2e/kind-config.yaml is not a kind v1alpha4 Cluster config:\n" + "\n".join(
        f"  at {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors)


def test_kind_config_passes_kinds_validation(kind_config):
    """What `kind create cluster` checks after decoding (pkg/internal/apis/config/validate.go)."""
    nodes = kind_config.get("nodes") or [{"role": "control-plane"}]  # kind's default: one control plane
    roles = [n.get("role", "control-plane") for n in nodes]
    assert "control-plane" in roles, f"kind needs at least one control-plane node; roles: {roles}"
    for i, node in enumerate(nodes):
        bound = set()
        for m in node.get("extraPortMappings") or []:
            host = m.get("hostPort", 0)
            if host in (0, -1):  # a random port: duplicates allowed
                continue
            addr = ipaddress.ip_address(m.get("listenAddress") or "0.0.0.0")
            addr = "0.0.0.0" if addr.is_unspecified else str(addr)
            key = (host, m.get("protocol", "TCP"))
            clash = {(key, addr), (key, "0.0.0.0")} & bound or (addr == "0.0.0.0" and any(k == key for k, _ in bound))
            assert not clash, f"node {i}: host port {host}/{key[1]} is mapped twice on {addr}"
            bound.add((key, addr))
        for patch in node.get("kubeadmConfigPatches") or []:
            assert isinstance(yaml.safe_load(patch), dict), f"node {i}: a kubeadmConfigPatch is not a YAML mapping"
    for patch in kind_config.get("kubeadmConfigPatches") or []:
        assert isinstance(yaml.safe_load(patch), dict), "a kubeadmConfigPatch is not a YAML mapping"


def test_kind_config_is_used_by_the_e2e_suite():
    assert KIND_CONFIG.name in e2e_sources(), (
        f"no e2e module names {KIND_CONFIG.name}: the fixture must create the cluster from it")


# ---- the e2e Helm values ---------------------------------------------------------------------

def _merged(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _e2e_values() -> dict:
    assert VALUES_E2E.is_file(), f"{VALUES_E2E.relative_to(ROOT)} is missing (the e2e Helm values)"
    values = yaml.safe_load(VALUES_E2E.read_text(encoding="utf-8")) or {}
    assert isinstance(values, dict), f"{VALUES_E2E.relative_to(ROOT)} must be a mapping"
    return _merged(yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8")), values)


def test_e2e_values_match_the_chart_schema():
    """`helm install -f e2e/values-e2e.yaml` validates the merged values against values.schema.json
    first; an error there would only show in the e2e workflow."""
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(_e2e_values()), key=str)
    assert not errors, "charts/tidemq/values.yaml + e2e/values-e2e.yaml against values.schema.json:\n" + "\n".join(
        f"  at {'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors)


@pytest.fixture(scope="module")
def helm_engine() -> Path:
    """The .venv-helm interpreter with helm-sdkpy (dev.py makes it; tests/charts lints with it)."""
    spec = importlib.util.spec_from_file_location("tidemq_dev", ROOT / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    problem = dev.ensure_helm_venv()
    if problem:
        pytest.skip(f"no Helm engine: {problem}")
    return dev.HELM_PY


def test_e2e_values_lint_with_helm(helm_engine, tmp_path):
    """Helm's own lint of the chart with the e2e values (the Helm engine of tests/charts)."""
    messages = chart_tests.lint(helm_engine, chart_tests.chart_copy(tmp_path, _e2e_values()))
    assert chart_tests.errors(messages) == [], f"helm lint with e2e/values-e2e.yaml: {messages}"


# ---- GitHub workflows ------------------------------------------------------------------------

def test_workflows_exist_and_parse():
    for name in ("ci.yml", "e2e.yml"):
        path = WORKFLOWS / name
        assert path.is_file(), f".github/workflows/{name} is missing"
        try:
            load_workflow(path)
        except yaml.YAMLError as exc:
            pytest.fail(f".github/workflows/{name} is not valid YAML:\n{exc}")
    assert set(workflows()) >= {"ci.yml", "e2e.yml"}


@pytest.mark.parametrize("name", sorted(p.name for p in WORKFLOWS.glob("*.y*ml")) if WORKFLOWS.is_dir() else [])
def test_workflow_matches_github_schema(name: str):
    """check-jsonschema's vendored copy of the schemastore GitHub workflow schema (no network)."""
    proc = run_tool([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                     "--color", "never", "--verbose", str(WORKFLOWS / name)])
    assert proc.returncode == 0, f"check-jsonschema --builtin-schema vendor.github-workflows {name}:\n{output(proc)}"


def test_schema_check_rejects_a_broken_workflow(tmp_path):
    """The schema check above can fail: a job without runs-on is refused."""
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-onn: ubuntu-latest\n    steps:\n      - run: 'true'\n")
    proc = run_tool([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                     "--color", "never", str(bad)])
    assert proc.returncode != 0 and "runs-on" in proc.stdout, output(proc)


def test_workflow_triggers():
    ci, e2e = workflows()["ci.yml"]["on"], workflows()["e2e.yml"]["on"]
    assert "push" in ci and "pull_request" in ci, f"ci.yml must run on push and pull_request: {ci}"
    assert (e2e.get("push") or {}).get("branches") == ["main"], f"e2e.yml must run on push to main: {e2e}"
    assert "workflow_dispatch" in e2e, "e2e.yml must be runnable on demand (workflow_dispatch)"
    assert "pull_request" in e2e, "e2e.yml must run on pull requests too (issue 18: breakages showed only after merging)"


def test_e2e_workflow_pins_its_tools_and_loads_images_kind_can_import():
    """Issue 18's first-run breakages: buildx attestations in the image index make `kind load`
    fail with Docker's containerd image store ("content digest ... not found"), unpinned kind
    and Helm change under the suite (Helm 4's bare --wait is another wait)."""
    wf = workflows()["e2e.yml"]
    env = all_env(wf)
    for step in uses(wf, "docker/build-push-action"):
        w = step.get("with") or {}
        assert w.get("provenance") is False and w.get("sbom") is False, (
            f"e2e.yml: {step.get('name')}: build with provenance: false and sbom: false")
    kind = (uses(wf, "helm/kind-action") or [{}])[0].get("with") or {}
    assert re.fullmatch(r"v\d+\.\d+\.\d+", resolve(str(kind.get("version", "")), env)), f"pin kind: {kind}"
    assert re.fullmatch(r"v\d+\.\d+\.\d+", resolve(str(kind.get("kubectl_version", "")), env)), (
        f"pin kubectl (the action's default is years older than kind's Kubernetes): {kind}")
    helm = [resolve(str((s.get("with") or {}).get("version", "")), env) for s in uses(wf, "azure/setup-helm")]
    assert helm and all(re.fullmatch(r"v3\.\d+\.\d+", v) for v in helm), f"pin Helm 3: {helm}"
    assert "kind\", \"load\", \"docker-image" not in e2e_sources(), (
        "load images with docker save + kind load image-archive (e2e/kind.py)")


def test_bench_workflow_runs_the_replicated_rows_with_options_compare_accepts():
    """bench.yml (issue 17's speed rows on a 4-core runner): it installs the servers the
    replicated rows start, and every option it gives bench/compare.py is one compare.py has."""
    wf = workflows()["bench.yml"]
    assert "workflow_dispatch" in wf["on"], "bench.yml must be runnable on demand"
    scripts = "\n".join(script_text(s["run"]) for _j, _job, s in steps(wf) if s.get("run"))
    for package in ("redis-server", "nats-server", "etcd-server"):
        assert package in scripts, f"bench.yml must install {package}"
    lines = [ln for ln in scripts.replace("\\\n", " ").splitlines() if "bench/compare.py" in ln]
    assert lines, "bench.yml must run bench/compare.py"
    given = {w for ln in lines for w in shlex.split(ln) if w.startswith("--")}
    assert {"--replicated", "--write"} <= given, given
    known = set(re.findall(r"add_argument\(\"(--[\w-]+)\"", (ROOT / "bench" / "compare.py").read_text()))
    assert given <= known, f"bench.yml gives compare.py options it does not have: {sorted(given - known)}"


def test_every_job_has_a_timeout_and_pinned_actions():
    problems = []
    for name, wf in workflows().items():
        for job_id, job in (wf.get("jobs") or {}).items():
            if not isinstance(job.get("timeout-minutes"), int):
                problems.append(f"{name}: job {job_id} has no timeout-minutes")
        for job_id, _job, step in steps(wf):
            action = step.get("uses")
            if action is None:
                continue
            if action.startswith("./"):
                if not (ROOT / action).exists():
                    problems.append(f"{name}: job {job_id} uses a local action that does not exist: {action}")
            elif not re.fullmatch(r"[\w.-]+/[\w./-]+@[\w.-]+", action):
                problems.append(f"{name}: job {job_id}: `uses: {action}` must name a version (@vN or a SHA)")
    assert not problems, "\n".join(problems)


def test_workflow_paths_and_commands_exist():
    """Every repository path a workflow names (run blocks and action inputs) exists, and every
    `dev.py <command>` is a command dev.py accepts."""
    top = {p.split("/")[0] for p in map(str, repo_files())} | {".venv"}
    commands = dev_commands()
    problems = []
    for name, wf in workflows().items():
        for job_id, _job, step in steps(wf):
            where = f"{name}: job {job_id}, step {step.get('name') or step.get('uses') or step.get('run', '')[:30]!r}"
            for key in ("config", "context", "file", "cache-dependency-path"):
                value = (step.get("with") or {}).get(key)
                if isinstance(value, str) and "${{" not in value and not (ROOT / value).exists():
                    problems.append(f"{where}: with.{key} {value!r} does not exist")
            script = step.get("run")
            if not script:
                continue
            for line in script_text(script).splitlines():
                try:
                    words = shlex.split(line, comments=True)
                except ValueError:
                    continue
                for i, word in enumerate(words):
                    if word.endswith("dev.py") and i + 1 < len(words) and words[i + 1] not in commands:
                        problems.append(f"{where}: `dev.py {words[i + 1]}` is not a dev.py command {sorted(commands)}")
                    if word.startswith("-") or "$" in word or "=" in word or "://" in word:
                        continue
                    head = word.split("/")[0]
                    is_repo_path = head in top and (head == word or "/" in word or head.startswith("."))
                    if is_repo_path and head != ".venv" and not (ROOT / word).exists():
                        problems.append(f"{where}: {word!r} does not exist in the repository")
    assert not problems, "\n".join(problems)


def test_ci_runs_lint_and_the_suite():
    """CI lints twice over: its lint job runs `dev.py lint`, and `.ci/run` runs `dev.py test`,
    whose full run starts with the same lint."""
    ci = workflows()["ci.yml"]
    scripts = "\n".join(s.get("run", "") for _j, _job, s in steps(ci))
    assert re.search(r"(^|\s)(python3 )?\.ci/run(\s|$)", scripts), "ci.yml must run `.ci/run`"
    ci_run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"dev\.py test", ci_run), ".ci/run must run `dev.py test`"
    assert re.search(r"dev\.py lint\b", scripts), "ci.yml's lint job must run `python3 dev.py lint`"
    dev = ast.parse((ROOT / "dev.py").read_text(encoding="utf-8"))
    test_fn = next(n for n in dev.body if isinstance(n, ast.FunctionDef) and n.name == "test")
    calls = [ast.unparse(c.func) for c in ast.walk(test_fn) if isinstance(c, ast.Call)]
    assert "lint" in calls, "dev.py's test command must run lint() before the suite"


def test_ruff_checks_every_python_file():
    """Nothing in pyproject's ruff settings leaves a tree out: ruff's own list of the files it
    checks holds every Python file of the repository."""
    proc = run_tool([sys.executable, "-m", "ruff", "check", "--show-files", "."])
    assert proc.returncode == 0, output(proc)
    checked = {Path(line.strip()).resolve().relative_to(ROOT) for line in proc.stdout.splitlines()
               if line.strip().endswith(".py")}
    missing = sorted(str(r) for r in repo_files() if r.suffix == ".py" and r not in checked)
    assert not missing, f"ruff does not check {missing}"


def test_lint_lays_out_the_packages_as_installed(tmp_path):
    """mypy and import-linter see tidemq.broker, tidemq.namesrv ... where pip installs them."""
    tree = lint.installed_tree(tmp_path / "tree")
    for pkg, src in lint.package_dirs().items():
        for f in src.glob("*.py"):
            link = tree.joinpath(*pkg.split("."), f.name)
            assert link.is_symlink() and link.resolve() == f.resolve(), f"{pkg}: {f.name} is not in the tree"
    assert (tree / "tidemq" / "broker" / "store" / "__init__.py").exists()


def test_lint_fails_and_names_each_failing_tool(monkeypatch, capsys):
    monkeypatch.setattr(lint, "TOOLS", {
        "good": (lambda: [], "nothing to do"),
        "bad": (lambda: ["x.sh:1: SC2086 Double quote to prevent globbing"], "fix the scripts"),
    })
    assert lint.main([]) == 1
    out = capsys.readouterr().out
    assert "x.sh:1: SC2086" in out and "[lint] good: ok" in out
    assert "[lint] bad: FAILED (fix the scripts)" in out and "[lint] failed: bad" in out
    assert lint.main(["good"]) == 0


@pytest.mark.parametrize(("tool", "name", "text", "expected"), [
    ("shellcheck", "bad.sh", "#!/bin/sh\nrm $1\n", "SC2086"),
    ("yamllint", "bad.yaml", "a: 1\na: 2\n", "key-duplicates"),
])
def test_lint_tools_report_a_broken_file(monkeypatch, tmp_path, tool, name, text, expected):
    """shellcheck and yamllint (moved here from pytest into lint.py) do fail on a bad file."""
    (tmp_path / name).write_text(text)
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / ".yamllint").write_text((ROOT / ".yamllint").read_text(encoding="utf-8"))
    monkeypatch.setattr(lint, "ROOT", tmp_path)
    monkeypatch.setattr(lint, "YAMLLINT_CONFIG", tmp_path / ".yamllint")
    monkeypatch.setattr(lint, "run_blocks", list)
    monkeypatch.setattr(lint, "repo_files", lambda: (Path(name),))
    problems = getattr(lint, tool)()
    assert any(expected in p for p in problems), problems


def test_workflow_python_and_java_versions():
    """setup-python gives a Python the project accepts; setup-java a Java Spark accepts (dev.py)."""
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    low = tuple(int(x) for x in re.search(r">=\s*([\d.]+)", requires).group(1).split("."))
    for name, wf in workflows().items():
        for step in uses(wf, "actions/setup-python"):
            versions = str(step["with"]["python-version"]).split()
            default = tuple(int(x) for x in versions[-1].split("."))  # the last one listed is `python3`
            assert default >= low, f"{name}: setup-python's default {versions[-1]} is below requires-python {requires}"
    dev = ast.parse((ROOT / "dev.py").read_text(encoding="utf-8"))
    spark_java = next(ast.literal_eval(n.value) for n in ast.walk(dev) if isinstance(n, ast.Assign)
                      and any(getattr(t, "id", None) == "SPARK_JAVA" for t in n.targets))
    javas = [int(str(s["with"]["java-version"])) for s in uses(workflows()["ci.yml"], "actions/setup-java")]
    assert javas and all(j in spark_java for j in javas), f"ci.yml's Java {javas} must be one of {spark_java}"


def test_e2e_workflow_builds_images_and_runs_the_suite():
    wf = workflows()["e2e.yml"]
    env = all_env(wf)
    builds = uses(wf, "docker/build-push-action")
    stages = dockerfile_stages()
    built = {}
    for step in builds:
        w = step.get("with") or {}
        assert w.get("load") is True, f"e2e.yml: {step.get('name')}: the image must be loaded into Docker (load: true)"
        for direction in ("cache-from", "cache-to"):
            assert "type=gha" in str(w.get(direction, "")), f"e2e.yml: {step.get('name')}: {direction} type=gha"
        target = w.get("target") or stages[-1]
        assert target in stages, f"e2e.yml builds target {target!r}; the Dockerfile's stages are {stages}"
        for tag in resolve(str(w.get("tags", "")), env).replace(",", "\n").split():
            built[tag] = target
    assert built.get(resolve(env.get("TIDEMQ_E2E_IMAGE", ""), env)) == stages[-1], (
        f"TIDEMQ_E2E_IMAGE must name the image built from the default target; built {built}, env {env}")
    assert "spark" in built.values(), f"e2e.yml must build the spark target; built {built}"
    assert uses(wf, "docker/setup-buildx-action"), "the gha cache needs a buildx builder (docker/setup-buildx-action)"

    kind = uses(wf, "helm/kind-action")
    if kind and (kind[0].get("with") or {}).get("install_only") not in (True, "true"):
        w = kind[0]["with"]
        name = resolve(str(w.get("cluster_name", "")), env)
        assert re.fullmatch(r"[a-z0-9.-]+", name), f"kind cluster name {name!r}"
        assert env.get("TIDEMQ_E2E_REUSE") == "1", "the action made the cluster: the suite must reuse it"
        assert resolve(env.get("TIDEMQ_E2E_CLUSTER", ""), env) == name, (
            f"TIDEMQ_E2E_CLUSTER must name the action's cluster {name!r}")
        assert w.get("config") == str(KIND_CONFIG.relative_to(ROOT)), "the action must use e2e/kind-config.yaml"

    scripts = "\n".join(s.get("run", "") for _j, _job, s in steps(wf))
    assert re.search(r"dev\.py setup", scripts), "e2e.yml must set up the venv with `python3 dev.py setup`"
    assert re.search(r"-m pytest e2e\b.*-m e2e", scripts), "e2e.yml must run `pytest e2e -m e2e`"


def test_e2e_workflow_agrees_with_the_e2e_suite():
    """The env vars the workflow sets are read by the e2e suite, and the folder it uploads on
    failure is the one the suite writes its dumps to."""
    wf = workflows()["e2e.yml"]
    sources = e2e_sources()
    unread = [k for k in all_env(wf) if k.startswith("TIDEMQ_E2E_") and k not in sources]
    assert not unread, f"e2e.yml sets {unread}, which no e2e/*.py reads"
    uploads = [str((s.get("with") or {}).get("path", "")) for s in uses(wf, "actions/upload-artifact")]
    assert uploads, "e2e.yml must upload the e2e artifacts on failure"
    for path in uploads:
        folder = path.strip().rstrip("/").split("/")[0]
        assert folder in sources, f"e2e.yml uploads {path!r}, which no e2e/*.py writes"
    assert all(str(s.get("if", "")).startswith("failure()") or "always()" in str(s.get("if", ""))
               for s in uses(wf, "actions/upload-artifact")), "upload the artifacts when the run fails"


# ---- the e2e suite ---------------------------------------------------------------------------

_IMPORT_ALL = """
import importlib, json, pathlib, sys, traceback
root = pathlib.Path(sys.argv[1])
package = (root / "e2e" / "__init__.py").is_file()
sys.path.append(str(root))
if not package:
    sys.path.append(str(root / "e2e"))
result = {}
for name in sys.argv[2:]:
    try:
        importlib.import_module(name if package else name.removeprefix("e2e."))
        result[name] = None
    except BaseException:
        result[name] = traceback.format_exc()
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def e2e_imports() -> dict[str, str | None]:
    if not E2E.is_dir():
        pytest.fail("the e2e/ folder is missing")
    proc = run_tool([sys.executable, "-c", _IMPORT_ALL, str(ROOT), *e2e_modules()], env=child_env())
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, f"importing the e2e modules failed:\n{output(proc)}"
    return json.loads(line[len("RESULT "):])


def test_e2e_suite_exists():
    assert e2e_test_files(), "e2e/ has no test_*.py module"
    assert (E2E / "conftest.py").is_file(), "e2e/conftest.py (the cluster fixture) is missing"


@pytest.mark.parametrize("module", e2e_modules())
def test_e2e_module_imports(module: str, e2e_imports):
    """Importable without Docker, kind or a cluster (nothing runs at import time)."""
    error = e2e_imports[module]
    assert error is None, f"{module} does not import:\n{error}"


@pytest.mark.parametrize("rel", e2e_scripts(), ids=str)
def test_e2e_script_help(rel: Path):
    """A program the suite runs in the cluster starts and parses its arguments (`--help`)."""
    proc = run_tool([sys.executable, str(rel), "--help"], env=child_env(), timeout=60)
    assert proc.returncode == 0 and "usage" in proc.stdout.lower(), f"python {rel} --help:\n{output(proc)}"


def _collect(*args: str) -> subprocess.CompletedProcess:
    return run_tool([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                    env=child_env(), timeout=300)


def _collected(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln.strip() for ln in proc.stdout.splitlines() if "::" in ln and not ln.startswith(("=", "_"))]


def test_e2e_collects_every_module():
    """`pytest --collect-only -m e2e e2e` collects >= 1 test from each e2e/test_*.py, cleanly."""
    proc = _collect("-m", "e2e", "e2e")
    assert proc.returncode == 0, f"pytest --collect-only -m e2e e2e:\n{output(proc)}"
    ids = _collected(proc)
    per_file = {str(f): sum(1 for i in ids if i.split("::")[0] == str(f)) for f in e2e_test_files()}
    empty = [f for f, n in per_file.items() if n == 0]
    assert per_file and not empty, f"no e2e test collected from {empty}; per file {per_file}\n{output(proc)}"


def test_e2e_tests_are_all_marked_e2e():
    """The default run (addopts `-m 'not e2e and not slow'`) deselects every test in e2e/."""
    proc = _collect("e2e")
    leaked = [i for i in _collected(proc) if i.startswith("e2e/")]
    assert not leaked, f"tests in e2e/ without the e2e marker (they would run without a cluster): {leaked}"
    assert proc.returncode in (0, 5) and "deselected" in proc.stdout, output(proc)
