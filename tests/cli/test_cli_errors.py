"""Wrong or missing flags, bad config files and unreachable servers: every one ends with a non-zero
exit, one `Error: ...` line on stderr and no Python traceback. No cluster needed; the commands run
concurrently (each is a real `tidemq` process)."""

from __future__ import annotations

import socket

import pytest

from tests.cli.clirun import assert_clean_failure, tidemq_parallel
from tests.procs import free_port

NS = "127.0.0.1:9"  # never contacted: these fail while parsing flags


def _cases(tmp, held: int) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    busy = f"127.0.0.1:{held}"  # another process holds this port
    store = str(tmp / "store")  # in case a broker ever got as far as opening its store
    (tmp / "no-equals.conf").write_text("brokerName broker-x\n")
    (tmp / "broken.toml").write_text("broker-name = [\n")
    (tmp / "bad-port.conf").write_text("listenPort=abc\n")
    missing = str(tmp / "missing.conf")
    return {
        "missing-topic": (("admin", "updateTopic", "-n", NS, "-c", "C"), ("Missing option", "-t")),
        "both-c-and-b": (("admin", "updateTopic", "-n", NS, "-c", "C", "-b", "127.0.0.1:1", "-t", "T"), ("exactly one of -c", "-b")),
        "neither-c-nor-b": (("admin", "updateTopic", "-n", NS, "-t", "T"), ("exactly one of -c", "-b")),
        "zero-read-queues": (("admin", "updateTopic", "-n", NS, "-c", "C", "-t", "T", "-r", "0"), ("-r", "0 is not in the range")),
        "perm-5": (("admin", "updateTopic", "-n", NS, "-c", "C", "-t", "T", "-p", "5"), ("--perm", "'5'")),
        "order-not-bool": (("admin", "updateTopic", "-n", NS, "-c", "C", "-t", "T", "-o", "maybe"), ("-o", "maybe")),
        "attributes-no-sign": (("admin", "updateTopic", "-n", NS, "-c", "C", "-t", "T", "-a", "message.type=FIFO"),
                               ("--attributes", "message.type=FIFO", "+key=value")),
        "attributes-twice": (("admin", "updateTopic", "-n", NS, "-c", "C", "-t", "T", "-a", "+a=1,-a"), ("--attributes", "twice")),
        "missing-namesrv": (("admin", "clusterList"), ("Missing option", "-n")),
        "namesrv-bad-listen": (("namesrv", "--listen", "foo:bar"), ("--listen", "foo:bar")),
        "broker-bad-listen": (("broker", "--listen", "nope", "--store", store), ("--listen", "nope")),
        "broker-bad-namesrv": (("broker", "--namesrv", "host-without-port", "--store", store), ("--namesrv",)),
        "unknown-admin-command": (("admin", "bogusCmd", "-n", NS), ("No such command", "bogusCmd")),
        "unknown-command": (("bogus",), ("No such command", "bogus")),
        "unreachable-namesrv": (("admin", "topicList", "-n", dead), ("no name server answered", dead)),
        "unreachable-namesrv-send": (("send", "-n", dead, "-t", "T", "-b", "x"), (dead,)),
        "send-empty-body": (("send", "-n", NS, "-t", "T"), ("body is empty",)),
        "config-not-key-value": (("broker", "--config", str(tmp / "no-equals.conf"), "--store", store), ("--config", "expected key=value")),
        "config-bad-toml": (("broker", "--config", str(tmp / "broken.toml"), "--store", store), ("--config", "not valid TOML")),
        "config-bad-port": (("broker", "--config", str(tmp / "bad-port.conf"), "--store", store), ("--listen", "abc")),
        "config-missing": (("broker", "--config", missing, "--store", store), ("--config", "cannot read", "No such file")),
        # a port in use names the option that picks another
        "namesrv-port-in-use": (("namesrv", "--listen", busy), (f"cannot listen on {busy} (--listen)", "pick a free port with --listen")),
        "namesrv-metrics-port-in-use": (("namesrv", "--listen", f"127.0.0.1:{free_port()}", "--metrics-listen", busy),
                                        ("(--metrics-listen)", "pick a free port with --metrics-listen")),
        "broker-port-in-use": (("broker", "--listen", busy, "--store", str(tmp / "busy-store"), "--segment-size", str(1 << 20),
                                "--namesrv", dead), ("(--listen)", "pick a free port with --listen")),
        "local-namesrv-port-in-use": (("local", "--data", str(tmp / "local-a"), "--namesrv-port", str(held), "--broker-port", "0",
                                       "--metrics-port", "0", "--segment-size", str(1 << 20)), ("pick a free port with --namesrv-port",)),
        "local-broker-port-in-use": (("local", "--data", str(tmp / "local-b"), "--namesrv-port", "0", "--broker-port", str(held),
                                      "--metrics-port", "0", "--segment-size", str(1 << 20)), ("pick a free port with --broker-port",)),
        "local-metrics-port-in-use": (("local", "--data", str(tmp / "local-c"), "--namesrv-port", "0", "--broker-port", "0",
                                       "--metrics-port", str(held), "--segment-size", str(1 << 20)), ("pick a free port with --metrics-port",)),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        cases = _cases(tmp_path_factory.mktemp("cli-errors"), holder.getsockname()[1])
        results = tidemq_parallel(*(args for args, _ in cases.values()), env={"NAMESRV_ADDR": None}, timeout=30)
    return {name: (run, cases[name][1]) for name, run in zip(cases, results)}


NAMES = [
    "missing-topic", "both-c-and-b", "neither-c-nor-b", "zero-read-queues", "perm-5", "order-not-bool", "attributes-no-sign",
    "attributes-twice",
    "missing-namesrv", "namesrv-bad-listen", "broker-bad-listen", "broker-bad-namesrv",
    "unknown-admin-command", "unknown-command", "unreachable-namesrv", "unreachable-namesrv-send",
    "send-empty-body", "config-not-key-value", "config-bad-toml", "config-bad-port", "config-missing",
    "namesrv-port-in-use", "namesrv-metrics-port-in-use", "broker-port-in-use", "local-namesrv-port-in-use",
    "local-broker-port-in-use", "local-metrics-port-in-use",
]


@pytest.mark.parametrize("name", NAMES)
def test_bad_usage_fails_with_one_clear_line(runs, name):
    run, fragments = runs[name]
    assert_clean_failure(run, *fragments)


def test_every_case_is_checked(runs):
    assert sorted(runs) == sorted(NAMES)
