"""The shared-instance registry is used from several threads at once: Spark's reading threads each
run a loop of their own and acquire and release instances concurrently."""

from __future__ import annotations

import sys
import threading

from tidemq.client.config import ClientConfig
from tidemq.client.instance import ClientInstance


class _Loop:
    """Stands in for an event loop as a registry key: the registry only asks is_closed()."""

    def __init__(self) -> None:
        self.closed = False

    def is_closed(self) -> bool:
        return self.closed


def test_threads_registering_and_releasing_at_once_keep_the_registry_whole():
    """8 threads each register 40 instances on loops of their own, close half the loops, then
    release all. Before the lock, one thread's sweep of closed loops iterated the dict while another
    inserted: RuntimeError "dictionary changed size during iteration", or a KeyError deleting a key
    another sweep had deleted."""
    config = ClientConfig(name_servers=("127.0.0.1:1",))
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker() -> None:
        try:
            start.wait()
            for _ in range(6):
                held = []
                for _ in range(40):
                    loop = _Loop()
                    held.append((loop, ClientInstance._register(config, loop)))  # type: ignore[arg-type]
                for loop, _inst in held[::2]:
                    loop.closed = True
                for _loop, inst in held:
                    inst._drop_user()
        except BaseException as exc:  # noqa: BLE001 (collected and asserted below)
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert not ClientInstance._registry
