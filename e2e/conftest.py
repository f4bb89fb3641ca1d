"""Session fixtures of the kind e2e suite, and the failure dumps.

Order of the session setup (each step bounded, see the modules it calls):
1. ``tools``: docker (with an engine), kind, kubectl, helm, else every test is skipped with one
   line saying what is missing and where to install it;
2. ``built_image``: ``docker build -t tidemq:e2e .`` (or tag TIDEMQ_E2E_IMAGE so), before any
   cluster exists so that a broken Dockerfile fails fast;
3. ``kind_cluster``: create (or, with TIDEMQ_E2E_REUSE=1, reuse) the kind cluster, then
   ``tidemq_image``: ``docker save`` + ``kind load image-archive`` (e2e/kind.py says why); the cluster is deleted at the end unless
   TIDEMQ_E2E_KEEP=1 or TIDEMQ_E2E_REUSE=1;
4. ``tidemq``: ``helm upgrade --install`` charts/tidemq with e2e/values-e2e.yaml, the tmqload
   ConfigMap, then the Cluster Ready with every pod ready.

The Spark scenario first checks that Helm can fetch the spark-operator chart (``spark_chart``) and
is skipped with the reason when it cannot, before its image is built.

Before each test the Cluster must be Ready again (an earlier scenario may have restarted brokers).
When a test fails (setup included), pod logs (every container, ``--previous`` too), events and the
custom resources go into the pytest report and into TIDEMQ_E2E_ARTIFACTS/<test>/.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e import diagnostics, install, kind, spark
from e2e.install import Deployed
from e2e.jobs import LoadJobs
from e2e.k8s import Kube
from e2e.settings import IMAGE, SPARK_IMAGE, Settings
from e2e.tools import missing_tools

log = logging.getLogger(__name__)

E2E_ROOT = Path(__file__).resolve().parent
KUBE_KEY = pytest.StashKey[Kube]()
NAMESPACES_KEY = pytest.StashKey[list[str]]()
SETTINGS_KEY = pytest.StashKey[Settings]()
SETUP_DUMPED_KEY = pytest.StashKey[bool]()
# cheap and telling first, disruptive last (an image change or a broker restart is slow to settle)
ORDER = ("test_cluster", "test_topics", "test_messages", "test_groups", "test_metrics",
         "test_broker_restart", "test_replication", "test_rollout", "test_spark")
PER_TEST_READY_TIMEOUT = 420.0


# -- collection -----------------------------------------------------------------------------------

def _in_e2e(item: pytest.Item) -> bool:
    return E2E_ROOT in Path(str(item.path)).resolve().parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    timeout = Settings.from_env().test_timeout
    for item in items:
        if _in_e2e(item) and item.get_closest_marker("timeout") is None:
            # the default 300 s is too short: the first test also builds images and a cluster
            item.add_marker(pytest.mark.timeout(timeout))

    def rank(item: pytest.Item) -> int:
        if not _in_e2e(item):
            return -1  # other suites run in the same session keep their place, first
        stem = Path(str(item.path)).stem
        return ORDER.index(stem) if stem in ORDER else len(ORDER)

    items.sort(key=rank)  # stable: tests keep their order within a module


# -- failure dumps --------------------------------------------------------------------------------

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not report.failed or not _in_e2e(item) or call.excinfo is None:
        return
    if call.excinfo.errisinstance(pytest.skip.Exception):
        return
    kube = item.config.stash.get(KUBE_KEY, None)
    settings = item.config.stash.get(SETTINGS_KEY, None)
    if kube is None or settings is None:
        return
    if report.when == "setup":  # a failed session fixture fails every later test's setup: dump once
        if item.config.stash.get(SETUP_DUMPED_KEY, False):
            return
        item.config.stash[SETUP_DUMPED_KEY] = True
    dest = settings.artifacts / re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{item.nodeid}-{report.when}")
    text = diagnostics.collect(kube, item.config.stash.get(NAMESPACES_KEY, [kube.namespace]), dest)
    report.sections.append(("e2e diagnostics", text))


# -- session --------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def settings(pytestconfig: pytest.Config) -> Settings:
    s = Settings.from_env()
    s.artifacts.mkdir(parents=True, exist_ok=True)
    pytestconfig.stash[SETTINGS_KEY] = s
    return s


@pytest.fixture(scope="session")
def tools() -> None:
    problem = missing_tools()
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="session")
def kind_cluster(built_image: str, settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The kind cluster; yields the path of its own kubeconfig file."""
    name = settings.cluster_name
    if settings.reuse and kind.exists(name):
        log.info("reusing kind cluster %s", name)
    else:
        if kind.exists(name):
            pytest.fail(f"a kind cluster named {name!r} already exists: delete it "
                        f"(`kind delete cluster --name {name}`), set TIDEMQ_E2E_REUSE=1 to use it, "
                        "or pick another name with TIDEMQ_E2E_CLUSTER", pytrace=False)
        kind.create(name, settings.node_image, settings.artifacts)
    try:
        yield kind.write_kubeconfig(name, tmp_path_factory.mktemp("kube") / "kubeconfig")
    finally:
        if settings.delete_cluster_at_end:
            kind.delete(name)
        else:
            log.warning("kept kind cluster %s (kubectl --context kind-%s ...)", name, name)


def _build(tag: str, prebuilt: str | None, artifacts: Path, target: str | None = None) -> str:
    """``tag`` in the local Docker engine: built from the Dockerfile, or the prebuilt image retagged."""
    if prebuilt:
        if not kind.docker_image_exists(prebuilt):
            pytest.fail(f"the prebuilt image {prebuilt!r} is not in the local Docker engine", pytrace=False)
        kind.docker_tag(prebuilt, tag)
    else:
        kind.docker_build(tag, artifacts, target=target)
    return tag


@pytest.fixture(scope="session")
def built_image(tools: None, settings: Settings) -> str:
    """Built before the cluster exists, so a broken Dockerfile fails fast."""
    return _build(IMAGE, settings.prebuilt_image, settings.artifacts)


@pytest.fixture(scope="session")
def tidemq_image(built_image: str, kind_cluster: Path, settings: Settings) -> str:
    kind.load_image(settings.cluster_name, built_image)
    return built_image


@pytest.fixture(scope="session")
def kube(kind_cluster: Path, settings: Settings, pytestconfig: pytest.Config) -> Kube:
    k = Kube(kind_cluster, settings.namespace)
    pytestconfig.stash[KUBE_KEY] = k
    pytestconfig.stash[NAMESPACES_KEY] = [settings.namespace]
    return k


@pytest.fixture(scope="session")
def tidemq(kube: Kube, tidemq_image: str, settings: Settings) -> Deployed:
    install.helm_install(kube, settings.artifacts)
    cluster = install.wait_cluster_ready(kube)
    return install.deployed(kube, cluster)


@pytest.fixture(scope="session")
def load(kube: Kube, tidemq: Deployed, tidemq_image: str) -> LoadJobs:
    jobs = LoadJobs(kube, tidemq_image, tidemq.name_servers)
    jobs.install()
    return jobs


@pytest.fixture(scope="session")
def spark_chart(tools: None, settings: Settings) -> None:
    """Skips the Spark scenario, saying why, when the spark-operator chart cannot be fetched."""
    problem = spark.chart_problem(settings.spark_operator_version)
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="session")
def spark_image(spark_chart: None, kind_cluster: Path, settings: Settings) -> str:
    image = _build(SPARK_IMAGE, settings.prebuilt_spark_image, settings.artifacts, target="spark")
    kind.load_image(settings.cluster_name, image)
    return image


@pytest.fixture(scope="session")
def spark_operator(spark_chart: None, kube: Kube, tidemq: Deployed, settings: Settings,
                   pytestconfig: pytest.Config) -> str:
    spark.install_operator(kube, settings.spark_operator_version, kube.namespace, settings.artifacts,
                           wait=install.helm_wait_flag(kube))
    pytestconfig.stash[NAMESPACES_KEY] = [kube.namespace, spark.OPERATOR_NAMESPACE]
    return spark.OPERATOR_NAMESPACE


# -- per test -------------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def cluster_ready(request: pytest.FixtureRequest) -> None:
    """Every e2e test starts with the Cluster Ready and its pods ready."""
    if request.node.get_closest_marker("e2e") is None:
        return
    kube: Kube = request.getfixturevalue("kube")
    request.getfixturevalue("tidemq")
    install.wait_cluster_ready(kube, PER_TEST_READY_TIMEOUT)


@pytest.fixture
def run_id() -> str:
    """A short unique suffix for the names a test creates (topics, groups, Jobs)."""
    return secrets.token_hex(3)
