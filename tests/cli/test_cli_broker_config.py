"""`tidemq broker` configuration: a RocketMQ broker.conf and a TOML file are honoured; precedence is
flag > TIDEMQ_BROKER_* environment variable > file > default. Checked on real processes through the
name server's view (clusterList) and the broker's log and store directory."""

from __future__ import annotations

import pytest

from tests.cli.clirun import REPO, tidemq
from tests.procs import ServerProcess, free_port, tidemq_cmd
from tidemq.cli.config import config_notes, read_config_file
from tidemq.cli.servers import broker_cmd, build_broker_config
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
        except (RuntimeError, OSError) as exc:  # ServerProcess.start: exited, not ready, cannot spawn
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
        "deleteWhen = 04\n"
        "brokerRole = ASYNC_MASTER\n"  # a RocketMQ key TideMQ does not use: ignored, and said so
        "flushDiskTyp = ASYNC_FLUSH\n"  # typos: ignored, and said so with the closest key
        "brokerNmae = typo-broker\n"
        f"namesrvAddr = {namesrv}\n"
        f"listenPort = {port}\n"
        "flushDiskType = SYNC_FLUSH\n"
        f"storePathRootDir = {store}\n"
        "maxMessageSize = 2048\n"
    )
    broker = start_broker("--config", str(conf))
    assert ["ConfCluster", "conf-broker", "0", f"127.0.0.1:{port}"] in cluster_rows(namesrv)
    assert (store / "commitlog").is_dir()
    log = broker.log()
    assert "flush mode SYNC_FLUSH" in log
    assert f"{conf}: unknown key flushDiskTyp ignored; did you mean flushDiskType?" in log
    assert f"{conf}: unknown key brokerNmae ignored; did you mean brokerName?" in log
    assert f"{conf}: brokerRole=ASYNC_MASTER ignored: TideMQ replicas are elected" in log
    assert "deleteWhen ignored" not in log and "deleteWhen=04 ignored" not in log  # --delete-when
    # listenPort alone: every interface, advertised on loopback: logged, with a warning
    assert f"listening on 0.0.0.0:{port}, advertised as 127.0.0.1:{port}" in log
    assert (f"the broker listens on every interface (0.0.0.0:{port}) but advertises 127.0.0.1:{port}"
            in log and "brokerIP1=HOST" in log)
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
    """flushIntervalCommitLog is in milliseconds (RocketMQ); the broker logs the window as set
    (250 ms was logged as "0.2 s"). brokerIP1 sets the advertised host, on the listen port."""
    port = free_port()
    conf = tmp_path / "async.conf"
    conf.write_text(
        f"namesrvAddr = {namesrv}\nlistenPort = {port}\nbrokerName = async-broker\nbrokerIP1 = 127.0.0.1\n"
        f"storePathRootDir = {tmp_path / 'async-store'}\nflushDiskType = ASYNC_FLUSH\nflushIntervalCommitLog = 250\n"
    )
    broker = start_broker("--config", str(conf))
    log = broker.log()
    assert "acknowledged messages written in the last 0.25 s may be lost on power failure" in log
    assert f"{conf}: 7 setting(s) applied" in log and "ignored" not in log
    assert "listens on every interface" not in log  # brokerIP1 given: the advertised host is a choice


def test_rocketmq_keys_that_map_onto_options(tmp_path):
    """deleteWhen, cleanResourceInterval, registerNameServerPeriod (ms), warmMapedFileEnable,
    maxTransferBytesOnMessageInMemory and brokerId set the options they name; brokerIP1 alone
    advertises that host on the listen port."""
    conf = tmp_path / "broker.conf"
    conf.write_text("deleteWhen=05;17\ncleanResourceInterval=2500\nregisterNameServerPeriod=15000\n"
                    "warmMapedFileEnable=true\nmaxTransferBytesOnMessageInMemory=65536\nbrokerId=0\n"
                    "listenPort=10999\nbrokerIP1=10.1.2.3\n")
    p = broker_cmd.make_context("broker", ["--config", str(conf)]).params
    assert p["delete_when"] == (5, 17) and p["cleanup_interval"] == 2.5 and p["register_interval"] == 15.0
    assert p["warm_segments"] is True and p["max_pull_bytes"] == 65536 and p["broker_id"] == 0
    cfg = build_broker_config(p["namesrv"], p["listen"], str(tmp_path / "s"), p["cluster"], p["broker_name"],
                              p["advertise"], p["flush"], False, 1 << 20, 1.0)
    assert (cfg.listen_host, cfg.listen_port, cfg.advertise_addr) == ("0.0.0.0", 10999, "10.1.2.3:10999")


def test_config_notes_name_the_closest_known_key(tmp_path):
    conf = tmp_path / "namesrv.conf"
    conf.write_text("listenPort=9876\nbrokerIP1=10.0.0.1\nrocketmqHome=/opt/rocketmq\nlisten-prot=1\n")
    notes = dict((msg, level) for level, msg in config_notes(read_config_file(str(conf)), {"listen", "metrics_listen", "log_level"}))
    assert notes[f"{conf}: unknown key brokerIP1 ignored (neither an option of this command nor a RocketMQ key it maps)"] == 30
    assert f"{conf}: unknown key listen-prot ignored; did you mean listen-port?" not in notes  # no such option
    assert f"{conf}: unknown key listen-prot ignored; did you mean listenPort?" in notes
    assert f"{conf}: 1 setting(s) applied (listenPort), 3 ignored" in notes


def test_namesrv_logs_the_unknown_keys_of_its_config_file(tmp_path):
    """The name server's --config gets the same treatment (real process)."""
    port, mport = free_port(), free_port()
    conf = tmp_path / "namesrv.conf"
    conf.write_text(f"listenPort = {port}\nrocketmqHome = /opt/rocketmq\nlog-levle = DEBUG\n")
    ns = ServerProcess(tidemq_cmd("namesrv", "--config", str(conf), "--metrics-listen", f"127.0.0.1:{mport}"),
                       tmp_path / "namesrv.log", f"http://127.0.0.1:{mport}/readyz")
    ns.start()
    try:
        log = ns.log()
        assert f"{conf}: unknown key log-levle ignored; did you mean log-level?" in log
        assert f"{conf}: unknown key rocketmqHome ignored" in log
        assert f"{conf}: 1 setting(s) applied (listenPort), 2 ignored" in log
    finally:
        ns.stop()
