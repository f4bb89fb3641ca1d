"""spark/manifests/: the tag-counts SparkApplication and what it needs, checked offline.

- Schemas: the SparkApplication against the Kubeflow spark-operator's CRD (v1beta2
  openAPIV3Schema) in ../shared/thirdparty-crds/ (used from there, never copied; skipped with a
  reason when absent), the PodMonitor against the Prometheus operator's CRD and the built-in kinds
  with kubernetes-validate, through the chart tests' ``validate_object``.
- Agreement with the rest of the repository, which a schema cannot see: the job file, the JMX
  exporter jar and the Python the SparkApplication names exist in the image the Dockerfile's
  ``spark`` stage builds; sparkVersion is that image's Spark; the image name follows the chart's;
  the arguments parse with the job's own parser, put the checkpoint and output on the
  PersistentVolumeClaim of this folder mounted in driver and executors, and name the Service the
  operator creates for the chart's Cluster; a streaming restart policy; RBAC for the driver's
  ServiceAccount; the PodMonitor selects the pods on the port the operator opens.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import posixpath
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath

import pytest

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")
dockerfile_parse = pytest.importorskip("dockerfile_parse", reason="dockerfile-parse not installed")

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "spark" / "manifests"
THIRDPARTY_CRDS = ROOT.parent / "shared" / "thirdparty-crds"
SPARK_CRD = THIRDPARTY_CRDS / "sparkoperator.k8s.io_sparkapplications.yaml"
CHART = ROOT / "charts" / "tidemq"


# -- loading ------------------------------------------------------------------------------------

def load_docs() -> list[tuple[Path, dict]]:
    out = []
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                out.append((path, doc))
    return out


DOCS = load_docs()


def by_kind(kind: str) -> list[dict]:
    return [d for _, d in DOCS if d["kind"] == kind]


def one(kind: str) -> dict:
    objs = by_kind(kind)
    assert len(objs) == 1, f"expected one {kind} in spark/manifests, found {len(objs)}"
    return objs[0]


@pytest.fixture(scope="module")
def app() -> dict:
    return one("SparkApplication")


@pytest.fixture(scope="module")
def job():
    spec = importlib.util.spec_from_file_location("tag_counts_job", ROOT / "spark" / "jobs" / "tag_counts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def args(app, job):
    """The SparkApplication's arguments, parsed by the job's own argument parser."""
    return job.parser().parse_args(app["spec"]["arguments"])


# -- the Dockerfile's spark stage ------------------------------------------------------------------

@pytest.fixture(scope="module")
def spark_stage() -> list[dict]:
    parser = dockerfile_parse.DockerfileParser(path=str(ROOT / "Dockerfile"))
    parser.content = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    stage, current = [], None
    for ins in parser.structure:
        if ins["instruction"] == "FROM":
            words = ins["value"].split()
            current = words[2].lower() if len(words) >= 3 and words[1].lower() == "as" else words[0]
            if current == "spark":
                stage.append(ins)
        elif current == "spark":
            stage.append(ins)
    assert stage, "the Dockerfile has no `spark` stage"
    return stage


@pytest.fixture(scope="module")
def dockerfile_args() -> dict[str, str]:
    """Every ARG default in the Dockerfile (global and per stage; names are unique here)."""
    out = {}
    for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        m = re.match(r"\s*ARG\s+(\w+)=(\S+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _subst(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), text)


def image_files(spark_stage, values) -> dict[str, Path | str]:
    """Paths the spark stage puts into the image: dest dir -> source dir for COPY from the build
    context, dest file -> URL for ADD of a URL (files from other stages are left out)."""
    out: dict[str, Path | str] = {}
    for ins in spark_stage:
        if ins["instruction"] not in ("COPY", "ADD"):
            continue
        words = shlex.split(_subst(ins["value"], values))
        if any(w.startswith("--from=") for w in words):
            continue
        words = [w for w in words if not w.startswith("--")]
        *sources, dest = words
        for src in sources:
            out[dest] = src if re.match(r"https?://", src) else ROOT / src
    return out


def in_image(path: str, spark_stage, values) -> Path | str | None:
    """Where ``path`` inside the image comes from (a repository file or a URL), or None."""
    for dest, src in image_files(spark_stage, values).items():
        if isinstance(src, str):
            if path == dest:
                return src
        elif dest.endswith("/") and path.startswith(dest):
            candidate = src / posixpath.relpath(path, dest)
            if candidate.is_file():
                return candidate
    return None


def env(spark_stage, values) -> dict[str, str]:
    out = {}
    for ins in spark_stage:
        if ins["instruction"] == "ENV":
            for word in shlex.split(_subst(ins["value"], values)):
                if "=" in word:
                    k, v = word.split("=", 1)
                    out[k] = v
    return out


# -- schemas -------------------------------------------------------------------------------------

@functools.cache
def _spark_application_validator():
    from tidemq.operator import crds  # noqa: PLC0415

    crd = yaml.safe_load(SPARK_CRD.read_text(encoding="utf-8"))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta2")
    return jsonschema.Draft7Validator(crds.to_json_schema(version["schema"]["openAPIV3Schema"]))


def spark_application_validator():
    if not SPARK_CRD.exists():
        pytest.skip(f"{SPARK_CRD} is missing (the spark-operator's CRD is kept outside the "
                    "repository, in ../shared/thirdparty-crds/)")
    return _spark_application_validator()


def validate(obj: dict) -> None:
    """Validate one object as an API server would (raises AssertionError)."""
    if obj["apiVersion"] == "sparkoperator.k8s.io/v1beta2":
        validator = spark_application_validator()
        problems = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
        assert problems == [], f"{obj['kind']}/{obj['metadata']['name']}: {problems}"
    else:
        from tests.charts.test_chart import validate_object  # noqa: PLC0415 (ServiceMonitor/PodMonitor, built-ins)
        validate_object(obj)


def test_folder_holds_the_expected_objects() -> None:
    kinds = sorted(d["kind"] for _, d in DOCS)
    assert kinds == sorted(["SparkApplication", "PersistentVolumeClaim", "ServiceAccount", "Role",
                            "RoleBinding", "PodMonitor"])
    namespaces = {d["metadata"].get("namespace") for _, d in DOCS}
    assert namespaces == {one("SparkApplication")["metadata"]["namespace"]}  # all in one namespace


@pytest.mark.parametrize("index", range(len(DOCS)), ids=[f"{p.name}:{d['kind']}" for p, d in DOCS])
def test_objects_are_valid(index) -> None:
    validate(DOCS[index][1])


def test_validation_catches_a_bad_spark_application(app) -> None:
    for path, value in [(("type",), "Pyton"), (("restartPolicy", "onFailureRetries"), "ten"),
                        (("monitoring", "prometheus", "port"), 80), (("executor", "instances"), 0),
                        (("driver", "volumeMounts"), {"name": "data"})]:
        bad = copy.deepcopy(app)
        node = bad["spec"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(AssertionError):
            validate(bad)
    bad = copy.deepcopy(app)
    del bad["spec"]["mainApplicationFile"]  # required
    with pytest.raises(AssertionError):
        validate(bad)


# -- agreement with the image ----------------------------------------------------------------------

def test_main_application_file_is_the_job_in_the_image(app, spark_stage, dockerfile_args) -> None:
    main = app["spec"]["mainApplicationFile"]
    assert main.startswith("local:///"), "the job ships in the image: use a local:// URI"
    path = main.removeprefix("local://")
    source = in_image(path, spark_stage, dockerfile_args)
    assert source == ROOT / "spark" / "jobs" / "tag_counts.py", \
        f"{path} is not put into the image by the Dockerfile's spark stage (COPY spark/jobs/ ...)"
    assert app["spec"]["type"] == "Python" and app["spec"]["mode"] == "cluster"


def test_image_and_spark_version_match_the_dockerfile(app, dockerfile_args) -> None:
    spark_image = dockerfile_args["SPARK_IMAGE"]  # e.g. apache/spark:4.0.0-python3
    version = re.search(r":(\d+\.\d+\.\d+)", spark_image).group(1)
    assert app["spec"]["sparkVersion"] == version
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    expected = f"{values['image']['repository']}-spark:{chart['appVersion']}"
    assert app["spec"]["image"] == expected
    assert dockerfile_args["VERSION"] == chart["appVersion"]


def test_python_and_dependencies_are_in_the_image(app, spark_stage, dockerfile_args) -> None:
    """PySpark runs the image's tidemq virtual environment, which has the spark extra's
    dependencies (all but pyspark itself, which the Spark image provides)."""
    image_env = env(spark_stage, dockerfile_args)
    conf = app["spec"]["sparkConf"]
    assert conf["spark.pyspark.python"] == image_env["PYSPARK_PYTHON"]
    assert conf["spark.pyspark.driver.python"] == image_env["PYSPARK_DRIVER_PYTHON"]
    venv = str(PurePosixPath(image_env["PYSPARK_PYTHON"]).parents[1])
    runs = " ".join(i["value"] for i in spark_stage if i["instruction"] == "RUN")
    assert f"-m venv {venv}" in runs
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["spark"]
    for req in extra:
        name = re.match(r"[A-Za-z0-9_.-]+", req).group(0)
        if name.lower() != "pyspark":
            assert re.search(rf"{venv}/bin/pip install [^&]*\b{re.escape(name)}\b", runs), \
                f"the spark stage does not install {name} into {venv}"


def test_monitoring_loads_the_jmx_exporter_the_image_has(app, spark_stage, dockerfile_args) -> None:
    mon = app["spec"]["monitoring"]
    assert mon["exposeDriverMetrics"] is True and mon["exposeExecutorMetrics"] is True
    jar = mon["prometheus"]["jmxExporterJar"]
    source = in_image(jar, spark_stage, dockerfile_args)
    assert isinstance(source, str) and re.search(r"/jmx_prometheus_javaagent-[\d.]+\.jar$", source), \
        f"{jar} is not added to the image by the Dockerfile's spark stage"
    assert app["spec"]["sparkConf"].get("spark.sql.streaming.metricsEnabled") == "true"


# -- the job's arguments ---------------------------------------------------------------------------

def test_arguments_run_a_streaming_query(args) -> None:
    assert not args.available_now, "the SparkApplication is a streaming job: it must not stop by itself"
    assert args.output or args.output_topic


def mounted_claim(spec: dict, role: str, path: str) -> str | None:
    """The PersistentVolumeClaim mounted at (a parent of) ``path`` in the driver or executor."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for mount in spec[role].get("volumeMounts", []):
        if path == mount["mountPath"] or path.startswith(mount["mountPath"].rstrip("/") + "/"):
            claim = volumes.get(mount["name"], {}).get("persistentVolumeClaim")
            if claim and not mount.get("readOnly"):
                return claim["claimName"]
    return None


def test_checkpoint_and_output_live_on_the_claim(app, args) -> None:
    spec = app["spec"]
    claims = {p["metadata"]["name"]: p for p in by_kind("PersistentVolumeClaim")}
    paths = [args.checkpoint] + ([args.output] if args.output else [])
    for path in paths:
        assert PurePosixPath(path).is_absolute(), path
        for role in ("driver", "executor"):  # the driver logs offsets, executors write state and files
            claim = mounted_claim(spec, role, path)
            assert claim is not None, f"{path} is not on a writable PersistentVolumeClaim in the {role}"
            assert claim in claims, f"PersistentVolumeClaim {claim} is not in spark/manifests"
            assert "ReadWriteMany" in claims[claim]["spec"]["accessModes"], \
                "driver and executors mount the claim from any node: it must be ReadWriteMany"
    assert args.checkpoint != args.output


def test_name_servers_are_the_operators_service_for_the_charts_cluster(app, args) -> None:
    from tidemq.operator import workloads  # noqa: PLC0415

    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))["cluster"]
    ns = app["metadata"]["namespace"]
    cluster = {"apiVersion": "tidemq.io/v1alpha1", "kind": "Cluster",
               "metadata": {"name": values["name"], "namespace": ns, "uid": "u"},
               "spec": {"nameServers": {"replicas": values["nameServers"]["replicas"],
                                        "port": values["nameServers"]["port"]}}}
    services = {o["metadata"]["name"]: o for o in workloads.desired_objects(cluster) if o["kind"] == "Service"}
    name = workloads.namesrv_name(values["name"])
    port = next(p["port"] for p in services[name]["spec"]["ports"] if p["name"] == "remoting")
    assert services[name]["spec"].get("clusterIP") != "None"  # one stable address for clients
    assert args.name_servers == f"{name}.{ns}.svc:{port}"


# -- restart, RBAC, monitoring ---------------------------------------------------------------------

def test_restart_policy_restarts_the_stream(app) -> None:
    policy = app["spec"]["restartPolicy"]
    assert policy["type"] in ("Always", "OnFailure"), "a streaming query must be restarted"
    if policy["type"] == "OnFailure":
        assert policy["onFailureRetries"] >= 1 and policy["onSubmissionFailureRetries"] >= 1
        assert policy["onFailureRetryInterval"] >= 1 and policy["onSubmissionFailureRetryInterval"] >= 1


def test_driver_service_account_may_manage_executors(app) -> None:
    sa = one("ServiceAccount")["metadata"]["name"]
    assert app["spec"]["driver"]["serviceAccount"] == sa
    role, binding = one("Role"), one("RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert {"kind": "ServiceAccount", "name": sa, "namespace": app["metadata"]["namespace"]} in binding["subjects"]
    granted: dict[str, set[str]] = {}
    for rule in role["rules"]:
        if "" in rule["apiGroups"]:
            for res in rule["resources"]:
                granted.setdefault(res, set()).update(rule["verbs"])
    for res in ("pods", "services", "configmaps", "persistentvolumeclaims"):
        missing = {"create", "delete", "get", "list", "watch"} - granted.get(res, set())
        assert not missing, f"the driver cannot {sorted(missing)} {res}"


def test_pod_monitor_scrapes_the_jmx_exporter_port(app) -> None:
    pm = one("PodMonitor")
    prom = app["spec"]["monitoring"]["prometheus"]
    assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == [prom.get("portName", "jmx-exporter")]
    selector = pm["spec"]["selector"]["matchLabels"]
    for role in ("driver", "executor"):
        labels = app["spec"][role].get("labels", {})
        assert selector.items() <= labels.items(), f"the PodMonitor does not select the {role} pods"
