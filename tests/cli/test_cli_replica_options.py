"""`tidemq broker` replica options (issue 17): --coordination, --replica-id, --ha-listen,
--replication, --min-in-sync, --lease-seconds, --allow-unclean-election, from flags, TIDEMQ_BROKER_*
variables and the config file alike; a bad value is one line naming the option and the fix."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from tidemq.broker.config import ReplicaConfig, ReplicationMode
from tidemq.broker.ha.etcd import EtcdConfig
from tidemq.cli.servers import broker_cmd, build_broker_config, build_replica_config


def _broker(listen: str = "127.0.0.1:20911"):
    return build_broker_config("127.0.0.1:9876", listen, "/tmp/h17-unused", "C", "broker-a", None, "async",
                               False, 1 << 20, 72.0)


def _replica(**kw):
    args = dict(replica_id=1, ha_listen=None, coordination="etcd://127.0.0.1:2379,10.0.0.2:2379",
                replication="sync", min_in_sync=2, lease_seconds=10.0, allow_unclean_election=False)
    return build_replica_config(_broker(), **(args | kw))


def test_without_coordination_the_broker_is_no_replica():
    assert _replica(coordination=None, replica_id=None) is None
    assert _broker().replica is None


def test_replica_options_make_a_typed_config_with_the_ha_port_next_to_the_listen_port():
    rc = _replica()
    assert isinstance(rc, ReplicaConfig)
    assert rc.coordination == EtcdConfig((("127.0.0.1", 2379), ("10.0.0.2", 2379)))
    assert (rc.replica_id, rc.ha_host, rc.ha_port, rc.ha_advertise) == (1, "127.0.0.1", 20912, "127.0.0.1:20912")
    assert (rc.replication, rc.min_in_sync, rc.lease_seconds) == (ReplicationMode.SYNC, 2, 10.0)
    rc = _replica(ha_listen="0.0.0.0:31000", replication="async", allow_unclean_election=True)
    assert (rc.ha_host, rc.ha_advertise) == ("0.0.0.0", "127.0.0.1:31000")  # the advertised host
    assert rc.replication is ReplicationMode.ASYNC and rc.allow_unclean_election


@pytest.mark.parametrize(("kw", "words"), [
    ({"coordination": None}, "--replica-id and --ha-listen need --coordination"),
    ({"replica_id": None}, "--coordination needs --replica-id"),
    ({"coordination": "zk://h:1"}, "neither etcd://HOST:PORT[,HOST:PORT] nor kubernetes"),
    ({"coordination": "etcd://nohost"}, "must be HOST:PORT"),
    ({"ha_listen": "h:notaport"}, "is not HOST:PORT"),
    ({"lease_seconds": 1.0}, "--lease-seconds 1 is outside 2..300"),
])
def test_a_bad_replica_option_says_which_and_how_to_fix_it(kw, words):
    with pytest.raises(click.ClickException) as info:
        _replica(**kw)
    assert words in info.value.format_message()


@pytest.mark.parametrize(("args", "env", "file", "words"), [
    (["--replica-id", "5"], {}, "", "'--replica-id': 5 is not in the range 0<=x<=4"),
    ([], {"TIDEMQ_BROKER_LEASE_SECONDS": "1"}, "", "'--lease-seconds': 1.0 is not in the range 2<=x<=300"),
    ([], {}, 'coordination = "zk://h:1"\nreplica-id = 0\n', "neither etcd://"),
    ([], {"TIDEMQ_BROKER_COORDINATION": "etcd://h:1"}, "", "--coordination needs --replica-id"),
    (["--replication", "quorum"], {}, "", "'--replication': 'quorum' is not one of 'sync', 'async'"),
])
def test_flags_environment_and_file_reach_the_same_checks(tmp_path, args, env, file, words):
    extra = []
    if file:
        conf = tmp_path / "broker.toml"
        conf.write_text(file)
        extra = ["--config", str(conf)]
    result = CliRunner().invoke(broker_cmd, [*extra, "--listen", "127.0.0.1:0", "--store", str(tmp_path / "s"), *args],
                                env=env)
    assert result.exit_code != 0
    assert words in result.output, result.output
