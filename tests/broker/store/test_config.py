"""StoreConfig validation."""

from __future__ import annotations

import pytest

from tidemq.errors import ConfigError

from tidemq.broker.store.config import StoreConfig


def test_store_config_rejects_nonsense(tmp_path):
    assert StoreConfig(root=str(tmp_path)).root == tmp_path  # a str root becomes a Path
    for bad in ({"commitlog_segment_size": 100}, {"disk_clean_ratio": 0.95},
                {"delete_when_hours": (25,)}, {"sync_flush_timeout": 0}):
        with pytest.raises(ConfigError):
            StoreConfig(root=tmp_path, **bad)
