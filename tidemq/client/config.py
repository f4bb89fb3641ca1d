"""Typed configuration of a client instance (shared by producers, consumers and admin).

Configuration enters here and nowhere else: the client never reads environment variables. A
config is frozen and hashable, so it keys the one :class:`~tidemq.client.instance.ClientInstance`
that every producer/consumer/admin built from an equal config shares within an event loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from tidemq.errors import ConfigError
from tidemq.remoting import parse_addr

DEFAULT_NAME_SERVER = "127.0.0.1:9876"
MAX_MESSAGE_SIZE = 4 * 1024 * 1024


def parse_name_servers(value: str | Iterable[str]) -> tuple[str, ...]:
    """Accept ``"a:1;b:2"`` (RocketMQ's namesrvAddr form), ``"a:1,b:2"`` or a list of addresses."""
    items = [value] if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"name server address {item!r} is not a string like 'host:9876'")
        for part in item.replace(",", ";").split(";"):
            part = part.strip()
            if not part:
                continue
            try:
                parse_addr(part)
            except ValueError:
                raise ConfigError(
                    f"name server address {part!r} is not HOST:PORT (e.g. 127.0.0.1:9876)"
                ) from None
            if part not in out:
                out.append(part)
    if not out:
        raise ConfigError("no name server address given: pass e.g. name_servers='127.0.0.1:9876'")
    return tuple(out)


def namesrv_arg(name_servers: Iterable[str]) -> str:
    """The ``-n`` argument naming these name servers in a `tidemq admin` hint, quoted when it is a
    list (unquoted, a shell would end the command at the ``;``)."""
    joined = ";".join(name_servers)
    return f'"{joined}"' if ";" in joined else joined


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Settings of one client instance. Times are seconds, sizes bytes.

    ``name_servers`` accepts a list or a ``"a:1;b:2"`` string and is stored as a tuple.
    """

    name_servers: tuple[str, ...] = (DEFAULT_NAME_SERVER,)
    instance_name: str = "DEFAULT"
    request_timeout: float = 3.0
    route_refresh_interval: float = 30.0
    # A failed send or pull re-reads its topic's route at once (to follow a failover), at most
    # once per this many seconds per topic (tidemq.client.route_refresh).
    fault_route_refresh_interval: float = 0.5
    heartbeat_interval: float = 30.0
    retry_times_when_send_failed: int = 2
    compress_threshold: int = 4096
    compress_level: int = 5
    max_message_size: int = MAX_MESSAGE_SIZE
    connect_timeout: float = 3.0
    access_key: str | None = None  # RocketMQ ACL: requests are signed when both keys are set
    secret_key: str | None = None
    # TLS to name servers and brokers: the server's chain is always verified (``tls_ca_file``, or
    # the system trust store when None) and so is its name (the dialled host, or
    # ``tls_server_name`` for peers reached by IP); there is no trust-all switch.
    tls: bool = False
    tls_ca_file: str | None = None
    tls_server_name: str | None = None
    tls_verify_hostname: bool = True
    # Producer.send() calls of one topic made in the same event-loop iteration (many sends in
    # flight) go out as SEND_BATCH_MESSAGEs, as Kafka's producer batches; each caller still gets
    # its own SendResult. A lone send goes out alone; see Producer.send for what is never merged.
    coalesce_sends: bool = True

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if shown["secret_key"] is not None:
            shown["secret_key"] = "***"
        return f"ClientConfig({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def __post_init__(self) -> None:
        object.__setattr__(self, "name_servers", parse_name_servers(self.name_servers))
        if not self.instance_name or "@" in self.instance_name:
            raise ConfigError("instance_name must be non-empty and must not contain '@'")
        check_positive(self, ("request_timeout", "route_refresh_interval", "heartbeat_interval",
                              "connect_timeout", "fault_route_refresh_interval"))
        if self.retry_times_when_send_failed < 0:
            raise ConfigError("retry_times_when_send_failed must be >= 0")
        if not 0 <= self.compress_level <= 9:
            raise ConfigError(f"compress_level must be 0..9 (zlib), got {self.compress_level}")
        if self.compress_threshold < 0:
            raise ConfigError("compress_threshold must be >= 0")
        if self.max_message_size <= 0:
            raise ConfigError("max_message_size must be positive")
        if (self.access_key is None) != (self.secret_key is None):
            raise ConfigError("access_key and secret_key must be given together (RocketMQ ACL)")
        if not self.tls and (self.tls_ca_file or self.tls_server_name):
            raise ConfigError("tls_ca_file / tls_server_name are set but tls is off: pass tls=True")

    def with_name_servers(self, name_servers: str | Iterable[str] | None) -> "ClientConfig":
        if name_servers is None:
            return self
        return dataclasses.replace(self, name_servers=parse_name_servers(name_servers))


def check_positive(settings: object, names: Iterable[str]) -> None:
    """Raise ConfigError unless each named attribute of ``settings`` is > 0."""
    for name in names:
        if not getattr(settings, name) > 0:
            raise ConfigError(f"{name} must be positive, got {getattr(settings, name)!r}")


def make_config(
    name_servers: str | Iterable[str] | None, config: ClientConfig | None
) -> ClientConfig:
    """The config a Producer/PullConsumer/Admin uses: ``name_servers`` overrides the config's."""
    base = config if config is not None else ClientConfig()
    return base.with_name_servers(name_servers)
