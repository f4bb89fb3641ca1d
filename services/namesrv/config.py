"""Configuration of the name server: one frozen value, built by the CLI and handed in.

Invariants: every field is validated on construction (a bad value raises ConfigError with a
sentence naming the field); nothing here reads the environment or files.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidemq.errors import ConfigError
from tidemq.remoting.tls import ServerTlsConfig

DEFAULT_PORT = 9876
DEFAULT_MAX_FRAME = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class NamesrvConfig:
    """Name server settings.

    ``broker_expiry``: seconds after its last registration a silent broker is dropped (RocketMQ: 120).
    ``scan_interval``: seconds between expiry scans (RocketMQ: 10).
    ``max_frame``: largest frame accepted from a peer, in bytes.
    ``ready_delay``: readiness (/readyz) waits at least this many seconds after start (one broker
    registration period: by then every live broker has registered again).
    ``ready_grace``: readiness waits for the first broker registration, at most this many seconds
    after start (0: no wait; see :attr:`NamesrvServer.ready`).
    """

    listen_host: str = "0.0.0.0"
    listen_port: int = DEFAULT_PORT
    broker_expiry: float = 120.0
    scan_interval: float = 10.0
    max_frame: int = DEFAULT_MAX_FRAME
    tls: ServerTlsConfig = ServerTlsConfig()  # the remoting port (tidemq.remoting.tls)
    ready_delay: float = 0.0
    ready_grace: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.listen_port, int) or not 0 <= self.listen_port <= 65535:
            raise ConfigError(f"listen_port must be 0..65535, got {self.listen_port!r}")
        if not self.listen_host:
            raise ConfigError("listen_host must not be empty (use 0.0.0.0 for every interface)")
        if not self.broker_expiry > 0:
            raise ConfigError(f"broker_expiry must be positive seconds, got {self.broker_expiry!r}")
        if not self.scan_interval > 0:
            raise ConfigError(f"scan_interval must be positive seconds, got {self.scan_interval!r}")
        for name in ("ready_delay", "ready_grace"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be 0 or more seconds, got {getattr(self, name)!r}")
        if not isinstance(self.max_frame, int) or self.max_frame < 1024:
            raise ConfigError(f"max_frame must be at least 1024 bytes, got {self.max_frame!r}")
