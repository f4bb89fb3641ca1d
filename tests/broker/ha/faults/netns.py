"""Real network partitions for the fault-injection suite (issue 17): network namespaces made by the
test, joined by veth pairs to two bridges, all removed at the end.

Layout (``Network``), every address inside a namespace made here, none in the host's:

- a hub namespace holds two bridges: the *client* net 10.77.1.0/24 (name server, clients, each
  replica's client port) and the *cluster* net 10.77.2.0/24 (etcd, each replica's replication
  port, and the clients' namespace too, so the test can read etcd's record);
- one namespace per replica with a veth on each net, one for etcd, one for the name server and
  the clients (the test's own client calls run there through :class:`InNamespace`).

``cut(name)`` sets the hub's end of that namespace's cluster-net veth down: the replica no longer
reaches etcd or the other replicas (connects fail, established streams stall), while clients still
reach it on the client net; ``heal(name)`` sets it up again.

Needs root and ``ip netns`` (iproute2); :func:`unavailable` says why not when either is missing.
Interface names stay within Linux's 15 characters; namespace names carry the test process's pid
so two runs on one machine do not collide.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000  # <sched.h>: setns(2) into a network namespace
CLIENT_NET, CLUSTER_NET = "10.77.1", "10.77.2"


def unavailable() -> str | None:
    """Why real partitions cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"tmqprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    run = subprocess.run(["ip", *args], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {run.stderr.strip()}")


@dataclass
class Network:
    """Namespaces ``names`` (besides the hub), each on the client net, the cluster net or both."""

    client: tuple[str, ...]  # on the client net only
    cluster: tuple[str, ...]  # on the cluster net only
    both: tuple[str, ...]  # on both nets
    tag: str = field(default_factory=lambda: f"t{os.getpid() % 100000}")
    made: list[str] = field(default_factory=list)
    addresses: dict[tuple[str, str], str] = field(default_factory=dict)  # (name, net) -> address

    def ns(self, name: str) -> str:
        return f"tmq{self.tag}-{name}"

    @property
    def hub(self) -> str:
        return self.ns("hub")

    def _veth(self, name: str, index: int, net: str) -> str:
        """The hub's end of ``name``'s veth on ``net`` ("c" or "s")."""
        return f"h{net}{self.tag}{index}"[:15]

    def up(self) -> "Network":
        names = [*self.client, *self.both, *self.cluster]
        try:
            for name in ("hub", *names):
                _ip("netns", "add", self.ns(name))
                self.made.append(self.ns(name))
                _ip("-n", self.ns(name), "link", "set", "lo", "up")
            for bridge in ("brc", "brs"):
                _ip("-n", self.hub, "link", "add", bridge, "type", "bridge")
                _ip("-n", self.hub, "link", "set", bridge, "up")
            for index, name in enumerate(names):
                nets = ["c"] if name in self.client else ["s"] if name in self.cluster else ["c", "s"]
                for net in nets:
                    hub_end, inner = self._veth(name, index, net), f"e{net}0"
                    _ip("-n", self.hub, "link", "add", hub_end, "type", "veth", "peer", "name", inner,
                        "netns", self.ns(name))
                    _ip("-n", self.hub, "link", "set", hub_end, "master", "brc" if net == "c" else "brs")
                    _ip("-n", self.hub, "link", "set", hub_end, "up")
                    address = f"{CLIENT_NET if net == 'c' else CLUSTER_NET}.{10 + index}"
                    _ip("-n", self.ns(name), "addr", "add", f"{address}/24", "dev", inner)
                    _ip("-n", self.ns(name), "link", "set", inner, "up")
                    self.addresses[(name, net)] = address
        except BaseException:
            self.down()
            raise
        return self

    def address(self, name: str, net: str) -> str:
        """``name``'s address on the client ("c") or cluster ("s") net."""
        return self.addresses[(name, net)]

    def _hub_end(self, name: str) -> str:
        names = [*self.client, *self.both, *self.cluster]
        return self._veth(name, names.index(name), "s")

    def cut(self, name: str) -> None:
        _ip("-n", self.hub, "link", "set", self._hub_end(name), "down")

    def heal(self, name: str) -> None:
        _ip("-n", self.hub, "link", "set", self._hub_end(name), "up")

    def down(self) -> None:
        """Delete every namespace made (their veths and bridges go with them)."""
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made.clear()


class InNamespace:
    """Runs calls in a thread that has joined network namespace ``ns``: every thread and process
    that thread starts (a client's event loop, a subprocess) is in ``ns`` too, while the test
    process itself stays where it was."""

    def __init__(self, ns: str) -> None:
        self._ns = ns
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"netns-{ns}", initializer=self._enter)
        self._entered = threading.Event()

    def _enter(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/var/run/netns/{self._ns}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into {self._ns}: {os.strerror(err)}")
        finally:
            os.close(fd)
        self._entered.set()

    def __call__(self, fn: Callable[..., T], *args: object) -> T:
        result = self._pool.submit(fn, *args).result()
        if not self._entered.is_set():
            raise RuntimeError(f"could not enter network namespace {self._ns}")
        return result

    def close(self) -> None:
        self._pool.shutdown(wait=True)
