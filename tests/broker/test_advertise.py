"""The store host: the advertised host becomes an IP literal once, at broker construction, and a
name that does not resolve stops the broker with a message naming the option (issue 16, item 9:
pack_host used to store 0.0.0.0 and block the event loop on a lookup per new host)."""

from __future__ import annotations

import socket

import pytest

from tidemq.broker.advertise import store_host_of
from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.broker.store.config import StoreConfig
from tidemq.errors import ConfigError
from tests.cli.clirun import tidemq

UNRESOLVABLE = "no-such-broker.invalid"  # .invalid never resolves (RFC 6761)


def test_ip_literals_are_kept_as_they_are():
    assert store_host_of("10.1.2.3", 10911) == ("10.1.2.3", 10911)
    assert store_host_of("::1", 10911) == ("::1", 10911)


def test_a_name_is_resolved_once_to_its_ipv4_address(monkeypatch):
    calls = []

    def lookup(name):
        calls.append(name)
        return "10.9.8.7"

    monkeypatch.setattr(socket, "gethostbyname", lookup)
    assert store_host_of("broker-0.brokers.svc", 10911) == ("10.9.8.7", 10911)
    assert calls == ["broker-0.brokers.svc"]


def test_a_name_that_does_not_resolve_names_the_option_to_fix():
    with pytest.raises(ConfigError, match="--advertise") as err:
        store_host_of(UNRESOLVABLE, 10911)
    assert "brokerIP1" in str(err.value) and UNRESOLVABLE in str(err.value)


def test_a_broker_advertising_an_unresolvable_name_refuses_to_start(tmp_path):
    cfg = BrokerConfig(store=StoreConfig(tmp_path / "store"), advertise_host=UNRESOLVABLE)
    with pytest.raises(ConfigError, match="--advertise"):
        Broker(cfg)


def test_a_broker_stores_the_resolved_address(tmp_path, monkeypatch):
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "10.9.8.7")
    broker = Broker(BrokerConfig(store=StoreConfig(tmp_path / "store"), advertise_host="broker-0.svc"))
    assert broker.store_host == ("10.9.8.7", 10911)


def test_the_broker_command_names_the_option_when_its_advertised_host_does_not_resolve(tmp_path):
    r = tidemq("broker", "--store", str(tmp_path / "store"), "--listen", "127.0.0.1:0",
               "--namesrv", "127.0.0.1:1", "--advertise", f"{UNRESOLVABLE}:10911", timeout=30)
    assert r.rc == 1
    assert "--advertise" in r.err and UNRESOLVABLE in r.err and "Traceback" not in r.err
