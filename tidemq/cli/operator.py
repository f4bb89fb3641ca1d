"""`tidemq operator`: run the kopf operator for Cluster, Topic and ConsumerGroup resources.

Settings come from flags or TIDEMQ_OPERATOR_* environment variables (read here, in the CLI only).
HA: run two or more replicas with ``--peering NAME`` (needs kopf's ClusterKopfPeering/KopfPeering
CRD); replicas with a lower ``--priority`` pause while a higher one is alive. ``--standalone``
turns peering off (one replica, or tests).

kopf's liveness endpoint is on by default (``--liveness``, http://0.0.0.0:8080/healthz), as the
operator runs in a pod whose liveness probe needs it; ``--liveness ''`` turns it off. Before kopf
starts, the Kubernetes API is located and probed (tidemq.cli.kube), so a missing or unreachable
cluster ends in one line, not tracebacks.
"""

from __future__ import annotations

import logging
import os
from urllib.parse import urlsplit

import click

from tidemq.cli.common import parse_listen, run_async, setup_logging

log = logging.getLogger("tidemq.cli")


@click.command("operator")
@click.option("-n", "--namespace", "namespaces", multiple=True, envvar="TIDEMQ_OPERATOR_NAMESPACES",
              help="Namespace to watch (repeatable; glob patterns allowed).")
@click.option("-A", "--all-namespaces", is_flag=True, envvar="TIDEMQ_OPERATOR_ALL_NAMESPACES",
              help="Watch every namespace (cluster-wide).")
@click.option("--liveness", default="http://0.0.0.0:8080/healthz", show_default=True,
              envvar="TIDEMQ_OPERATOR_LIVENESS",
              help="kopf's liveness endpoint (/healthz), on by default for the pod's liveness probe "
                   "(the Helm chart's probe uses it); '' turns it off.")
@click.option("--api-wait", type=click.FloatRange(min=0), default=60.0, show_default=True,
              envvar="TIDEMQ_OPERATOR_API_WAIT",
              help="Seconds to wait at start for the Kubernetes API server to accept connections "
                   "before giving up with an error.")
@click.option("--metrics-listen", default="0.0.0.0:9090", show_default=True,
              envvar="TIDEMQ_OPERATOR_METRICS_LISTEN", help="Prometheus /metrics HOST:PORT ('' off).")
@click.option("--timer-interval", type=float, default=30.0, show_default=True,
              envvar="TIDEMQ_OPERATOR_TIMER_INTERVAL",
              help="Seconds between periodic reconciles (drift, draining, lag).")
@click.option("--drain-grace", type=click.FloatRange(min=0), default=35.0, show_default=True,
              envvar="TIDEMQ_OPERATOR_DRAIN_GRACE",
              help="Topic shrink: seconds between lowering write queues and lowering read queues "
                   "(longer than the clients' 30 s route refresh).")
@click.option("--retry-delay", type=float, default=10.0, show_default=True,
              envvar="TIDEMQ_OPERATOR_RETRY_DELAY", help="Delay before retrying a not-ready cluster.")
@click.option("--delete-retries", type=int, default=5, show_default=True,
              envvar="TIDEMQ_OPERATOR_DELETE_RETRIES",
              help="Retries of a Topic deletion whose cluster is gone before the finalizer is released.")
@click.option("--admin-timeout", type=float, default=30.0, show_default=True,
              envvar="TIDEMQ_OPERATOR_ADMIN_TIMEOUT", help="Bound of one pass of broker calls.")
@click.option("--standalone", is_flag=True, envvar="TIDEMQ_OPERATOR_STANDALONE",
              help="No peering: act even if other replicas run.")
@click.option("--peering", default=None, envvar="TIDEMQ_OPERATOR_PEERING",
              help="kopf peering object name (HA between replicas).")
@click.option("--priority", type=int, default=0, envvar="TIDEMQ_OPERATOR_PRIORITY",
              help="Peering priority of this replica.")
@click.option("--log-level", default="info", show_default=True, envvar="TIDEMQ_LOG_LEVEL")
@click.option("--access-key", default=None, envvar="TIDEMQ_OPERATOR_ACCESS_KEY",
              help="ACL access key of an admin account, for brokers started with --acl-file.")
@click.option("--secret-key", default=None, envvar="TIDEMQ_OPERATOR_SECRET_KEY", show_envvar=True,
              help="Its secret key (prefer the environment variable to the flag).")
@click.option("--tls-ca-file", default=None, type=click.Path(dir_okay=False),
              help="Connect to every cluster's name servers and brokers over TLS, verifying them with this CA bundle (ca.crt).")
@click.option("--cluster-key-file", default=None, envvar="TIDEMQ_OPERATOR_CLUSTER_KEY_FILE",
              type=click.Path(dir_okay=False),
              help="The operator's master key (a mounted Secret): every managed Cluster gets a key derived "
                   "from it, and its name servers accept route changes only when signed with it. "
                   "Unset: they accept them from anyone.")
@click.option("--cluster-key-secret", default=None, envvar="TIDEMQ_OPERATOR_CLUSTER_KEY_SECRET",
              help="Secret (in $POD_NAMESPACE) the operator creates with a new master key when "
                   "--cluster-key-file is missing: mount it at that path (the chart does).")
def operator_cmd(namespaces: tuple[str, ...], all_namespaces: bool, liveness: str, api_wait: float,
                 metrics_listen: str, timer_interval: float, drain_grace: float, retry_delay: float,
                 delete_retries: int, admin_timeout: float, standalone: bool,
                 peering: str | None, priority: int, log_level: str,
                 access_key: str | None = None, secret_key: str | None = None,
                 tls_ca_file: str | None = None, cluster_key_file: str | None = None,
                 cluster_key_secret: str | None = None) -> None:
    """Run the operator (kopf) until SIGINT/SIGTERM."""
    import kopf  # noqa: PLC0415 (optional dependency: pip install 'tidemq[operator]')

    from tidemq.operator.handlers import OperatorConfig, register  # noqa: PLC0415
    from tidemq.operator.metrics import OperatorMetrics  # noqa: PLC0415

    from tidemq.cli.kube import connection_error, find_api, install_log_filter, wait_for_api  # noqa: PLC0415

    if bool(namespaces) == all_namespaces:
        raise click.UsageError("give --namespace (one or more) or --all-namespaces")
    setup_logging(log_level)
    install_log_filter()
    from tidemq.client.config import ClientConfig  # noqa: PLC0415
    from tidemq.errors import ConfigError  # noqa: PLC0415

    try:
        client_config = ClientConfig(access_key=access_key or None, secret_key=secret_key or None,
                                     tls=bool(tls_ca_file), tls_ca_file=tls_ca_file or None)
    except ConfigError as exc:
        raise click.UsageError(f"--access-key/--secret-key: {exc}") from None
    config = OperatorConfig(timer_interval=timer_interval, drain_grace=drain_grace, admin_timeout=admin_timeout,
                            retry_delay=retry_delay, delete_retries=delete_retries,
                            client_config=client_config, cluster_key_file=cluster_key_file or None,
                            cluster_key_secret=cluster_key_secret or None,
                            namespace=os.environ.get("POD_NAMESPACE") or None)
    api = find_api()
    run_async(lambda: wait_for_api(api, api_wait))
    metrics = OperatorMetrics()
    if metrics_listen:
        host, port = parse_listen(metrics_listen, "--metrics-listen")
        try:
            metrics.serve(host, port)
        except OSError as exc:
            raise click.ClickException(_cannot_listen(metrics_listen, "--metrics-listen", exc)) from None
    registry = register(kopf.OperatorRegistry(), config, metrics)
    log.info("tidemq operator: %s, timer every %.1f s, Kubernetes API %s (from %s), liveness %s",
             "all namespaces" if all_namespaces else ", ".join(namespaces), timer_interval,
             api.server, api.source, liveness or "off")
    try:
        kopf.run(
            registry=registry,
            clusterwide=all_namespaces,
            namespaces=list(namespaces),
            standalone=standalone or None,
            peering_name=peering,
            priority=priority,
            liveness_endpoint=liveness or None,
        )
    except Exception as exc:  # noqa: BLE001 (kopf ends with whatever stopped it)
        err = connection_error(exc)
        if err is None:
            raise
        if liveness and isinstance(err, OSError) and "bind" in str(err):
            u = urlsplit(liveness)
            raise click.ClickException(_cannot_listen(f"{u.hostname}:{u.port}", "--liveness", err)) from None
        raise click.ClickException(f"the Kubernetes API at {api.server} (from {api.source}) failed: "
                                   f"{err}; the operator stopped (in a pod it is restarted)") from None


def _cannot_listen(address: str, option: str, exc: OSError) -> str:
    from tidemq.remoting.transport import ListenError  # noqa: PLC0415

    host, _, port = address.rpartition(":")
    err = ListenError(host, int(port or 0), exc)
    return f"cannot listen on {address} ({option}): {err.reason}; {err.advice(option)}"
