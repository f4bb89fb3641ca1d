"""Typed broker configuration. Only tidemq.cli builds it from flags, files and environment."""

from __future__ import annotations

from dataclasses import dataclass, field

from tidemq.broker.delay import DEFAULT_DELAY_LEVELS
from tidemq.broker.store.config import FlushMode, StoreConfig


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    store: StoreConfig
    namesrv_addrs: tuple[str, ...] = ()
    listen_host: str = "0.0.0.0"
    listen_port: int = 10911
    advertise_host: str = "127.0.0.1"
    advertise_port: int = 10911
    cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    broker_id: int = 0
    broker_permission: int = 6
    auto_create_topic: bool = False
    auto_create_subscription_group: bool = True
    default_topic_queue_nums: int = 8
    register_interval: float = 30.0
    register_timeout: float = 6.0
    long_polling: bool = True
    short_polling_ms: int = 1000
    max_long_poll_ms: int = 15000
    client_channel_expiry: float = 120.0
    offset_flush_interval: float = 5.0
    max_frame: int = 16 * 1024 * 1024
    max_pull_bytes: int = 256 * 1024
    region: str = "DefaultRegion"
    transaction_timeout: float = 6.0  # s before a half message is checked (transactionTimeOut)
    transaction_check_interval: float = 60.0  # s between check rounds (transactionCheckInterval)
    transaction_check_max: int = 15  # checks before a half message is discarded
    delay_levels: str = DEFAULT_DELAY_LEVELS  # RocketMQ messageDelayLevel: "1s 5s 10s ... 2h"
    store_reply_message: bool = True  # also store replies in <cluster>_REPLY_TOPIC (storeReplyMessageEnable)
    reply_push_timeout: float = 3.0  # s to wait for a requester to take a pushed reply
    metrics_queue_lag: bool = False  # also export consumer lag per queue (cardinality: groups x queues)
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def advertise_addr(self) -> str:
        return f"{self.advertise_host}:{self.advertise_port}"

    @property
    def flush_mode(self) -> FlushMode:
        return self.store.flush_mode
