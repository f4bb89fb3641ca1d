"""`tidemq namesrv`, `tidemq broker` and `tidemq local` (both in one process)."""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from tidemq.broker.acl import AclService
from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig, ReplicaConfig, ReplicationMode
from tidemq.broker.delay import DEFAULT_DELAY_LEVELS, parse_delay_levels
from tidemq.broker.faults import FlushStall
from tidemq.broker.ha.etcd import EtcdConfig
from tidemq.broker.ha.kubernetes import KubernetesConfig
from tidemq.broker.quota import CreationLimits
from tidemq.broker.store.config import DEFAULT_MAX_MAPPED_QUEUE_FILES, FlushMode, StoreConfig
from tidemq.broker.store.faults import DurableShadow
from tidemq.broker.store.observer import StoreObserver, chain
from tidemq.cli.common import listening, parse_listen, run_async, setup_logging, user_errors, wait_for_signal
from tidemq.cli.config import config_notes, log_config_notes, read_config_file
from tidemq.errors import ConfigError
from tidemq.monitoring import MetricsServer
from tidemq.namesrv import NamesrvConfig, NamesrvServer
from tidemq.namesrv.metrics import namesrv_registry
from tidemq.remoting.ports import free_port
from tidemq.remoting.tls import ClientTlsConfig, ServerTlsConfig, TlsMode

log = logging.getLogger("tidemq.cli")


def _config_callback(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    cfg = read_config_file(value)
    if cfg.values:
        ctx.default_map = {**(ctx.default_map or {}), **cfg.values}
    # logged by the command once logging is set up (log_config_notes)
    ctx.meta["tidemq.config_notes"] = config_notes(cfg, {p.name for p in ctx.command.params if p.name})
    return value


config_option = click.option(
    "--config",
    type=click.Path(dir_okay=False),
    callback=_config_callback,
    is_eager=True,
    expose_value=False,
    help="TOML file or RocketMQ broker.conf (key=value); flags and TIDEMQ_* variables win.",
)


def _advertise_default(listen_host: str, port: int) -> str:
    host = listen_host if listen_host not in ("0.0.0.0", "", "::") else os.environ.get("POD_IP", "127.0.0.1")
    return f"{host}:{port}"


def _is_loopback(host: str) -> bool:
    return host == "localhost" or host == "::1" or host.startswith("127.")


def build_broker_config(
    namesrv: str,
    listen: str,
    store: str,
    cluster: str,
    broker_name: str,
    advertise: str | None,
    flush: str,
    auto_create_topic: bool,
    segment_size: int,
    retention_hours: float,
    broker_id: int = 0,
) -> BrokerConfig:
    lhost, lport = parse_listen(listen, "--listen")
    if lport == 0:  # the advertised port (and offset message ids) must be the real one: pick it now
        lport = free_port(lhost)
    adv = advertise or _advertise_default(lhost, lport)
    if ":" not in adv:  # HOST alone (broker.conf brokerIP1): the listen port
        adv = f"{adv}:{lport}"
    ahost, aport = parse_listen(adv, "--advertise")
    if ahost in ("0.0.0.0", "::"):
        raise click.BadParameter("the advertised address must be one clients can reach", param_hint="--advertise")
    if advertise is None and lhost in ("0.0.0.0", "", "::") and _is_loopback(ahost):
        log.warning(
            "the broker listens on every interface (%s:%d) but advertises %s:%d to the name servers, "
            "so clients on other hosts are sent to their own loopback: set --advertise HOST[:PORT] "
            "(broker.conf brokerIP1=HOST) to an address they reach", lhost, lport, ahost, aport)
    addrs = tuple(a.strip() for a in namesrv.replace(",", ";").split(";") if a.strip())
    for a in addrs:
        parse_listen(a, "--namesrv")
    store_cfg = StoreConfig(
        root=Path(store).expanduser().resolve(),
        flush_mode=FlushMode(flush),
        commitlog_segment_size=segment_size,
        file_reserved_hours=retention_hours,
    )
    return BrokerConfig(
        store=store_cfg,
        namesrv_addrs=addrs,
        listen_host=lhost,
        listen_port=lport,
        advertise_host=ahost,
        advertise_port=aport,
        cluster_name=cluster,
        broker_name=broker_name,
        broker_id=broker_id,
        auto_create_topic=auto_create_topic,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class TlsFlags:
    """The --tls-* flags of a server command, turned into configs."""

    server: ServerTlsConfig
    metrics: ServerTlsConfig | None
    ca_file: str | None
    server_name: str | None


def tls_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add the TLS flags; the command receives them as one ``tls: TlsFlags`` argument."""

    @functools.wraps(fn)
    def wrapper(*args, tls_mode, tls_cert_file, tls_key_file, tls_ca_file, tls_server_name,
                tls_reload_interval, metrics_tls, **kwargs) -> Any:
        try:
            server = ServerTlsConfig(TlsMode.parse(tls_mode), tls_cert_file, tls_key_file, tls_reload_interval)
            metrics = None
            if metrics_tls:
                metrics = ServerTlsConfig(TlsMode.ENFORCING, tls_cert_file, tls_key_file, tls_reload_interval)
        except ConfigError as exc:
            raise click.UsageError(str(exc)) from None
        return fn(*args, tls=TlsFlags(server, metrics, tls_ca_file, tls_server_name), **kwargs)

    opts = [
        click.option("--tls-mode", type=click.Choice(["disabled", "permissive", "enforcing"]), default="disabled", show_default=True, help="TLS on the remoting port: plaintext only, both (sniffed per connection), or TLS only."),
        click.option("--tls-cert-file", default=None, type=click.Path(dir_okay=False), help="PEM certificate chain (e.g. a mounted Secret's tls.crt); reloaded when it changes."),
        click.option("--tls-key-file", default=None, type=click.Path(dir_okay=False), help="PEM private key (tls.key)."),
        click.option("--tls-ca-file", default=None, type=click.Path(dir_okay=False), help="PEM CA bundle (ca.crt) that outgoing TLS connections verify peers with (default: the system trust store)."),
        click.option("--tls-server-name", default=None, help="Name the peers' certificates must carry when they are dialled by IP (default: the dialled host)."),
        click.option("--tls-reload-interval", default=10.0, show_default=True, type=click.FloatRange(min=0), help="Seconds between checks for changed certificate files (0: never reload)."),
        click.option("--metrics-tls/--no-metrics-tls", default=False, show_default=True, help="Serve /metrics, /healthz and /readyz over HTTPS only, with the --tls-cert-file certificate."),
    ]
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return wrapper


@click.command("namesrv", context_settings={"auto_envvar_prefix": "TIDEMQ_NAMESRV"})
@config_option
@click.option("--listen", default="0.0.0.0:9876", show_default=True, help="HOST:PORT to serve remoting on.")
@click.option("--metrics-listen", default=None, help="HOST:PORT for /metrics, /healthz, /readyz.")
@click.option("--broker-expiry", default=120.0, show_default=True, type=click.FloatRange(min=1), help="Seconds of silence before a broker leaves the routes.")
@click.option("--acl-file", default=None, type=click.Path(dir_okay=False), help="RocketMQ plain_acl.yml: requests that change routes (REGISTER_BROKER, UNREGISTER_BROKER, WIPE/ADD_WRITE_PERM_OF_BROKER, DELETE_TOPIC_IN_NAMESRV, KV writes ...) must be signed by an account with admin: true; reads stay open. Reloaded on change.")
@click.option("--acl-reload-interval", default=2.0, show_default=True, type=click.FloatRange(min=0.05), help="Seconds between checks of the ACL file for changes.")
@click.option("--ready-delay", default=0.0, show_default=True, type=click.FloatRange(min=0), help="/readyz answers 503 for at least this many seconds after start. Set it a little above the brokers' registration period: by then every live broker has registered with a restarted name server again.")
@click.option("--ready-grace", default=0.0, show_default=True, type=click.FloatRange(min=0), help="/readyz answers 503 until a broker registered, at most this many seconds after start (0: no wait): when none comes, there is none to wait for.")
@click.option("--log-level", default="INFO", show_default=True)
@tls_options
@user_errors
def namesrv_cmd(listen: str, metrics_listen: str | None, broker_expiry: float, log_level: str,
                tls: TlsFlags, acl_file: str | None = None, acl_reload_interval: float = 2.0,
                ready_delay: float = 0.0, ready_grace: float = 0.0) -> None:
    """Run a name server."""
    setup_logging(log_level)
    log_config_notes(click.get_current_context())
    host, port = parse_listen(listen, "--listen")
    mhost_port = parse_listen(metrics_listen, "--metrics-listen") if metrics_listen else None
    cfg = NamesrvConfig(
        listen_host=host, listen_port=port, broker_expiry=broker_expiry,
        scan_interval=min(10.0, max(0.1, broker_expiry / 4)), tls=tls.server, ready_delay=ready_delay,
        ready_grace=ready_grace,
    )
    # The accounts file is parsed and reloaded by the broker's ACL service (one parser for both).
    write_acl = (AclService(Path(acl_file).expanduser().resolve(), acl_reload_interval)
                 if acl_file else None)

    async def main() -> None:
        server = NamesrvServer(cfg, write_acl=write_acl)
        await listening("--listen", server.start())
        freeze_startup_objects()
        metrics = None
        if mhost_port:
            metrics = MetricsServer([namesrv_registry(server)], ready=lambda: server.ready, tls=tls.metrics)
            await listening("--metrics-listen", metrics.start(*mhost_port), metrics_listen)
        try:
            await wait_for_signal()
        finally:
            if metrics:
                await metrics.stop()
            await server.stop()

    run_async(main)


def _check_delay_levels(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    try:
        parse_delay_levels(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--delay-levels") from None
    return value


def _check_delete_when(_ctx, param, value: str) -> tuple[int, ...]:
    text = str(value).strip()
    if text == "*":
        return tuple(range(24))
    try:
        hours = tuple(sorted({int(h) for h in text.replace(",", ";").split(";") if h.strip()}))
    except ValueError:
        hours = ()
    if not hours or any(not 0 <= h <= 23 for h in hours):
        raise click.BadParameter(f"{value!r}: give hours 0-23 like '04' or '04;16', or '*'",
                                 param=param)
    return hours


def freeze_startup_objects() -> None:
    """Move everything allocated while starting (modules, config, CLI) out of the cyclic GC's
    reach: a full collection then only walks objects made while serving, so its pauses (which
    land in request latency) stay short."""
    gc.collect()
    gc.freeze()


def broker_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--namesrv", "-n", envvar="NAMESRV_ADDR", default="127.0.0.1:9876", show_default=True, help="Name servers, ADDR[;ADDR...] (also $NAMESRV_ADDR)."),
        click.option("--listen", default="0.0.0.0:10911", show_default=True, help="HOST:PORT to serve remoting on."),
        click.option("--store", default="./tidemq-store", show_default=True, type=click.Path(file_okay=False), help="Store directory."),
        click.option("--cluster", default="DefaultCluster", show_default=True),
        click.option("--broker-name", default="broker-a", show_default=True),
        click.option("--broker-id", default=0, show_default=True, type=click.IntRange(min=0), hidden=True),
        click.option("--advertise", default=None, help="HOST[:PORT] clients use to reach this broker (default: the listen address, or $POD_IP; PORT defaults to the listen port)."),
        click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True, help="ASYNC_FLUSH or SYNC_FLUSH."),
        click.option("--flush-interval", default=0.5, show_default=True, type=click.FloatRange(min=0.01, max=60), help="ASYNC_FLUSH: seconds between CommitLog fdatasyncs, the power-loss window (RocketMQ flushIntervalCommitLog)."),
        click.option("--metrics-listen", default=None, help="HOST:PORT for /metrics, /healthz, /readyz."),
        click.option("--metrics-queue-lag/--no-metrics-queue-lag", default=False, show_default=True, help="Also export consumer lag per queue (one series per group, topic and queue)."),
        click.option("--auto-create-topic/--no-auto-create-topic", default=False, show_default=True, help="Create unknown topics on send (TBW102)."),
        click.option("--segment-size", default=1 << 30, show_default=True, type=click.IntRange(min=64 * 1024), help="CommitLog segment size in bytes."),
        click.option("--retention-hours", default=72.0, show_default=True, type=click.FloatRange(min=0.0001), help="Keep CommitLog segments this long (RocketMQ fileReservedTime)."),
        click.option("--delete-when", default="04", show_default=True, callback=_check_delete_when, help="Hours of the day (HH[;HH...], or '*' for every hour) when expired segments are deleted (RocketMQ deleteWhen)."),
        click.option("--cleanup-interval", default=10.0, show_default=True, type=click.FloatRange(min=0.05), help="Seconds between retention passes (RocketMQ cleanResourceInterval)."),
        click.option("--delay-levels", default=DEFAULT_DELAY_LEVELS, show_default=True, callback=_check_delay_levels, help="Delay of each delay level (RocketMQ messageDelayLevel), units ms/s/m/h/d."),
        click.option("--transaction-timeout", default=6.0, show_default=True, type=click.FloatRange(min=0), help="Seconds before an unresolved transactional (half) message is checked with its producer."),
        click.option("--transaction-check-interval", default=60.0, show_default=True, type=click.FloatRange(min=0.05), help="Seconds between transaction check rounds."),
        click.option("--transaction-check-max", default=15, show_default=True, type=click.IntRange(min=0), help="Checks before an unresolved half message is discarded."),
        click.option("--max-message-size", default=4 * 1024 * 1024, show_default=True, type=click.IntRange(1024, 15 * 1024 * 1024), help="Largest message body the broker stores, in bytes (RocketMQ maxMessageSize); larger sends are answered MESSAGE_ILLEGAL. At most 15 MiB (a request frame is at most 16 MiB)."),
        click.option("--max-mapped-queue-files", default=DEFAULT_MAX_MAPPED_QUEUE_FILES, show_default=True, type=click.IntRange(min=2), help="Most consume-queue files mapped at once; the least recently used is unmapped, so any number of topics fits the open-file and mapping limits (lowered to a quarter of the open-file limit at start on Python < 3.13, where a mapping holds a descriptor)."),
        click.option("--max-pull-bytes", default=256 * 1024, show_default=True, type=click.IntRange(min=4096), help="Most bytes of messages one pull returns (RocketMQ maxTransferBytesOnMessageInMemory; at least one message is always returned)."),
        click.option("--warm-segments/--no-warm-segments", default=False, show_default=True, help="Pre-fault each new CommitLog segment in a worker thread (RocketMQ warmMapedFileEnable): appends take no page faults, but the segment is resident page cache from creation and populating it can stall the broker's allocations on a busy machine."),
        click.option("--register-interval", default=30.0, show_default=True, type=click.FloatRange(min=0.1), help="Seconds between registrations with the name servers."),
        click.option("--acl-file", default=None, type=click.Path(dir_okay=False), help="RocketMQ plain_acl.yml: turns ACL on (every request signed; reloaded on change)."),
        click.option("--acl-reload-interval", default=2.0, show_default=True, type=click.FloatRange(min=0.05), help="Seconds between checks of the ACL file for changes."),
        click.option("--namesrv-tls/--no-namesrv-tls", default=False, show_default=True, help="Connect to the name servers over TLS (verified with --tls-ca-file and --tls-server-name)."),
        click.option("--namesrv-access-key", default=None, help="Access key of an admin account the name servers accept (their --acl-file): registrations are signed with it."),
        click.option("--namesrv-secret-key", default=None, help="Its secret key; prefer $TIDEMQ_BROKER_NAMESRV_SECRET_KEY to the flag (ps shows flags)."),
        click.option("--compressed-register/--no-compressed-register", default=False, show_default=True, help="Always send registrations zlib-compressed (RocketMQ compressedRegister); bodies over 1 MiB are compressed anyway."),
        click.option("--register-max-body", default=16 * 1024 * 1024 - 64 * 1024, show_default=True, type=click.IntRange(min=1024), help="Largest registration body sent to a name server (keep it under their 16 MiB frame limit); a larger registration goes out in several requests of whole topics, with a warning."),
        click.option("--log-level", default="INFO", show_default=True),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def limit_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Connection limits and flow control (BrokerConfig); the command receives ``limits``, a dict
    of BrokerConfig field replacements, and the hidden ``test_flush_stall_file``."""

    @functools.wraps(fn)
    def wrapper(*args, idle_timeout, frame_read_timeout, max_connections, max_buffered_bytes, busy_wait_ms,
                max_pending_sends, test_flush_stall_file, **kwargs) -> Any:
        limits = dict(idle_timeout=idle_timeout, frame_read_timeout=frame_read_timeout, max_connections=max_connections,
                      max_buffered_bytes=max_buffered_bytes, busy_wait_ms=busy_wait_ms,
                      max_pending_sends=max_pending_sends)
        return fn(*args, limits=limits, test_flush_stall_file=test_flush_stall_file, **kwargs)

    opts = [
        click.option("--idle-timeout", default=120.0, show_default=True, type=click.FloatRange(min=0), help="Close connections with no traffic for this many seconds (RocketMQ serverChannelMaxIdleTimeSeconds; 0: never)."),
        click.option("--frame-read-timeout", default=30.0, show_default=True, type=click.FloatRange(min=0), help="Close a connection whose request has not arrived whole this many seconds after its first byte (a peer trickling bytes is never idle); 0: no deadline."),
        click.option("--max-connections", default=16_384, show_default=True, type=click.IntRange(min=0), help="Most open client connections; more are closed at once. Fitted under the open-file limit (raised to its hard limit at start, 512 kept for store files); 0: only that limit."),
        click.option("--max-buffered-bytes", default=256 * 1024 * 1024, show_default=True, type=click.IntRange(min=0), help="Bytes of incomplete requests buffered across all connections before reading pauses (0: no limit)."),
        click.option("--busy-wait-ms", default=1000, show_default=True, type=click.IntRange(min=1), help="Answer sends SYSTEM_BUSY while the oldest send waiting for SYNC_FLUSH has waited this long."),
        click.option("--max-pending-sends", default=10_000, show_default=True, type=click.IntRange(min=1), help="Answer sends SYSTEM_BUSY while this many wait for SYNC_FLUSH."),
        click.option("--test-flush-stall-file", default=None, hidden=True, allow_from_autoenv=False, help="TEST ONLY: CommitLog flushes wait while this file exists."),
    ]
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return wrapper


_CREATION = CreationLimits()


def creation_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Bounds on topics and groups (tidemq.broker.quota); the command receives ``creation``, a
    CreationLimits."""

    @functools.wraps(fn)
    def wrapper(*args, max_topics, max_groups, implicit_create_limit, implicit_create_window, **kwargs) -> Any:
        creation = CreationLimits(max_topics, max_groups, implicit_create_limit, implicit_create_window)
        return fn(*args, creation=creation, **kwargs)

    opts = [
        click.option("--max-topics", default=_CREATION.max_topics, show_default=True, type=click.IntRange(min=1), help="Most topics the broker holds; creating more (admin or implicit) is refused."),
        click.option("--max-groups", default=_CREATION.max_groups, show_default=True, type=click.IntRange(min=1), help="Most subscription groups the broker holds; creating more is refused."),
        click.option("--implicit-create-limit", default=_CREATION.implicit_per_window, show_default=True, type=click.IntRange(min=0), help="Topics and groups one client (ACL access key, else host) may create implicitly (first heartbeat, pull, send-back, auto-created topic) per window; 0: none."),
        click.option("--implicit-create-window", default=_CREATION.window, show_default=True, type=click.FloatRange(min=0.001), help="Seconds of the --implicit-create-limit window."),
    ]
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return wrapper


def replica_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """This broker as a replica of its group (issue 17, tidemq.broker.ha.replica); the command
    receives ``replica``, a dict for :func:`build_replica_config`. Without --coordination the
    broker runs alone, as before."""

    @functools.wraps(fn)
    def wrapper(*args, replica_id, ha_listen, coordination, replication, min_in_sync, lease_seconds,
                allow_unclean_election, **kwargs) -> Any:
        replica = dict(replica_id=replica_id, ha_listen=ha_listen, coordination=coordination,
                       replication=replication, min_in_sync=min_in_sync, lease_seconds=lease_seconds,
                       allow_unclean_election=allow_unclean_election)
        return fn(*args, replica=replica, **kwargs)

    opts = [
        click.option("--coordination", default=None, help="etcd://HOST:PORT[,HOST:PORT] or kubernetes: run as a replica of the group (--broker-name), elected master through this store. Without it the broker runs alone."),
        click.option("--replica-id", default=None, type=click.IntRange(0, 4), help="This replica's id in its group, 0..4 (with --coordination; each replica its own)."),
        click.option("--ha-listen", default=None, help="HOST:PORT the replication master listens on (default: the --listen host and port + 1)."),
        click.option("--replication", default="sync", show_default=True, type=click.Choice(["sync", "async"]), help="sync: acknowledge a send once the in-sync replicas have it; async: once the master has it (may lose the last moments on failover)."),
        click.option("--min-in-sync", default=1, show_default=True, type=click.IntRange(1, 5), help="Fewest in-sync replicas (master included) for a sync send to be acknowledged."),
        click.option("--lease-seconds", default=10.0, show_default=True, type=click.FloatRange(2, 300), help="Lease of a replica in the coordination store: a dead master is replaced within it (plus the election)."),
        click.option("--allow-unclean-election/--no-allow-unclean-election", default=False, show_default=True, help="Let an out-of-sync replica become master when no in-sync one is left (acknowledged messages may be lost)."),
    ]
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return wrapper


def build_replica_config(cfg: BrokerConfig, replica_id: int | None, ha_listen: str | None, coordination: str | None,
                         replication: str, min_in_sync: int, lease_seconds: float,
                         allow_unclean_election: bool) -> ReplicaConfig | None:
    """The replica options as a ReplicaConfig (None without --coordination); every bad value is
    one line naming its option and the fix."""
    if coordination is None:
        if replica_id is not None or ha_listen is not None:
            raise click.UsageError("--replica-id and --ha-listen need --coordination etcd://HOST:PORT or "
                                   "--coordination kubernetes (or drop them to run this broker alone)")
        return None
    if replica_id is None:
        raise click.UsageError("--coordination needs --replica-id 0..4 (each replica of the group its own)")
    store: EtcdConfig | KubernetesConfig
    if coordination == "kubernetes":
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise click.BadParameter("kubernetes needs KUBERNETES_SERVICE_HOST/PORT (run the broker in a pod), "
                                     "or use etcd://HOST:PORT", param_hint="--coordination")
        store = KubernetesConfig.in_cluster(host, port)
    elif coordination.startswith("etcd://"):
        try:
            store = EtcdConfig.parse(coordination)
        except ConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--coordination") from None
    else:
        raise click.BadParameter(f"{coordination!r} is neither etcd://HOST:PORT[,HOST:PORT] nor kubernetes",
                                 param_hint="--coordination")
    if ha_listen is None:
        ha_host, ha_port = cfg.listen_host, cfg.listen_port + 1
        if ha_port > 65535:
            raise click.BadParameter(f"the listen port {cfg.listen_port} + 1 is no port: give --ha-listen HOST:PORT",
                                     param_hint="--ha-listen")
    else:
        ha_host, ha_port = parse_listen(ha_listen, "--ha-listen")
    advertise_host = ha_host if ha_host not in ("0.0.0.0", "", "::") else cfg.advertise_host
    try:
        return ReplicaConfig(replica_id=replica_id, coordination=store, ha_host=ha_host, ha_port=ha_port,
                             ha_advertise=f"{advertise_host}:{ha_port}", replication=ReplicationMode(replication),
                             min_in_sync=min_in_sync, lease_seconds=lease_seconds,
                             allow_unclean_election=allow_unclean_election)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def fault_observer(store_root: Path, power_loss_shadow: str | None,
                  flush_stall_file: str | None) -> StoreObserver | None:
    """The store observer the hidden TEST ONLY flags ask for, or None (always, outside tests):
    --test-power-loss-shadow DIR (tidemq.broker.store.faults.DurableShadow) and
    --test-flush-stall-file PATH (tidemq.broker.faults.FlushStall)."""
    observers: list[StoreObserver] = []
    if power_loss_shadow:
        observers.append(DurableShadow(store_root, Path(power_loss_shadow)))
    if flush_stall_file:
        observers.append(FlushStall(Path(flush_stall_file)))
    return chain(observers)


@click.command("broker", context_settings={"auto_envvar_prefix": "TIDEMQ_BROKER"})
@creation_options
@replica_options
@config_option
@broker_options
@tls_options
@limit_options
@click.option("--test-power-loss-shadow", default=None, hidden=True, allow_from_autoenv=False,
              type=click.Path(file_okay=False),
              help="TEST ONLY: copy every fdatasync into DIR so a test can emulate a power cut.")
@user_errors
def broker_cmd(namesrv, listen, store, cluster, broker_name, broker_id, advertise, flush, flush_interval, metrics_listen,
               metrics_queue_lag, auto_create_topic, segment_size, retention_hours, delete_when,
               cleanup_interval, delay_levels, transaction_timeout, transaction_check_interval,
               transaction_check_max, max_message_size, max_mapped_queue_files, max_pull_bytes, warm_segments,
               register_interval, log_level, tls: TlsFlags,
               namesrv_tls: bool = False, test_power_loss_shadow: str | None = None,
               test_flush_stall_file: str | None = None, limits: dict | None = None,
               creation: CreationLimits = CreationLimits(), replica: dict | None = None,
               acl_file: str | None = None, acl_reload_interval: float = 2.0,
               namesrv_access_key: str | None = None, namesrv_secret_key: str | None = None,
               compressed_register: bool = False, register_max_body: int = 16 * 1024 * 1024 - 64 * 1024) -> None:
    """Run a broker."""
    setup_logging(log_level)
    log_config_notes(click.get_current_context())
    cfg = build_broker_config(namesrv, listen, store, cluster, broker_name, advertise, flush,
                              auto_create_topic, segment_size, retention_hours, broker_id)
    cfg = dataclasses.replace(cfg, store=dataclasses.replace(
        cfg.store, delete_when_hours=delete_when, cleanup_interval=cleanup_interval,
        warm_segments=warm_segments, max_message_size=max_message_size, async_flush_interval=flush_interval,
        max_mapped_queue_files=max_mapped_queue_files))
    cfg = dataclasses.replace(cfg, register_interval=register_interval, delay_levels=delay_levels,
                              max_pull_bytes=max_pull_bytes,
                              metrics_queue_lag=metrics_queue_lag)
    cfg = dataclasses.replace(cfg, transaction_timeout=transaction_timeout,
                              transaction_check_interval=transaction_check_interval,
                              transaction_check_max=transaction_check_max)
    cfg = dataclasses.replace(cfg, tls=tls.server, namesrv_tls=ClientTlsConfig(
        namesrv_tls, tls.ca_file, tls.server_name))
    cfg = dataclasses.replace(cfg, **(limits or {}))
    cfg = dataclasses.replace(cfg, creation_limits=creation)
    cfg = dataclasses.replace(cfg, acl_file=Path(acl_file).expanduser().resolve() if acl_file else None,
                              acl_reload_interval=acl_reload_interval)
    if bool(namesrv_access_key) != bool(namesrv_secret_key):
        raise click.UsageError("give both --namesrv-access-key and --namesrv-secret-key (or "
                               "TIDEMQ_BROKER_NAMESRV_ACCESS_KEY / _SECRET_KEY), or neither")
    cfg = dataclasses.replace(cfg, namesrv_access_key=namesrv_access_key or None,
                              namesrv_secret_key=namesrv_secret_key or None,
                              compressed_register=compressed_register, register_max_body=register_max_body)
    if replica is not None:
        cfg = dataclasses.replace(cfg, replica=build_replica_config(cfg, **replica))
    mhost_port = parse_listen(metrics_listen, "--metrics-listen") if metrics_listen else None

    observer = fault_observer(cfg.store.root, test_power_loss_shadow, test_flush_stall_file)

    async def main() -> None:
        broker = Broker(cfg, observer=observer)
        await listening("--listen", broker.start())
        freeze_startup_objects()
        metrics = None
        try:
            if mhost_port:
                broker.metrics.attach(broker)
                metrics = MetricsServer([broker.metrics.registry], ready=lambda: broker.ready, tls=tls.metrics)
                await listening("--metrics-listen", metrics.start(*mhost_port), metrics_listen)
            await wait_for_signal()
        finally:
            if metrics:
                await metrics.stop()
            await broker.stop()

    run_async(main)


@click.command("local")
@click.option("--data", default="./tidemq-data", show_default=True, type=click.Path(file_okay=False), help="Data directory.")
@click.option("--namesrv-port", default=9876, show_default=True, type=click.IntRange(0, 65535))
@click.option("--broker-port", default=10911, show_default=True, type=click.IntRange(0, 65535))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on and advertise.")
@click.option("--metrics-port", default=9877, show_default=True, type=click.IntRange(0, 65535))
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True)
@click.option("--auto-create-topic/--no-auto-create-topic", default=False, show_default=True)
@click.option("--segment-size", default=1 << 30, show_default=True, type=click.IntRange(min=64 * 1024),
              help="CommitLog segment size in bytes (each segment and the next one are preallocated on disk).")
@click.option("--metrics-queue-lag/--no-metrics-queue-lag", default=False, show_default=True,
              help="Also export consumer lag per queue (one series per group, topic and queue).")
@click.option("--demo", is_flag=True, help="Create topic 'demo', send and consume a few messages.")
@click.option("--exit-after-demo", is_flag=True, help="Stop after the demo instead of serving.")
@click.option("--log-level", default="INFO", show_default=True)
@user_errors
def local_cmd(data, namesrv_port, broker_port, host, metrics_port, flush, auto_create_topic, segment_size, demo,
              exit_after_demo, log_level, metrics_queue_lag: bool = False) -> None:
    """Run a name server and a broker in one process (the embedded cluster)."""
    setup_logging(log_level)
    data_dir = Path(data).expanduser().resolve()

    async def main() -> None:
        ns = NamesrvServer(NamesrvConfig(listen_host=host, listen_port=namesrv_port))
        ns_host, ns_port = await listening("--namesrv-port", ns.start())
        cfg = build_broker_config(
            f"{host}:{ns_port}", f"{host}:{broker_port}", str(data_dir / "store"), "DefaultCluster",
            "broker-a", None, flush, auto_create_topic, segment_size, 72.0,
        )
        cfg = dataclasses.replace(cfg, metrics_queue_lag=metrics_queue_lag)
        broker = Broker(cfg)
        try:
            _h, b_port = await listening("--broker-port", broker.start())
        except BaseException:
            await ns.stop()
            raise
        if b_port != cfg.advertise_port:  # port 0: advertise what we got
            log.warning("broker bound to port %d", b_port)
        broker.metrics.attach(broker)
        registries = [namesrv_registry(ns), broker.metrics.registry]
        metrics = MetricsServer(registries, ready=lambda: broker.ready)
        try:
            m_host, m_port = await listening("--metrics-port", metrics.start(host, metrics_port),
                                             f"{host}:{metrics_port}")
        except BaseException:  # stop cleanly: the next start must not recover from a "crash"
            await broker.stop()
            await ns.stop()
            raise
        ns_addr = f"{host}:{ns_port}"
        click.echo("TideMQ local is running.")
        click.echo(f"  name server : {ns_addr}   (export NAMESRV_ADDR={ns_addr})")
        click.echo(f"  broker      : {cfg.advertise_addr}  (cluster DefaultCluster, broker-a, {flush} flush)")
        click.echo(f"  metrics     : http://{m_host}:{m_port}/metrics  (health: /healthz, /readyz)")
        click.echo(f"  data        : {data_dir}")
        try:
            if demo:
                from tidemq.cli.demo import run_demo  # noqa: PLC0415 (loaded only for --demo)

                await run_demo(ns_addr)
            if not exit_after_demo:
                click.echo("Press Ctrl-C to stop.")
                await wait_for_signal()
        finally:
            await metrics.stop()
            await broker.stop()
            await ns.stop()
            click.echo("TideMQ local stopped.")

    run_async(main)
