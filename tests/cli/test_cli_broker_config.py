"""`tidemq broker` configuration: a RocketMQ broker.conf and a TOML file are honoured; precedence is
flag > TIDEMQ_BROKER_* environment variable > file > default. Checked on real processes through the
name server's view (clusterList) and the broker's log and store directory."""

from __future__ import annotations

import pytest

from tests.cli.clirun import REPO, tidemq
from tests.procs import ServerProcess, free_port, tidemq_cmd
from tidemq.client import ClientConfig
from tidemq.client.send import SendStatus
from tidemq.client.sync import SyncProducer
from tidemq.errors import BrokerError
from tidemq.message import Message
from tidemq.remoting.codes import ResponseCode


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory):
    port, mport = free_port(), free_port()
    ns = ServerProcess(
        tidemq_cmd("namesrv", "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{mport}"),
        tmp_path_factory.mktemp("ns") / "namesrv.log",
        f"http://127.0.0.1:{mport}/readyz",
    )
    ns.start()
    yield f"127.0.0.1:{port}"
    ns.stop()


@pytest.fixture
def start_broker(tmp_path, monkeypatch):
    """start_broker(*args, env={...}) -> ServerProcess, ready (registered); stopped at the end."""
    started: list[ServerProcess] = []
    monkeypatch.chdir(REPO)

    def start(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
        monkeypatch.setenv("TIDEMQ_BROKER_SEGMENT_SIZE", str(4 << 20))  # not 2 GiB of preallocation per test
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        mport = free_port()
        p = ServerProcess(
            tidemq_cmd("broker", *args, "--metrics-listen", f"127.0.0.1:{mport}"),
            tmp_path / f"broker{len(started)}.log",
            f"http://127.0.0.1:{mport}/readyz",
        )
        started.append(p)
        try:
            p.start()
        except Exception as exc:
            raise AssertionError(f"broker did not start: {exc}\n{p.log()[-3000:]}") from None
        return p

    yield start
    for p in started:
        p.stop()


def cluster_rows(namesrv: str) -> list[list[str]]:
    return [line.split() for line in tidemq("admin", "clusterList", "-n", namesrv).ok().lines()[1:]]


def test_rocketmq_broker_conf_is_honoured(namesrv, start_broker, tmp_path):
    port = free_port()
    store = tmp_path / "rocketmq-store"
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "# a RocketMQ 4.x broker.conf\n"
        "brokerClusterName = ConfCluster\n"
        "brokerName = conf-broker\n"
        "brokerId = 0\n"
        "deleteWhen = 04\n"  # RocketMQ keys TideMQ does not use are accepted
        "brokerRole = ASYNC_MASTER\n"
        f"namesrvAddr = {namesrv}\n"
        f"listenPort = {port}\n"
        "flushDiskType = SYNC_FLUSH\n"
        f"storePathRootDir = {store}\n"
        "maxMessageSize = 2048\n"
    )
    broker = start_broker("--config", str(conf))
    assert ["ConfCluster", "conf-broker", "0", f"127.0.0.1:{port}"] in cluster_rows(namesrv)
    assert (store / "commitlog").is_dir()
    assert "flush mode SYNC_FLUSH" in broker.log()
    tidemq("admin", "updateTopic", "-n", namesrv, "-c", "ConfCluster", "-t", "ConfTopic").ok()
    with SyncProducer("conf-pg", namesrv, ClientConfig(request_timeout=5.0)) as p:
        assert p.send(Message("ConfTopic", b"x" * 2048)).status is SendStatus.SEND_OK
        with pytest.raises(BrokerError) as info:  # maxMessageSize: the broker's own limit
            p.send(Message("ConfTopic", b"x" * 2049))
    assert info.value.code == ResponseCode.MESSAGE_ILLEGAL and "larger than the broker's maximum 2048" in str(info.value)


def test_toml_file_then_environment_then_flag(namesrv, start_broker, tmp_path):
    port = free_port()
    store = tmp_path / "toml-store"
    toml = tmp_path / "broker.toml"
    toml.write_text(
        f'namesrv = "{namesrv}"\n'
        f'listen = "127.0.0.1:{port}"\n'
        f'store = "{store}"\n'
        'cluster = "TomlCluster"\n'
        'broker-name = "toml-broker"\n'
        'flush = "sync"\n'
    )
    # the file alone
    b = start_broker("--config", str(toml))
    assert ["TomlCluster", "toml-broker", "0", f"127.0.0.1:{port}"] in cluster_rows(namesrv)
    assert "flush mode SYNC_FLUSH" in b.log() and (store / "commitlog").is_dir()
    b.stop()

    # the environment variable beats the file; the file's other settings still apply
    b = start_broker("--config", str(toml), env={"TIDEMQ_BROKER_BROKER_NAME": "env-broker"})
    rows = cluster_rows(namesrv)
    assert ["TomlCluster", "env-broker", "0", f"127.0.0.1:{port}"] in rows
    assert "toml-broker" not in [r[1] for r in rows]  # it unregistered when it stopped
    b.stop()

    # a flag beats both
    start_broker("--config", str(toml), "--broker-name", "flag-broker", env={"TIDEMQ_BROKER_BROKER_NAME": "env-broker"})
    rows = cluster_rows(namesrv)
    assert ["TomlCluster", "flag-broker", "0", f"127.0.0.1:{port}"] in rows
    assert "env-broker" not in [r[1] for r in rows]


def test_rocketmq_flush_interval_sets_the_async_loss_window(namesrv, start_broker, tmp_path):
    """flushIntervalCommitLog is in milliseconds (RocketMQ); the broker logs the resulting window."""
    conf = tmp_path / "async.conf"
    conf.write_text(
        f"namesrvAddr = {namesrv}\nlistenPort = {free_port()}\nbrokerName = async-broker\n"
        f"storePathRootDir = {tmp_path / 'async-store'}\nflushDiskType = ASYNC_FLUSH\nflushIntervalCommitLog = 200\n"
    )
    broker = start_broker("--config", str(conf))
    assert "acknowledged messages written in the last 0.2 s may be lost on power failure" in broker.log()
