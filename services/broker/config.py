"""Typed broker configuration. Only tidemq.cli builds it from flags, files and environment."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from tidemq.broker.delay import DEFAULT_DELAY_LEVELS
from tidemq.broker.ha.coordination import MAX_REPLICAS
from tidemq.broker.ha.etcd import EtcdConfig
from tidemq.broker.ha.kubernetes import KubernetesConfig
from tidemq.broker.quota import CreationLimits
from tidemq.broker.store.config import FlushMode, StoreConfig
from tidemq.remoting.tls import ClientTlsConfig, ServerTlsConfig


class ReplicationMode(enum.Enum):
    """``--replication``: SYNC answers SEND_OK once the in-sync set has a message (issue 17's
    default for replicated groups); ASYNC once the master has it (RocketMQ's ASYNC_MASTER: the last
    moments before a failover may be lost)."""

    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """This broker as one replica of its group (tidemq.broker.ha.replica); None in BrokerConfig
    when ``--coordination`` is not given, and then the broker runs alone exactly as before.

    ``ha_host``/``ha_port``: where the replication master listens (``--ha-listen``, default the
    listen port + 1, RocketMQ's HA port convention); ``ha_advertise``: the HOST:PORT other replicas
    connect to. Bounds are checked here; the CLI turns a ValueError into one line naming the option.
    """

    replica_id: int
    coordination: EtcdConfig | KubernetesConfig
    ha_host: str
    ha_port: int
    ha_advertise: str
    replication: ReplicationMode = ReplicationMode.SYNC
    min_in_sync: int = 1
    lease_seconds: float = 10.0
    allow_unclean_election: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.replica_id < MAX_REPLICAS:
            raise ValueError(f"--replica-id {self.replica_id} is outside 0..{MAX_REPLICAS - 1}: "
                             "give each replica of a group its own id in that range")
        if not 1 <= self.min_in_sync <= MAX_REPLICAS:
            raise ValueError(f"--min-in-sync {self.min_in_sync} is outside 1..{MAX_REPLICAS}: "
                             "give at most the number of replicas in the group")
        if not 2.0 <= self.lease_seconds <= 300.0:
            raise ValueError(f"--lease-seconds {self.lease_seconds:g} is outside 2..300: a shorter lease "
                             "fails over on every pause, a longer one leaves the group unwritable for long")
        if not 0 <= self.ha_port < 65536:
            raise ValueError(f"--ha-listen port {self.ha_port} is outside 0..65535")


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
    # Hostile input and overload (tidemq.remoting.limits, Broker.handle): all-idle connections are
    # closed after idle_timeout s (RocketMQ serverChannelMaxIdleTimeSeconds, 0 = never); at most
    # max_connections (more are closed at once, 0 = no cap); incomplete frames share max_buffered_bytes.
    # A frame must arrive whole within frame_read_timeout s of its first byte (0 = no deadline).
    idle_timeout: float = 120.0
    frame_read_timeout: float = 30.0
    max_connections: int = 16_384
    max_buffered_bytes: int = 256 * 1024 * 1024
    # A send is answered SYSTEM_BUSY ("[TIMEOUT_CLEAN_QUEUE]...") while the oldest send waiting for
    # its SYNC_FLUSH has waited busy_wait_ms, or ("[OVERLOAD]...") max_pending_sends are waiting.
    busy_wait_ms: int = 1000
    max_pending_sends: int = 10_000
    # Bounds on topics and groups (tidemq.broker.quota): totals, and implicit creations per principal.
    creation_limits: CreationLimits = CreationLimits()
    acl_file: Path | None = None  # RocketMQ plain_acl.yml: ACL on when set (tidemq.broker.acl)
    acl_reload_interval: float = 2.0  # s between checks of the ACL file for changes
    tls: ServerTlsConfig = ServerTlsConfig()  # the remoting port (tidemq.remoting.tls)
    namesrv_tls: ClientTlsConfig = ClientTlsConfig()  # connections to the name servers
    # Registration (tidemq.broker.register): requests to name servers are signed with this account
    # when both are set (name servers started with --acl-file require it); bodies are zlib-compressed
    # when compressed_register (RocketMQ compressedRegister) or large; larger than
    # register_max_body (under the name servers' frame limit), they are split into parts.
    namesrv_access_key: str | None = None
    namesrv_secret_key: str | None = field(default=None, repr=False)
    compressed_register: bool = False
    register_max_body: int = 16 * 1024 * 1024 - 64 * 1024
    # Replication (issue 17): None = a group of one, no coordination store (the default).
    replica: ReplicaConfig | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def advertise_addr(self) -> str:
        return f"{self.advertise_host}:{self.advertise_port}"

    @property
    def flush_mode(self) -> FlushMode:
        return self.store.flush_mode
