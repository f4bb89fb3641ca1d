"""Permissive TLS does not disturb real RocketMQ clients (matrix row S3): the RocketMQ C++ client
(plaintext; it has no TLS) sends through a name server and a broker in permissive mode, and TideMQ's
client reads the same messages over TLS from the same ports."""

from __future__ import annotations

import pytest
import trustme

from tests.interop.test_cpp_client import cpp, topic_name  # skips this module without the wheel
from tests.procs import Cluster
from tests.support.waiting import wait_until_sync
from tidemq.client.config import ClientConfig
from tidemq.client.sync import SyncPullConsumer
from tidemq.errors import TideMQError

pytestmark = pytest.mark.interop


def test_cpp_plaintext_and_tidemq_tls_share_permissive_ports(tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    crt, key, ca_file = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt"
    cert.cert_chain_pems[0].write_to_path(str(crt))
    cert.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    tls = ["--tls-mode", "permissive", "--tls-cert-file", str(crt), "--tls-key-file", str(key),
           "--tls-ca-file", str(ca_file)]
    cluster = Cluster(tmp_path / "cluster", extra_broker_args=[*tls, "--namesrv-tls"])
    cluster.namesrv.args += tls
    try:
        cluster.start()
        topic = topic_name("cpp_tls")
        cluster.create_topic(topic, queues=2)  # `tidemq admin`: plaintext
        specs = [{"body": f"plain-{i}", "tags": "T", "keys": f"k{i}"} for i in range(10)]
        res = cpp("produce", namesrv=cluster.namesrv_addr, topic=topic, sync=specs)
        assert [r["status"] for r in res["sync"]] == [0] * 10  # SEND_OK, C++ client in plaintext
        cfg = ClientConfig(tls=True, tls_ca_file=str(ca_file), instance_name="tls-reader")
        bodies: list[str] = []
        with SyncPullConsumer("cpp_tls_reader", cluster.namesrv_addr, cfg) as consumer:
            def routed() -> list:
                try:
                    return consumer.fetch_queues(topic)
                except TideMQError:  # the broker's TLS registration may not have arrived yet
                    return []

            queues = wait_until_sync(routed, f"the queues of {topic} over TLS", timeout=15, interval=0.2)
            for mq in queues:
                bodies += [m.body.decode() for m in consumer.pull(mq, 0, 32).messages]
        assert sorted(bodies) == sorted(s["body"] for s in specs)
        assert "Traceback" not in cluster.broker.log() + cluster.namesrv.log()
    finally:
        cluster.stop()
