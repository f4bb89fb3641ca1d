"""`tidemq operator`: run the kopf operator for Cluster, Topic and ConsumerGroup resources.

Settings come from flags or TIDEMQ_OPERATOR_* environment variables (read here, in the CLI only).

HA (tidemq.operator.leader): replicas elect a leader on a coordination.k8s.io Lease
(``--leader-lease``, in ``--leader-lease-namespace``, held by ``--leader-identity``, the pod name);
only the leader runs kopf. A leader whose renewal fails past ``--renew-deadline`` exits at once
with status 1 instead of stopping kopf gracefully: kopf keeps per-object state in memory and lets
running handlers (and their API calls in worker threads) finish, and nothing may write once
another replica can lead; a process exit ends every thread, and the pod restarts as a standby
(controller-runtime managers do the same). ``--no-leader-election`` (or ``--standalone``) runs kopf
at once: one replica only, or tests.

Health (``--liveness``, on by default at http://0.0.0.0:8080/healthz, tidemq.operator.probes):
/healthz answers while the process serves, /readyz only while this replica leads. Before kopf
starts, the Kubernetes API is located and probed (tidemq.cli.kube), so a missing or unreachable
cluster ends in one line, not tracebacks. ``--manage-crds`` lets the leader create or upgrade the
CRDs before kopf starts (tidemq.operator.crdupgrade; Helm never upgrades a chart's crds/).

``tidemq operator cleanup`` deletes a Helm release's Topics and ConsumerGroups (the chart's
pre-delete hook, tidemq.operator.cleanup).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import uuid
from typing import Any, NoReturn
from urllib.parse import urlsplit

import click

from tidemq.cli.common import parse_listen, run_async, setup_logging

log = logging.getLogger("tidemq.cli")


def _peering_gone(_ctx: click.Context, param: click.Parameter, value: object) -> None:
    if value not in (None, 0, ()):
        raise click.UsageError(f"{param.opts[0]}: kopf peering was replaced by Lease leader election "
                               "(on by default: see --leader-lease); drop this option")


@click.group("operator", invoke_without_command=True)
@click.option("-n", "--namespace", "namespaces", multiple=True, envvar="TIDEMQ_OPERATOR_NAMESPACES",
              help="Namespace to watch (repeatable; glob patterns allowed).")
@click.option("-A", "--all-namespaces", is_flag=True, envvar="TIDEMQ_OPERATOR_ALL_NAMESPACES",
              help="Watch every namespace (cluster-wide).")
@click.option("--liveness", default="http://0.0.0.0:8080/healthz", show_default=True,
              envvar="TIDEMQ_OPERATOR_LIVENESS",
              help="Health endpoint, on by default for the pod's probes (the Helm chart's use it): "
                   "/healthz (liveness) and /readyz (ready while this replica leads) on its host:port; "
                   "'' turns it off.")
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
@click.option("--leader-election/--no-leader-election", default=True, show_default=True,
              envvar="TIDEMQ_OPERATOR_LEADER_ELECTION",
              help="Elect a leader among replicas on a Lease; only the leader reconciles.")
@click.option("--standalone", is_flag=True, envvar="TIDEMQ_OPERATOR_STANDALONE",
              help="Same as --no-leader-election: act at once (one replica, or tests).")
@click.option("--leader-lease", default="tidemq-operator", show_default=True,
              envvar="TIDEMQ_OPERATOR_LEADER_LEASE", help="Name of the leader election's Lease.")
@click.option("--leader-lease-namespace", default=None, envvar="TIDEMQ_OPERATOR_LEADER_LEASE_NAMESPACE",
              help="Namespace of the Lease [default: $POD_NAMESPACE, else default].")
@click.option("--leader-identity", default=None, envvar="TIDEMQ_OPERATOR_LEADER_IDENTITY",
              help="This replica's name in the Lease [default: $POD_NAME, else host name + random suffix].")
@click.option("--lease-duration", type=click.IntRange(min=2), default=15, show_default=True,
              envvar="TIDEMQ_OPERATOR_LEASE_DURATION",
              help="Seconds a leader's claim lasts: a standby takes over this long after the last renewal "
                   "it saw (a clean stop releases the Lease at once).")
@click.option("--renew-deadline", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              envvar="TIDEMQ_OPERATOR_RENEW_DEADLINE",
              help="Seconds the leader keeps acting without a successful renewal before it exits "
                   "(less than --lease-duration).")
@click.option("--retry-period", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True,
              envvar="TIDEMQ_OPERATOR_RETRY_PERIOD",
              help="Seconds between renewals, and between a standby's attempts (less than --renew-deadline).")
@click.option("--manage-crds/--no-manage-crds", default=False, show_default=True,
              envvar="TIDEMQ_OPERATOR_MANAGE_CRDS",
              help="At start (as leader), create the TideMQ CRDs or upgrade them when the installed ones "
                   "are older; never downgrade (needs get/create/patch on customresourcedefinitions).")
@click.option("--peering", default=None, hidden=True, expose_value=False, callback=_peering_gone)
@click.option("--priority", type=int, default=None, hidden=True, expose_value=False, callback=_peering_gone)
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
@click.pass_context
def operator_cmd(ctx: click.Context, namespaces: tuple[str, ...], all_namespaces: bool, liveness: str,
                 api_wait: float, metrics_listen: str, timer_interval: float, drain_grace: float,
                 retry_delay: float, delete_retries: int, admin_timeout: float, leader_election: bool,
                 standalone: bool, leader_lease: str, leader_lease_namespace: str | None,
                 leader_identity: str | None, lease_duration: int, renew_deadline: float,
                 retry_period: float, manage_crds: bool, log_level: str,
                 access_key: str | None = None, secret_key: str | None = None,
                 tls_ca_file: str | None = None, cluster_key_file: str | None = None,
                 cluster_key_secret: str | None = None) -> None:
    """Run the operator (kopf) until SIGINT/SIGTERM."""
    if ctx.invoked_subcommand is not None:
        return
    import kopf  # noqa: PLC0415 (optional dependency: pip install 'tidemq[operator]')

    from tidemq.operator.handlers import OperatorConfig, register  # noqa: PLC0415
    from tidemq.operator.leader import LeaderConfig  # noqa: PLC0415
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
    leader = None
    if leader_election and not standalone:
        try:
            leader = LeaderConfig(
                name=leader_lease, namespace=leader_lease_namespace or os.environ.get("POD_NAMESPACE") or "default",
                identity=leader_identity or os.environ.get("POD_NAME")
                or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}",
                lease_duration=lease_duration, renew_deadline=renew_deadline, retry_period=retry_period)
        except ValueError as exc:
            raise click.UsageError(f"--leader-lease/--lease-duration/--renew-deadline/--retry-period: {exc}") from None
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
    log.info("tidemq operator: %s, timer every %.1f s, Kubernetes API %s (from %s), health %s, %s",
             "all namespaces" if all_namespaces else ", ".join(namespaces), timer_interval,
             api.server, api.source, liveness or "off",
             f"leader election on Lease {leader.namespace}/{leader.name} as {leader.identity}" if leader
             else "no leader election")

    async def run_kopf() -> None:
        await kopf.operator(registry=registry, clusterwide=all_namespaces, namespaces=list(namespaces),
                            standalone=True, liveness_endpoint=None)

    try:
        run_async(lambda: _serve(run_kopf, leader, liveness, manage_crds))
    except click.ClickException:
        raise
    except Exception as exc:  # noqa: BLE001 (kopf ends with whatever stopped it)
        err = connection_error(exc)
        if err is None:
            raise
        raise click.ClickException(f"the Kubernetes API at {api.server} (from {api.source}) failed: "
                                   f"{err}; the operator stopped (in a pod it is restarted)") from None


@operator_cmd.command("cleanup")
@click.option("--release", required=True, envvar="TIDEMQ_CLEANUP_RELEASE",
              help="The Helm release whose Topics and ConsumerGroups go (label app.kubernetes.io/instance).")
@click.option("--namespace", "namespace", default=None, envvar="TIDEMQ_CLEANUP_NAMESPACE",
              help="Their namespace [default: $POD_NAMESPACE, else default].")
@click.option("--timeout", type=click.FloatRange(min=0), default=120.0, show_default=True,
              envvar="TIDEMQ_CLEANUP_TIMEOUT",
              help="Seconds to wait for the operator to delete the topics on the brokers before the "
                   "finalizers of those left are released (with a Warning Event).")
@click.option("--log-level", default="info", show_default=True, envvar="TIDEMQ_LOG_LEVEL")
def cleanup_cmd(release: str, namespace: str | None, timeout: float, log_level: str) -> None:
    """Delete a release's Topics and ConsumerGroups and wait for them (Helm pre-delete hook)."""
    from tidemq.operator.cleanup import Cleanup  # noqa: PLC0415

    setup_logging(log_level)
    ns = namespace or os.environ.get("POD_NAMESPACE") or "default"
    try:
        result = Cleanup(_kube_client(), ns, release, timeout).run()
    except Exception as exc:  # noqa: BLE001 (API refused or unreachable: one line, the hook fails)
        reason = getattr(exc, "reason", None) or exc
        raise click.ClickException(f"cleanup of release {release} in {ns} failed: {reason}; "
                                   "re-run it (helm uninstall again), or delete the Topics by hand") from None
    click.echo(f"release {release} in {ns}: {len(result.deleted)} deleted, "
               f"{len(result.released)} finalizers released, {len(result.remaining)} left")
    for key in result.released:
        click.echo(f"  released {key}: the topic may remain on the brokers")


def _kube_client() -> Any:
    """A ``kubernetes.client.ApiClient`` of its own: the pod's service account, else the kubeconfig."""
    import kubernetes  # noqa: PLC0415 (optional dependency: the operator extra)

    cfg = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=cfg)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=cfg)
    return kubernetes.client.ApiClient(cfg)


async def _serve(run_kopf: Any, leader: Any, liveness: str, manage_crds: bool) -> None:
    """Health endpoints, then (as leader, when electing) the CRD upgrade and kopf."""
    from tidemq.operator import crdupgrade  # noqa: PLC0415
    from tidemq.operator.leader import KubernetesLeaseStore, LeaderElector, LeadershipLost  # noqa: PLC0415
    from tidemq.operator.probes import HealthServer  # noqa: PLC0415

    from tidemq import __version__  # noqa: PLC0415

    client = _kube_client() if (leader or manage_crds) else None
    elector = store = None
    if leader is not None:
        store = KubernetesLeaseStore(client, leader.name, leader.namespace, leader.request_timeout)
        elector = LeaderElector(leader, store)
    running = [False]  # without an election: ready once kopf runs

    async def lead() -> None:
        if manage_crds:
            try:
                await asyncio.to_thread(crdupgrade.ensure_crds, client, __version__)
            except Exception as exc:  # noqa: BLE001 (kopf still runs with the CRDs installed)
                log.error("cannot create or upgrade the CRDs (%s); running with the installed ones: "
                          "grant get/create/patch on customresourcedefinitions, or --no-manage-crds", exc)
        running[0] = True
        await run_kopf()

    health = None
    if liveness:
        u = urlsplit(liveness)
        health = HealthServer(u.hostname or "0.0.0.0", u.port or 80,
                              leading=(lambda: elector.leading) if elector else (lambda: running[0]),
                              standby_reason=lambda: f"{elector.holder or 'nobody'} leads" if elector else "starting",
                              standing_by=elector.standing_by if elector else (lambda: False))
        try:
            await health.start()
        except OSError as exc:
            raise click.ClickException(_cannot_listen(f"{u.hostname}:{u.port}", "--liveness", exc)) from None
    # Until kopf takes SIGINT/SIGTERM over (it does when it starts), a signal ends the wait here.
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: main.cancel() if main else None)
    try:
        if elector is None:
            await lead()
        else:
            try:
                await elector.run(lead)
            except LeadershipLost as exc:
                log.error("%s: stopped reconciling; exiting so that the pod restarts as a standby", exc)
                _exit_now(1)
    except asyncio.CancelledError:
        log.info("tidemq operator stopped")
    finally:
        if health is not None:
            await health.close()
        if store is not None:
            store.close()


def _exit_now(code: int) -> NoReturn:
    """End the process without waiting for anything: worker threads may be mid-way through an API
    call of a handler, and a normal exit (asyncio.run's shutdown) would wait for them."""
    logging.shutdown()
    os._exit(code)


def _cannot_listen(address: str, option: str, exc: OSError) -> str:
    from tidemq.remoting.transport import ListenError  # noqa: PLC0415

    host, _, port = address.rpartition(":")
    err = ListenError(host, int(port or 0), exc)
    return f"cannot listen on {address} ({option}): {err.reason}; {err.advice(option)}"
