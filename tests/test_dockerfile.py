"""Static checks of the container image recipe (Dockerfile, .dockerignore).

No Docker engine here: the e2e workflow builds the image. These tests read the Dockerfile with
dockerfile-parse (the parser the build tooling ecosystem uses) and check what a build would need:
the stages, a non-root user, the `tidemq` entrypoint, the OCI labels, that every COPY source exists
in the build context and is not excluded by .dockerignore, and that the dependency layer
(pyproject.toml) comes before the source tree.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

dockerfile_parse = pytest.importorskip("dockerfile_parse", reason="dockerfile-parse not installed")

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


@pytest.fixture(scope="module")
def parsed() -> dockerfile_parse.DockerfileParser:
    parser = dockerfile_parse.DockerfileParser(path=str(DOCKERFILE))
    parser.content = DOCKERFILE.read_text(encoding="utf-8")
    return parser


def stages(parsed) -> dict[str, list[dict]]:
    """Instructions grouped by stage name (``FROM ... AS name``)."""
    out: dict[str, list[dict]] = {}
    current = None
    for ins in parsed.structure:
        if ins["instruction"] == "FROM":
            words = ins["value"].split()
            current = words[2].lower() if len(words) >= 3 and words[1].lower() == "as" else words[0]
            out[current] = [ins]
        elif current is not None:
            out[current].append(ins)
    return out


def args(parsed) -> dict[str, str]:
    """Global ARG defaults (before the first FROM)."""
    out = {}
    for ins in parsed.structure:
        if ins["instruction"] == "FROM":
            break
        if ins["instruction"] == "ARG" and "=" in ins["value"]:
            k, v = ins["value"].split("=", 1)
            out[k.strip()] = v.strip()
    return out


def base_image(parsed, stage: str) -> str:
    image = stages(parsed)[stage][0]["value"].split()[0]
    return re.sub(r"\$\{(\w+)\}", lambda m: args(parsed)[m.group(1)], image)


def copies(instructions: list[dict]) -> list[tuple[list[str], str, bool]]:
    """(sources, destination, from_another_stage) of each COPY."""
    out = []
    for ins in instructions:
        if ins["instruction"] != "COPY":
            continue
        words = shlex.split(ins["value"])
        from_stage = any(w.startswith("--from=") for w in words)
        words = [w for w in words if not w.startswith("--")]
        out.append((words[:-1], words[-1], from_stage))
    return out


def test_stages(parsed) -> None:
    st = stages(parsed)
    assert list(st) == ["builder", "spark", "runtime"]  # runtime last: `docker build .` builds it
    assert base_image(parsed, "builder").startswith("python:3.11-slim")
    assert base_image(parsed, "runtime").startswith("python:3.11-slim")
    # an official Apache Spark image (Docker Official Image `spark` or Apache's `apache/spark`)
    spark = base_image(parsed, "spark")
    assert re.fullmatch(r"(apache/spark|spark):\d+\.\d+\.\d+[-\w.]*python3[-\w.]*", spark), spark


def test_runtime_is_non_root_with_tidemq_entrypoint(parsed) -> None:
    runtime = stages(parsed)["runtime"]
    users = [i["value"] for i in runtime if i["instruction"] == "USER"]
    assert users, "runtime stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid == "10001"
    entry = [i["value"] for i in runtime if i["instruction"] == "ENTRYPOINT"]
    assert json.loads(entry[-1]) == ["tidemq"]  # exec form: `docker run img broker ...`
    exposed = " ".join(i["value"] for i in runtime if i["instruction"] == "EXPOSE").split()
    assert {"9876", "10911"} <= set(exposed)
    useradd = " ".join(i["value"] for i in runtime if i["instruction"] == "RUN")
    assert "--uid 10001" in useradd
    # the spark stage gives the image back to Spark's own non-root user
    spark_users = [i["value"] for i in stages(parsed)["spark"] if i["instruction"] == "USER"]
    assert spark_users[-1] not in ("root", "0")


def test_oci_labels(parsed) -> None:
    labels = parsed.labels  # the last stage's (runtime) labels, ARGs substituted
    assert labels["org.opencontainers.image.title"] == "tidemq"
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    spark_labels = " ".join(i["value"] for i in stages(parsed)["spark"] if i["instruction"] == "LABEL")
    assert 'org.opencontainers.image.title="tidemq-spark"' in spark_labels
    runtime_labels = " ".join(i["value"] for i in stages(parsed)["runtime"] if i["instruction"] == "LABEL")
    for key in ("title", "description", "version", "revision", "created", "licenses", "source"):
        assert f"org.opencontainers.image.{key}=" in runtime_labels, key


def _ignored(path: str, patterns: list[str]) -> bool:
    path = path.rstrip("/")
    return any(fnmatch.fnmatch(path, p.rstrip("/")) or fnmatch.fnmatch(path, p.rstrip("/").removeprefix("**/"))
               for p in patterns)


def test_copy_sources_exist_and_are_not_ignored(parsed) -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    seen = 0
    for stage, instructions in stages(parsed).items():
        for sources, _dest, from_stage in copies(instructions):
            if from_stage:
                continue
            for src in sources:
                seen += 1
                assert (ROOT / src).exists(), f"{stage}: COPY {src} does not exist"
                assert not _ignored(src, patterns), f"{stage}: COPY {src} is excluded by .dockerignore"
    assert seen >= 5


def test_every_package_folder_is_copied(parsed) -> None:
    """The builder copies every folder that pyproject maps into the tidemq namespace."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    roots = {d.split("/")[0] for d in project["tool"]["setuptools"]["package-dir"].values()}
    copied = {s.rstrip("/") for sources, _, _ in copies(stages(parsed)["builder"]) for s in sources}
    assert roots <= copied, roots - copied
    assert project["project"]["readme"] in copied


def test_dependencies_before_source(parsed) -> None:
    builder = stages(parsed)["builder"]
    order = [(i["instruction"], i["value"]) for i in builder]
    first_pyproject = next(n for n, (ins, v) in enumerate(order) if ins == "COPY" and "pyproject.toml" in v)
    first_source = next(n for n, (ins, v) in enumerate(order) if ins == "COPY" and "tidemq/" in v)
    deps_install = next(n for n, (ins, v) in enumerate(order) if ins == "RUN" and "requirements.txt" in v
                        and "pip install" in v)
    assert first_pyproject < deps_install < first_source


def _runs(instructions: list[dict]) -> str:
    return "\n".join(i["value"] for i in instructions if i["instruction"] == "RUN")


def test_builder_compiles_the_extensions_and_checks_they_run(parsed) -> None:
    """Only the builder has a C compiler; it copies setup.py (which turns every .pyx into an
    extension) and fails unless `tidemq --version` reports every hot path compiled."""
    st = stages(parsed)
    builder = _runs(st["builder"])
    assert re.search(r"apt-get install [^&]*build-essential", builder), "the builder installs no C compiler"
    assert "setup.py" in {s for sources, _, _ in copies(st["builder"]) for s in sources}
    version_check = re.search(r"tidemq --version[^&]*> (\S+)[\s\S]*grep -q \"hot paths: compiled extensions\" \1",
                              builder)
    assert version_check, "the builder does not check that the image runs its compiled extensions"
    # the pip install that builds the wheel comes before the check
    assert builder.index("pip wheel") < builder.index("tidemq --version")
    for stage in ("runtime", "spark"):
        assert "build-essential" not in _runs(st[stage]), f"{stage} must not carry a compiler"


def test_dockerignore_keeps_locally_built_extensions_out() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert _ignored("tidemq/remoting/_frame_c.cpython-311-x86_64-linux-gnu.so", patterns)


def test_dockerignore_excludes_local_state() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for path in (".git", ".venv", ".venv-helm", ".pytest_cache", ".hypothesis", "tidemq-data",
                 "services/broker/__pycache__"):
        assert _ignored(path, patterns), path
    for path in ("tidemq", "services", "operator", "crds", "pyproject.toml", "README.md"):
        assert not _ignored(path, patterns), path
