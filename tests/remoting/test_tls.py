"""TLS on the remoting and metrics ports (matrix row S3): modes, verification, reload, real processes.

Certificates come from ``trustme`` (a throw-away CA per test); every server listens on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
import warnings
from pathlib import Path

import pytest
import trustme

from tests.cli.clirun import tidemq
from tests.procs import ServerProcess, free_port, tidemq_cmd, wait_port
from tidemq.client.config import ClientConfig
from tidemq.client.route import MessageQueue
from tidemq.client.sync import SyncAdmin, SyncProducer, SyncPullConsumer
from tidemq.client.instance import ClientInstance
from tidemq.errors import ConfigError, ConnectError, RemotingError, TideMQError
from tidemq.message import Message
from tidemq.monitoring import MetricsServer
from tidemq.remoting import RemotingClient, RemotingCommand, RemotingServer, RequestCode, ResponseCode
from tidemq.remoting.transport import TLS_MAYBE_NOT_SERVED, TLS_MAYBE_REQUIRED
from tidemq.remoting.tls import ClientTlsConfig, ServerTlsConfig, TlsMode, client_context


class Echo:
    def handle(self, conn, cmd):
        return cmd.response(ResponseCode.SUCCESS, remark="pong")

    def connection_lost(self, conn):
        pass


def write_pair(ca: trustme.CA, root: Path, name: str = "server", hosts=("127.0.0.1", "localhost")):
    cert = ca.issue_cert(*hosts)
    crt, key = root / f"{name}.crt", root / f"{name}.key"
    cert.cert_chain_pems[0].write_to_path(str(crt))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(crt), append=True)
    cert.private_key_pem.write_to_path(str(key))
    return str(crt), str(key)


def write_ca(ca: trustme.CA, root: Path, name: str = "ca.crt") -> str:
    path = root / name
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture
def pki(tmp_path):
    ca = trustme.CA()
    crt, key = write_pair(ca, tmp_path)
    return {"ca": ca, "ca_file": write_ca(ca, tmp_path), "crt": crt, "key": key, "root": tmp_path}


async def ping(client: RemotingClient, addr: str, timeout: float = 5.0) -> RemotingCommand:
    return await client.invoke(addr, RemotingCommand.request(RequestCode.HEART_BEAT), timeout)


def tls_client(ca_file: str | None, server_name: str | None = None, verify_hostname: bool = True):
    ctx = client_context(ClientTlsConfig(True, ca_file, server_name, verify_hostname))
    return RemotingClient(ssl_context=ctx, server_name=server_name, connect_timeout=5.0)


async def serve(mode: str, pki, **kw) -> tuple[RemotingServer, str]:
    cfg = ServerTlsConfig(mode, pki["crt"], pki["key"], **kw) if mode != "disabled" else None
    server = RemotingServer(Echo(), tls=cfg)
    host, port = await server.start("127.0.0.1", 0)
    return server, f"{host}:{port}"


async def refused(client: RemotingClient, addr: str) -> bool:
    try:
        await ping(client, addr, timeout=2.0)
    except (RemotingError, ConnectError):
        return True
    return False


async def test_enforcing_serves_tls_and_closes_plaintext(pki):
    server, addr = await serve("enforcing", pki)
    good, plain = tls_client(pki["ca_file"]), RemotingClient(connect_timeout=2.0)
    try:
        resp = await ping(good, addr)
        assert resp.code == ResponseCode.SUCCESS and resp.remark == "pong"
        conn = await good.connection(addr)
        version = conn.transport.get_extra_info("ssl_object").version()
        assert version in ("TLSv1.2", "TLSv1.3")
        with pytest.raises(ConnectError):  # closed by the server, not left to time out
            await ping(plain, addr, timeout=10.0)
    finally:
        await good.close()
        await plain.close()
        await server.stop()


def test_a_tls_mismatch_says_the_peer_may_require_tls_or_not_serve_it(pki):
    """A plaintext client on a TLS-only port used to get "connection ... closed"; a TLS client on a
    plaintext port "cannot connect to ...: " with an empty reason. Both now name TLS."""
    async def main():
        tls_server, tls_addr = await serve("enforcing", pki)
        plain_server, plain_addr = await serve("disabled", pki)
        plain, tls = RemotingClient(connect_timeout=2.0), tls_client(pki["ca_file"])
        try:
            with pytest.raises(ConnectError) as to_tls:
                await ping(plain, tls_addr, timeout=10.0)
            with pytest.raises(ConnectError) as to_plain:
                await ping(tls, plain_addr, timeout=10.0)
        finally:
            await plain.close()
            await tls.close()
            await tls_server.stop()
            await plain_server.stop()
        return str(to_tls.value), str(to_plain.value)

    for loop_kind in ("asyncio", "uvloop"):
        to_tls, to_plain = run_on(loop_kind, main)
        assert TLS_MAYBE_REQUIRED in to_tls and "closed before any answer" in to_tls, to_tls
        assert TLS_MAYBE_NOT_SERVED in to_plain and "TLS handshake with" in to_plain, to_plain
        assert "()" not in to_plain and not to_plain.rstrip().endswith(":"), to_plain


async def test_disabled_closes_tls_and_serves_plaintext(pki):
    server, addr = await serve("disabled", pki)
    good, tls = RemotingClient(connect_timeout=2.0), tls_client(pki["ca_file"])
    try:
        assert (await ping(good, addr)).code == ResponseCode.SUCCESS
        assert await refused(tls, addr), "a TLS client must not get through a plaintext-only port"
    finally:
        await good.close()
        await tls.close()
        await server.stop()


def run_on(loop_kind: str, coro_fn):
    if loop_kind == "uvloop":  # the servers' CLI runs on uvloop
        uvloop = pytest.importorskip("uvloop")
        return uvloop.run(coro_fn())
    return asyncio.run(coro_fn())


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_permissive_serves_both_on_one_port(pki, loop_kind):
    async def main():
        server, addr = await serve("permissive", pki)
        plain, tls = RemotingClient(connect_timeout=2.0), tls_client(pki["ca_file"])
        try:
            for _ in range(3):  # several requests on each connection, interleaved
                assert (await ping(plain, addr)).code == ResponseCode.SUCCESS
                assert (await ping(tls, addr)).code == ResponseCode.SUCCESS
            assert (await plain.connection(addr)).transport.get_extra_info("ssl_object") is None
            assert (await tls.connection(addr)).transport.get_extra_info("ssl_object") is not None
            assert len(server.connections) == 2
            # a connection that sends nothing and closes is dropped without serving anything
            r, w = await asyncio.open_connection(*addr.split(":"))
            w.close()
            await asyncio.sleep(0.1)
            assert len(server.connections) == 2
        finally:
            await plain.close()
            await tls.close()
            await server.stop()

    run_on(loop_kind, main)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
@pytest.mark.parametrize("mode", ["enforcing", "permissive"])
def test_failed_handshakes_leave_no_connection_behind(pki, mode, loop_kind):
    """asyncio never tells a protocol that its TLS handshake failed: the server must not count such
    connections (they would pile up against the connection limit). Nor may descriptors leak."""
    other_ca = write_ca(trustme.CA(), pki["root"], "other-ca.crt")

    async def main():
        server, addr = await serve(mode, pki)
        fds = len(os.listdir("/proc/self/fd"))
        try:
            for _ in range(10):
                bad = [tls_client(other_ca)] + ([RemotingClient(connect_timeout=2.0)] if mode == "enforcing" else [])
                for client in bad:
                    assert await refused(client, addr)
                    await client.close()
            await asyncio.sleep(0.3)
            assert len(server.connections) == 0
            assert len(os.listdir("/proc/self/fd")) <= fds + 2
            good = tls_client(pki["ca_file"])
            assert (await ping(good, addr)).code == ResponseCode.SUCCESS
            assert len(server.connections) == 1
            await good.close()
        finally:
            await server.stop()

    run_on(loop_kind, main)


async def test_client_verifies_the_ca_and_the_hostname_by_default(pki):
    other_ca = write_ca(trustme.CA(), pki["root"], "other-ca.crt")

    server, addr = await serve("enforcing", pki)
    clients = {
        "system trust store": tls_client(None),
        "another CA": tls_client(other_ca),
        "wrong name": tls_client(pki["ca_file"], server_name="broker.example.org"),
    }
    try:
        for what, client in clients.items():
            with pytest.raises(ConnectError, match="certificate"):
                await ping(client, addr)
        # the name can be overridden (pods dialled by IP), and is then checked
        ok = tls_client(pki["ca_file"], server_name="localhost")
        assert (await ping(ok, addr)).code == ResponseCode.SUCCESS
        await ok.close()
    finally:
        for client in clients.values():
            await client.close()
        await server.stop()


async def test_contexts_refuse_old_protocols_and_have_no_trust_all_default(pki):
    ctx = client_context(ClientTlsConfig(True, pki["ca_file"]))
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert client_context(ClientTlsConfig()) is None
    cfg = ClientConfig(tls=True)
    assert cfg.tls_verify_hostname and cfg.tls_ca_file is None  # system store, still verified
    inst = ClientInstance(ClientConfig(tls=True, tls_ca_file=pki["ca_file"]))
    assert inst.remoting.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert inst.remoting.ssl_context.minimum_version >= ssl.TLSVersion.TLSv1_2

    # a client capped at TLS 1.1 gets no session
    server, addr = await serve("enforcing", pki)
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(pki["ca_file"])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            old.maximum_version = ssl.TLSVersion.TLSv1_1
    except (ValueError, ssl.SSLError):
        pytest.skip("this OpenSSL cannot even build a TLS 1.1 client")
    client = RemotingClient(ssl_context=old, connect_timeout=2.0)
    try:
        assert await refused(client, addr)
    finally:
        await client.close()
        await server.stop()


def test_unknown_mode_and_missing_files_are_config_errors(pki):
    with pytest.raises(ConfigError, match="not one of disabled, permissive, enforcing"):
        ServerTlsConfig("strict", pki["crt"], pki["key"])
    assert TlsMode.parse("Enforcing") is TlsMode.ENFORCING
    with pytest.raises(ConfigError, match="certificate file and a key file"):
        ServerTlsConfig("permissive")
    with pytest.raises(ConfigError, match="not found"):
        RemotingServer(Echo(), tls=ServerTlsConfig("enforcing", pki["crt"] + ".missing", pki["key"]))
    with pytest.raises(ConfigError, match="tls is off"):
        ClientConfig(tls_ca_file=pki["ca_file"])
    # the CLI refuses an unknown mode at startup (RocketMQ would fall back to permissive)
    r = subprocess.run(tidemq_cmd("namesrv", "--listen", "127.0.0.1:0", "--tls-mode", "strict"),
                       capture_output=True, timeout=30)
    assert r.returncode == 2 and b"strict" in r.stderr
    r = subprocess.run(tidemq_cmd("namesrv", "--listen", "127.0.0.1:0", "--tls-mode", "enforcing"),
                       capture_output=True, timeout=30)
    assert r.returncode != 0 and b"certificate file and a key file" in r.stderr


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_certificate_files_are_reloaded_when_they_change(pki, loop_kind):
    new_ca = trustme.CA()
    new_ca_file = write_ca(new_ca, pki["root"], "new-ca.crt")
    staged = pki["root"] / "staged"
    staged.mkdir()
    new_crt, new_key = write_pair(new_ca, staged)

    async def main():
        server, addr = await serve("permissive", pki, reload_interval=0.1)
        old_client, new_client = tls_client(pki["ca_file"]), tls_client(new_ca_file)
        try:
            assert (await ping(old_client, addr)).code == ResponseCode.SUCCESS
            assert await refused(new_client, addr)
            # rotate as a Secret update would: both files replaced atomically
            os.replace(new_key, pki["key"])
            os.replace(new_crt, pki["crt"])
            deadline = time.monotonic() + 5
            while server.tls.reloads == 0:
                assert time.monotonic() < deadline, "the new certificate was never loaded"
                await asyncio.sleep(0.05)
            await new_client.close()
            new_client = tls_client(new_ca_file)
            assert (await ping(new_client, addr)).code == ResponseCode.SUCCESS
            # the established connection keeps working; a new one with the old CA is refused
            assert (await ping(old_client, addr)).code == ResponseCode.SUCCESS
            assert await refused(tls_client(pki["ca_file"]), addr)
            # a broken file keeps the current certificate
            Path(pki["crt"]).write_text("not a certificate")
            await asyncio.sleep(0.4)
            assert server.tls.reloads == 1
            fresh = tls_client(new_ca_file)
            assert (await ping(fresh, addr)).code == ResponseCode.SUCCESS
            await fresh.close()
            # a non-atomic rotation: the certificate arrives before its key (they do not match yet)
            third_ca = trustme.CA()
            third_ca_file = write_ca(third_ca, pki["root"], "third-ca.crt")
            third_crt, third_key = write_pair(third_ca, staged, "third")
            os.replace(third_crt, pki["crt"])
            await asyncio.sleep(0.4)
            assert server.tls.reloads == 1
            fresh = tls_client(new_ca_file)
            assert (await ping(fresh, addr)).code == ResponseCode.SUCCESS  # still the current pair
            await fresh.close()
            os.replace(third_key, pki["key"])
            deadline = time.monotonic() + 5
            while server.tls.reloads == 1:
                assert time.monotonic() < deadline, "the completed pair was never loaded"
                await asyncio.sleep(0.05)
            fresh = tls_client(third_ca_file)
            assert (await ping(fresh, addr)).code == ResponseCode.SUCCESS
            await fresh.close()
        finally:
            await old_client.close()
            await new_client.close()
            await server.stop()

    run_on(loop_kind, main)


async def test_metrics_endpoint_over_https(pki):
    server = MetricsServer([], tls=ServerTlsConfig("enforcing", pki["crt"], pki["key"]))
    host, port = await server.start("127.0.0.1", 0)
    try:
        ctx = ssl.create_default_context(cafile=pki["ca_file"])

        def fetch(url, context=None):
            with urllib.request.urlopen(url, timeout=3, context=context) as r:
                return r.status, r.read()

        status, body = await asyncio.to_thread(fetch, f"https://{host}:{port}/healthz", ctx)
        assert status == 200 and body == b"ok\n"
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            await asyncio.to_thread(fetch, f"http://{host}:{port}/healthz")
        with pytest.raises(urllib.error.URLError):  # not trusted without the CA
            await asyncio.to_thread(fetch, f"https://{host}:{port}/healthz",
                                    ssl.create_default_context())
    finally:
        await server.stop()


def test_real_processes_enforcing_namesrv_and_broker(pki, tmp_path):
    """Name server and broker processes with TLS only (remoting and metrics); the broker registers
    over TLS; our client creates a topic, sends and pulls over TLS; plaintext gets nothing."""
    tls_args = ["--tls-mode", "enforcing", "--tls-cert-file", pki["crt"], "--tls-key-file", pki["key"],
                "--tls-ca-file", pki["ca_file"], "--metrics-tls"]
    ns_port, ns_metrics, b_port, b_metrics = free_port(), free_port(), free_port(), free_port()
    ns = ServerProcess(tidemq_cmd("namesrv", "--listen", f"127.0.0.1:{ns_port}",
                                  "--metrics-listen", f"127.0.0.1:{ns_metrics}", *tls_args),
                       tmp_path / "namesrv.log")
    broker = ServerProcess(tidemq_cmd("broker", "--namesrv", f"127.0.0.1:{ns_port}", "--namesrv-tls",
                                      "--listen", f"127.0.0.1:{b_port}", "--store", str(tmp_path / "store"),
                                      "--metrics-listen", f"127.0.0.1:{b_metrics}", "--register-interval", "1",
                                      "--segment-size", str(4 << 20), *tls_args),
                           tmp_path / "broker.log")
    ns_addr = f"127.0.0.1:{ns_port}"
    ctx = ssl.create_default_context(cafile=pki["ca_file"])
    try:
        ns.start()
        wait_port(ns_port, timeout=60)  # the broker registers at start (and then every second)
        broker.start()
        wait_port(b_metrics, timeout=60)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{b_metrics}/readyz", timeout=1, context=ctx) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, broker.log()[-2000:]
            time.sleep(0.1)
        cfg = ClientConfig(tls=True, tls_ca_file=pki["ca_file"], request_timeout=5.0)
        topic = "Tls_" + uuid.uuid4().hex[:6]
        with SyncAdmin(ns_addr, cfg) as admin:
            deadline = time.monotonic() + 15
            while not admin.cluster_info().broker_addr_table:
                assert time.monotonic() < deadline, "the broker never registered over TLS\n" + broker.log()[-2000:]
                time.sleep(0.1)
            admin.create_topic(topic, 2, 2, cluster="DefaultCluster")
            deadline = time.monotonic() + 15
            while True:
                try:
                    if len(admin.topic_route(topic).publish_queues(topic)) == 2:
                        break
                except TideMQError:  # no route yet: the broker registers the topic asynchronously
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.1)
        with SyncProducer("tls_pg", ns_addr, cfg) as producer:
            result = producer.send(Message(topic, b"over tls"), queue=MessageQueue(topic, "broker-a", 0))
            assert result.status.name == "SEND_OK"
        with SyncPullConsumer("tls_cg", ns_addr, cfg) as consumer:
            got = consumer.pull(MessageQueue(topic, "broker-a", 0), 0)
            assert [m.body for m in got.messages] == [b"over tls"]
        # the CLI: TLS from the environment, refused without it
        tls_env = {"TIDEMQ_TLS": "1", "TIDEMQ_TLS_CA_FILE": pki["ca_file"]}
        sent = tidemq("send", "-n", ns_addr, "-t", topic, "-b", "cli over tls", env=tls_env, timeout=60)
        assert sent.rc == 0, sent.err
        got = tidemq("consume", "-n", ns_addr, "-t", topic, "-g", "tls_cli_cg", "--from-beginning", "-c", "2",
                     env=tls_env, timeout=60)
        assert got.rc == 0 and "over tls" in got.out and "cli over tls" in got.out, got.err
        plain = tidemq("admin", "clusterList", "-n", ns_addr, env={"TIDEMQ_TLS": None}, timeout=60)
        assert plain.rc != 0 and "Traceback" not in plain.err
        assert "may require TLS" in plain.err and "set TIDEMQ_TLS=1" in plain.err, plain.err
        bad = tidemq("admin", "clusterList", "-n", ns_addr, env={"TIDEMQ_TLS_CA_FILE": pki["ca_file"]})
        assert bad.rc == 2 and "TIDEMQ_TLS=1" in bad.err
        # a plaintext client gets nothing from either port
        with SyncAdmin(ns_addr, ClientConfig(request_timeout=1.0, connect_timeout=1.0)) as plain:
            with pytest.raises(TideMQError):  # connection closed (or, on a loaded machine, a timeout)
                plain.topic_list()
        metrics = urllib.request.urlopen(f"https://127.0.0.1:{b_metrics}/metrics", timeout=3, context=ctx).read()
        assert b"tidemq_broker" in metrics
        # a broker registering in plaintext is told how to turn TLS on
        plain_broker = ServerProcess(tidemq_cmd(
            "broker", "--namesrv", ns_addr, "--listen", f"127.0.0.1:{free_port()}", "--broker-name", "broker-plain",
            "--store", str(tmp_path / "plain-store"), "--segment-size", str(1 << 20), "--register-interval", "1"),
            tmp_path / "plain-broker.log")
        try:
            plain_broker.start()
            deadline = time.monotonic() + 30
            while "--namesrv-tls" not in plain_broker.log():
                assert time.monotonic() < deadline and plain_broker.proc.poll() is None, plain_broker.log()[-2000:]
                time.sleep(0.1)
            line = next(x for x in plain_broker.log().splitlines() if "--namesrv-tls" in x)
            assert "WARNING" in line and "may require TLS" in line and "--tls-ca-file" in line, line
        finally:
            plain_broker.stop()
    finally:
        broker.stop()
        ns.stop()
