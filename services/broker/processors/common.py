"""What every remoting adapter does the same way: who sent a request, from where.

An adapter builds the :class:`~tidemq.broker.messaging.context.Caller` a service sees from the
connection and, when the ACL is on (its hook verified the signature before any handler ran), the
request's ``AccessKey``; with the ACL off a request's claimed access key is unverified text that
must not name the principal.
"""

from __future__ import annotations

from tidemq.broker.messaging.context import Caller
from tidemq.remoting import Connection, RemotingCommand
from tidemq.remoting.acl import ACCESS_KEY


class Callers:
    """Builds the Caller of a request."""

    __slots__ = ("verified",)

    def __init__(self, acl_on: bool) -> None:
        self.verified = acl_on  # AccessKey was checked by the ACL hook

    def __call__(self, conn: Connection, cmd: RemotingCommand) -> Caller:
        ak = cmd.ext_fields.get(ACCESS_KEY) if self.verified else None
        return Caller(conn.peer, cmd.code, ak or None)


def born_host(peer: str) -> tuple[str, int]:
    """(host, port) of a connection's ``peer``, as stored in a message's born host."""
    host, _, port = peer.rpartition(":")
    try:
        return host, int(port)
    except ValueError:
        return "127.0.0.1", 0
