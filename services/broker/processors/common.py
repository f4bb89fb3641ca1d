"""What every remoting adapter does the same way: who sent a request, from where.

An adapter builds the :class:`~tidemq.broker.messaging.context.Caller` a service sees from the
connection and, when the ACL is on (its hook verified the signature before any handler ran), the
request's ``AccessKey``; with the ACL off a request's claimed access key is unverified text that
must not name the principal.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from tidemq.broker.messaging.context import Caller
from tidemq.remoting import Connection, RemotingCommand
from tidemq.remoting.acl import ACCESS_KEY


# A request's answer: now, none (oneway), or later; and what answers a request code.
Answer = RemotingCommand | None | Awaitable[RemotingCommand | None]
Handler = Callable[[Connection, RemotingCommand], Answer]

_CACHED_CALLERS = 4096  # (peer, code, access key) combinations remembered, then forgotten at once


class Callers:
    """Builds the Caller of a request. A connection's requests share one Caller per request code
    and access key (a Caller is built once per message otherwise: bench/hot_path.py)."""

    __slots__ = ("verified", "_cache")

    def __init__(self, acl_on: bool) -> None:
        self.verified = acl_on  # AccessKey was checked by the ACL hook
        self._cache: dict[tuple[str, int, str | None], Caller] = {}

    def of(self, conn: Connection, cmd: RemotingCommand) -> Caller:
        ak = (cmd.ext_fields.get(ACCESS_KEY) or None) if self.verified else None
        key = (conn.peer, cmd.code, ak)
        caller = self._cache.get(key)
        if caller is None:
            if len(self._cache) >= _CACHED_CALLERS:
                self._cache.clear()
            caller = self._cache[key] = Caller(conn.peer, cmd.code, ak)
        return caller

    __call__ = of  # callers(conn, cmd); hot paths keep the bound ``of`` (no __call__ lookup)


@functools.lru_cache(maxsize=_CACHED_CALLERS)  # once per peer, not per message (bench/hot_path.py)
def born_host(peer: str) -> tuple[str, int]:
    """(host, port) of a connection's ``peer``, as stored in a message's born host."""
    host, _, port = peer.rpartition(":")
    try:
        return host, int(port)
    except ValueError:
        return "127.0.0.1", 0
