"""docs/metrics.md against what each component's /metrics really exports.

The doc's tables are parsed (one section per component: its families, their type and labels, the
labels its heading gives every row, and whether it says the counters carry ``<name>_created``
series) and compared both ways with a scrape of a component that was made to export everything:

- name server and broker: a real pair of processes (tests/procs.py ``Cluster``), the broker with
  ``--metrics-queue-lag`` and a 100 ms delay table, after a send, a pull, a committed offset, a
  refused request, a retry (CONSUMER_SEND_MSG_BACK, delivered to ``%RETRY%<group>`` after its delay
  level) and a dead letter;
- operator: ``tidemq operator`` against kmock's emulator (the fixtures of
  tests/operator/test_operator_integration.py) after it reconciled an external Cluster and a Topic
  of a Cluster that does not exist;
- ``tidemq local --metrics-queue-lag`` exports the per-queue lag.

The standard ``process_``/``python_`` collectors would be allowed undocumented; no component
registers them today.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.operator.conftest import kube  # noqa: F401 (fixture)
from tests.operator.test_operator_integration import (  # noqa: F401 (fixtures)
    Operator, condition, create, emulator, external, get, mount_master_key,
)
from tests.procs import Cluster, ServerProcess, free_port, tidemq_cmd
from tidemq.client import SyncProducer, SyncPullConsumer
from tidemq.client.push.protocol import build_send_back
from tidemq.message import Message
from tidemq.remoting import RemotingClient, RemotingCommand, ResponseCode

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
STANDARD = ("process_", "python_")  # prometheus_client's default collectors: the doc may name them as a group
TOPIC = "MetricsDocT"
GROUP = "metrics-doc-g"
SHORT_DELAYS = " ".join(["100ms"] * 18)  # the retry's level 3 is due at once
WAIT = 30.0


# the doc ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Documented:
    type: str  # counter, gauge, histogram, summary
    labels: frozenset[str]


@dataclass(slots=True)
class Section:
    title: str
    families: dict[str, Documented] = field(default_factory=dict)
    created: bool = False  # counters and histograms carry <name>_created series


def _ticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def _without_parens(text: str) -> str:
    """A labels cell without its explanations: "`code` (ResponseCode name, e.g. `X`)" -> "`code` "."""
    while True:
        shorter = re.sub(r"\([^()]*\)", "", text)
        if shorter == text:
            return text
        text = shorter


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def parse_doc(text: str) -> dict[str, Section]:
    """Sections with a metric table, keyed by the name prefix their heading gives (`tidemq_broker_*`)."""
    sections: dict[str, Section] = {}
    for chunk in re.split(r"^## ", text, flags=re.M)[1:]:
        heading, _, body = chunk.partition("\n")
        prefixes = [t[:-1] for t in _ticked(heading) if t.endswith("_*")]
        rows = [line for line in body.splitlines() if line.startswith("|")]
        if not prefixes or not rows:
            continue
        common = frozenset(_ticked(heading.split(" labels ", 1)[1])) if " labels " in heading else frozenset()
        header = [h.lower() for h in _cells(rows[0])]
        type_col = header.index("type")
        label_cols = [i for i, h in enumerate(header) if "labels" in h]
        mentions = re.search(r"([^.]*)`<name>_created`", body)
        section = Section(heading.strip(), created=mentions is not None
                          and not re.search(r"\bno\b", mentions.group(1), re.I))
        for row in rows[2:]:  # after the header and the |---| line
            cells = _cells(row)
            kind = cells[type_col].split()[0]
            labels = common | frozenset(
                _ticked(_without_parens(cells[label_cols[0]])) if label_cols else ())
            for name in _ticked(cells[0]):
                assert name.startswith(prefixes[0]), f"{name} is listed under '{heading}'"
                assert name not in section.families, f"{name} is listed twice"
                section.families[name] = Documented(kind, labels)
        sections[prefixes[0]] = section
    return sections


def doc_section(prefix: str) -> Section:
    sections = parse_doc(DOC.read_text())
    assert prefix in sections, f"docs/metrics.md has no table of {prefix}* (sections: {sorted(sections)})"
    return sections[prefix]


def test_the_doc_parser_reads_names_types_labels_and_the_created_rule():
    text = """
## Thing (`tidemq_thing_*`, labels `cluster`, `broker`)

| metric | type | extra labels | meaning |
|---|---|---|---|
| `tidemq_thing_a_total` | counter | `code` (name, e.g. `X` (nested)) | a |
| `tidemq_thing_b`, `tidemq_thing_c` | summary (`_count`, `_sum`) | | b and `c` |

No `<name>_created` series.

## Other (`tidemq_other_*`)

| metric | type | meaning |
|---|---|---|
| `tidemq_other_d` | histogram | d |

Its histogram also carries `<name>_created` series.

## Health endpoints

Nothing here.
"""
    s = parse_doc(text)
    assert set(s) == {"tidemq_thing_", "tidemq_other_"}
    assert s["tidemq_thing_"].families == {
        "tidemq_thing_a_total": Documented("counter", frozenset({"cluster", "broker", "code"})),
        "tidemq_thing_b": Documented("summary", frozenset({"cluster", "broker"})),
        "tidemq_thing_c": Documented("summary", frozenset({"cluster", "broker"})),
    }
    assert not s["tidemq_thing_"].created
    assert s["tidemq_other_"].families == {"tidemq_other_d": Documented("histogram", frozenset())}
    assert s["tidemq_other_"].created


# the endpoints ------------------------------------------------------------------------------------
@dataclass(slots=True)
class Exported:
    type: str
    labels: set[str]  # label names of its samples (le and quantile apart)
    samples: int  # apart from _created
    created: int  # <name>_created samples


def scrape(url: str) -> dict[str, Exported]:
    """Families by their documented name (a counter's with `_total`). In the Prometheus text format
    prometheus_client writes a counter's or histogram's ``<name>_created`` series as a gauge family
    of its own: it is counted as that family's ``created`` series (the doc states it as a rule)."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, Exported] = {}
    for fam in text_string_to_metric_families(text):
        created = [s for s in fam.samples if s.name == fam.name + "_created"]
        samples = [s for s in fam.samples if s.name != fam.name + "_created"]
        labels = {k for s in samples for k in s.labels} - {"le", "quantile"}
        out[fam.name + ("_total" if fam.type == "counter" else "")] = Exported(
            fam.type, labels, len(samples), len(created))
    for name in [n for n, e in out.items() if n.endswith("_created") and e.type == "gauge"]:
        base = name.removesuffix("_created")
        parent = out.get(base + "_total") or out.get(base)
        if parent is not None and parent.type in ("counter", "histogram", "summary"):
            parent.created += out.pop(name).samples
    return out


def differences(section: Section, exported: dict[str, Exported]) -> list[str]:
    """What the doc says and the endpoint does not do, and the reverse (empty when they agree)."""
    out = []
    for name, doc in sorted(section.families.items()):
        e = exported.get(name)
        if e is None or not e.samples:
            out.append(f"{name}: documented, but {'not exported' if e is None else 'exported without series'}")
        elif e.type != doc.type:
            out.append(f"{name}: documented as a {doc.type}, exported as a {e.type}")
        elif e.labels != doc.labels:
            out.append(f"{name}: documented with labels {sorted(doc.labels)}, exported with {sorted(e.labels)}")
    for name, e in sorted(exported.items()):
        if name not in section.families and not name.startswith(STANDARD):
            out.append(f"{name}: exported ({e.type}), not in the table of '{section.title}'")
        elif e.created and not section.created:
            out.append(f"{name}: exports {name.removesuffix('_total')}_created series, which the doc says "
                       "this component does not")
        elif section.created and e.samples and e.type in ("counter", "histogram") and not e.created:
            out.append(f"{name}: the doc says counters and histograms carry <name>_created series; it has none")
    return out


def wait_for_differences(section: Section, url: str) -> list[str]:
    """The differences once the endpoint has caught up (events show up within WAIT), else the last."""
    deadline = time.monotonic() + WAIT
    while True:
        diff = differences(section, scrape(url))
        if not diff or time.monotonic() > deadline:
            return diff
        time.sleep(0.2)


# name server and broker ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The name server and broker of this module (also the operator's external Cluster)."""
    c = Cluster(tmp_path_factory.mktemp("metrics-doc"),
                extra_broker_args=["--metrics-queue-lag", "--delay-levels", SHORT_DELAYS])
    try:
        c.start()
    except Exception:
        c.stop()
        raise
    yield c
    c.stop()


async def _send_back_and_refuse(addr: str, retry, dead) -> list[int]:
    """One retry, one dead letter (delay level -1) and one unsupported request code."""
    client = RemotingClient()
    try:
        return [(await client.invoke(addr, cmd, 5)).code for cmd in (
            build_send_back(retry, GROUP, 0, 16),
            build_send_back(dead, GROUP, -1, 16),
            RemotingCommand.request(9999, {}),
        )]
    finally:
        await client.close()


@pytest.fixture(scope="module")
def exercised(cluster):
    """The cluster after everything that makes a family appear."""
    cluster.create_topic(TOPIC, queues=1)
    with SyncProducer("metrics-doc-pg", cluster.namesrv_addr) as producer:
        for i in range(3):
            producer.send(Message(TOPIC, f"m{i}".encode()))
    with SyncPullConsumer(GROUP, cluster.namesrv_addr) as consumer:
        [mq] = consumer.fetch_queues(TOPIC)
        got = consumer.pull(mq, 0, max_nums=3).messages
        assert len(got) == 3
        consumer.commit(mq, 1)
    codes = asyncio.run(_send_back_and_refuse(cluster.broker_addr, got[1], got[2]))
    assert codes == [ResponseCode.SUCCESS, ResponseCode.SUCCESS, ResponseCode.REQUEST_CODE_NOT_SUPPORTED]
    return cluster


def test_broker_exports_exactly_the_documented_families(exercised):
    diff = wait_for_differences(doc_section("tidemq_broker_"), exercised.metrics_url)
    assert not diff, "docs/metrics.md and the broker's /metrics disagree:\n" + "\n".join(diff)


def test_name_server_exports_exactly_the_documented_families(exercised):
    url = f"http://127.0.0.1:{exercised.namesrv_metrics_port}/metrics"
    diff = wait_for_differences(doc_section("tidemq_namesrv_"), url)
    assert not diff, "docs/metrics.md and the name server's /metrics disagree:\n" + "\n".join(diff)


def test_per_queue_lag_is_documented_as_needing_the_option():
    [row] = [line for line in DOC.read_text().splitlines()
             if line.startswith("| `tidemq_broker_consumer_queue_lag_messages`")]
    assert "--metrics-queue-lag" in row and "tidemq local" in row


def test_local_exports_per_queue_lag_with_the_option(tmp_path):
    ns_port, broker_port, metrics_port = free_port(), free_port(), free_port()
    local = ServerProcess(
        tidemq_cmd("local", "--data", str(tmp_path / "data"), "--namesrv-port", str(ns_port),
                   "--broker-port", str(broker_port), "--metrics-port", str(metrics_port),
                   "--segment-size", str(4 << 20), "--metrics-queue-lag"),
        tmp_path / "local.log", f"http://127.0.0.1:{metrics_port}/readyz",
    ).start()
    try:
        ns = f"127.0.0.1:{ns_port}"
        r = subprocess.run(tidemq_cmd("admin", "updateTopic", "-n", ns, "-c", "DefaultCluster", "-t", TOPIC,
                                      "-r", "1", "-w", "1"), capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr.decode()
        with SyncProducer("metrics-doc-local-pg", ns) as producer:
            for i in range(2):
                producer.send(Message(TOPIC, f"m{i}".encode()))
        with SyncPullConsumer(GROUP, ns) as consumer:
            [mq] = consumer.fetch_queues(TOPIC)
            consumer.commit(mq, 1)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        local.stop()
    lag = [s for fam in text_string_to_metric_families(text) for s in fam.samples
           if s.name == "tidemq_broker_consumer_queue_lag_messages"]
    assert [(s.labels["group"], s.labels["topic"], s.labels["queue"], s.value) for s in lag] == \
        [(GROUP, TOPIC, "0", 1.0)], local.log()[-3000:]


# operator -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def operator(emulator, cluster, kube, tmp_path_factory):
    """As tests/operator's fixture, with prometheus_client's default environment (the doc's)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PROMETHEUS_DISABLE_CREATED_SERIES", raising=False)
        op = Operator(tmp_path_factory.mktemp("operator"), emulator.url).start()
    try:
        op.master_key = mount_master_key(kube, op)
        yield op
    finally:
        op.stop()


@pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")
def test_operator_exports_exactly_the_documented_families(kube, operator, external):
    # a Cluster reconciled (reconciles, reconcile_seconds, managed) and a Topic retried (errors)
    name = "orphan-" + uuid.uuid4().hex[:6]
    create(kube, "Topic", name, {"clusterRef": {"name": "nowhere"}})
    deadline = time.monotonic() + WAIT
    while condition(get(kube, "Topic", name), "Ready").get("reason") != "ClusterNotFound":
        assert time.monotonic() < deadline, f"no ClusterNotFound condition\n{operator.log()}"
        time.sleep(0.2)
    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
    diff = wait_for_differences(doc_section("tidemq_operator_"), url)
    assert not diff, "docs/metrics.md and the operator's /metrics disagree:\n" + "\n".join(diff)
