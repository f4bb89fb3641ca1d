"""`tidemq namesrv` and `tidemq broker` options of name-server write protection and registration,
from flags, TIDEMQ_* environment variables and config files (parsed by the real click commands)."""

from __future__ import annotations

from tidemq.cli.servers import broker_cmd, namesrv_cmd


def test_namesrv_acl_file_from_flag_environment_and_config_file(tmp_path, monkeypatch) -> None:
    assert namesrv_cmd.make_context("namesrv", []).params["acl_file"] is None
    assert namesrv_cmd.make_context("namesrv", ["--acl-file", "a.yml"]).params["acl_file"] == "a.yml"
    conf = tmp_path / "namesrv.toml"
    conf.write_text('acl-file = "from-file.yml"\nacl-reload-interval = 5\n')
    params = namesrv_cmd.make_context("namesrv", ["--config", str(conf)]).params
    assert (params["acl_file"], params["acl_reload_interval"]) == ("from-file.yml", 5.0)
    monkeypatch.setenv("TIDEMQ_NAMESRV_ACL_FILE", "from-env.yml")
    assert namesrv_cmd.make_context("namesrv", ["--config", str(conf)]).params["acl_file"] == "from-env.yml"


def test_broker_registration_options(tmp_path, monkeypatch) -> None:
    params = broker_cmd.make_context("broker", []).params
    assert params["namesrv_access_key"] is None and params["compressed_register"] is False
    assert params["register_max_body"] == 16 * 1024 * 1024 - 64 * 1024
    conf = tmp_path / "broker.conf"
    conf.write_text("compressedRegister=true\nregister-max-body=1048576\n")  # RocketMQ's key, ours
    monkeypatch.setenv("TIDEMQ_BROKER_NAMESRV_ACCESS_KEY", "clusterKey01")
    monkeypatch.setenv("TIDEMQ_BROKER_NAMESRV_SECRET_KEY", "cluster-secret-0001")
    params = broker_cmd.make_context("broker", ["--config", str(conf)]).params
    assert params["compressed_register"] is True and params["register_max_body"] == 1048576
    assert (params["namesrv_access_key"], params["namesrv_secret_key"]) == ("clusterKey01", "cluster-secret-0001")


def test_broker_refuses_half_a_name_server_account(tmp_path) -> None:
    from click.testing import CliRunner  # noqa: PLC0415

    r = CliRunner().invoke(broker_cmd, ["--store", str(tmp_path / "s"), "--namesrv-access-key", "clusterKey01"],
                           env={"TIDEMQ_BROKER_NAMESRV_SECRET_KEY": ""})
    assert r.exit_code == 2 and "--namesrv-secret-key" in r.output
    assert not (tmp_path / "s").exists()
