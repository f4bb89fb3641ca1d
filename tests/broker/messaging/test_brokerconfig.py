"""BrokerConfigService: only allow-listed keys change, all or none, at once."""

from __future__ import annotations

import pytest

from tidemq.broker.config import BrokerConfig
from tidemq.broker.messaging.brokerconfig import UPDATABLE, BrokerConfigService
from tidemq.broker.messaging.context import Caller
from tidemq.broker.store.config import StoreConfig
from tidemq.errors import BrokerError
from tidemq.remoting import ResponseCode

CALLER = Caller("10.0.0.2:7", 25, "adminKey01")


class Holder:
    def __init__(self, tmp) -> None:
        self.config = BrokerConfig(store=StoreConfig(tmp))
        self.reregistered = 0
        self.service = BrokerConfigService(settings=lambda: self.config, replace=self._replace,
                                           reregister=self._reregister)

    def _replace(self, config: BrokerConfig) -> None:
        self.config = config

    def _reregister(self) -> object:
        self.reregistered += 1
        return self  # stands for the registration the adapter awaits before answering


def test_allowed_keys_change_at_once_and_a_permission_change_reregisters(tmp_path):
    h = Holder(tmp_path)
    assert h.service.update(CALLER, [("autoCreateTopicEnable", "FALSE"), ("shortPollingTimeMills", " 500 ")]) is None
    assert h.config.auto_create_topic is False and h.config.short_polling_ms == 500
    assert h.reregistered == 0
    assert h.service.update(CALLER, [("brokerPermission", "4")]) is h  # the registration, to await
    assert h.config.broker_permission == 4 and h.reregistered == 1


@pytest.mark.parametrize("key", ["rocketmqHome", "filterServerNums", "brokerPermision", "x" * 100])
def test_any_other_key_is_refused_and_nothing_changes(tmp_path, key):
    h = Holder(tmp_path)
    before = h.config
    with pytest.raises(BrokerError) as err:
        h.service.update(CALLER, [("autoCreateTopicEnable", "false"), (key, "1")])
    assert err.value.code == ResponseCode.NO_PERMISSION
    assert "cannot be changed remotely; updatable keys: " + ", ".join(sorted(UPDATABLE)) in err.value.remark
    assert len(err.value.remark) < 400  # a long key is shortened
    assert h.config is before


def test_a_bad_value_is_refused_and_nothing_changes(tmp_path):
    h = Holder(tmp_path)
    before = h.config
    with pytest.raises(BrokerError) as err:
        h.service.update(CALLER, [("autoCreateTopicEnable", "false"), ("brokerPermission", "7")])
    assert err.value.code == ResponseCode.SYSTEM_ERROR
    assert err.value.remark.startswith("broker config brokerPermission='7': expected 2 (write)")
    assert h.config is before


def test_current_lists_the_updatable_keys_then_the_brokers_identity(tmp_path):
    h = Holder(tmp_path)
    lines = h.service.current()
    assert [k for k, _ in lines[:len(UPDATABLE)]] == sorted(UPDATABLE)
    assert dict(lines)["autoCreateTopicEnable"] in ("true", "false")
    assert [k for k, _ in lines[len(UPDATABLE):]] == ["brokerClusterName", "brokerName", "brokerId", "flushDiskType"]
    assert dict(lines)["flushDiskType"].endswith("_FLUSH")
