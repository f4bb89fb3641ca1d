"""The example Spark job (spark/manifests) on the Kubeflow spark-operator, against a topic.

A producer Job sends tagged messages, waits past one window and sends a "closing" message (its
later store time closes every earlier window, as tests/spark/test_jobs.py does locally). The
SparkApplication runs spark/jobs/tag_counts.py with ``--available-now`` and ``--output-topic``,
so it completes by itself; a consumer Job reads the counts back from the output topic.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from e2e import spark
from e2e.install import Deployed
from e2e.jobs import LoadJobs
from e2e.k8s import Kube
from e2e.scenario import apply_topic, brief, record
from e2e.settings import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SENT = {"red": 70, "green": 40, "blue": 10}
CLOSING_TAG = "closing"
APP_TIMEOUT = 1200.0


@pytest.mark.timeout(3600)  # may also build the spark image (Apache Spark's is ~1 GB) and load it
def test_spark_application_counts_tags_into_an_output_topic(
        kube: Kube, tidemq: Deployed, load: LoadJobs, settings: Settings, spark_image: str,
        spark_operator: str, run_id: str) -> None:
    topic_in, topic_out = f"e2e-spark-in-{run_id}", f"e2e-spark-out-{run_id}"
    apply_topic(kube, tidemq, topic_in, queues=2)
    apply_topic(kube, tidemq, topic_out, queues=2)
    tags = ",".join(f"{tag}={n}" for tag, n in SENT.items())
    sent = load.produce(topic_in, run_id, 1, "--tags", tags, "--closing-tag", CLOSING_TAG,
                        "--closing-after", "2.5", "--concurrency", "4")
    assert sent["acked_count"] == sum(SENT.values()), brief(sent)
    assert "closing message not acknowledged" not in sent["errors"], brief(sent)

    app = f"tmq-tags-{run_id}"
    objects = spark.e2e_objects(
        spark.load_manifests(), namespace=tidemq.namespace, app=app, image=spark_image,
        claim=f"tmq-spark-{run_id}",
        name_servers=f"{tidemq.cluster}-namesrv.{tidemq.namespace}.svc:{tidemq.namesrv_port}",
        topic_in=topic_in, topic_out=topic_out)
    kube.apply(*objects)
    done = spark.wait_finished(kube, app, APP_TIMEOUT)
    state = done["status"]["applicationState"]
    assert state["state"] == "COMPLETED", state

    got = load.consume(topic_out, run_id, f"e2e-spark-{run_id}", "--print-bodies",
                       "--idle-seconds", "15", "--from-beginning")
    counts: Counter[str] = Counter()
    for text in got["bodies"]:
        row = json.loads(text)
        assert set(row) == {"window_start", "window_end", "tag", "count"}, row
        counts[row["tag"]] += row["count"]
    record(settings.artifacts, "spark", {"producer": brief(sent), "consumer": brief(got),
                                         "counts": dict(counts), "app": state})
    # every tagged message counted once; the closing message's window is still open
    assert dict(counts) == SENT
