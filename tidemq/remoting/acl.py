"""RocketMQ ACL request signatures (pure): what a client adds and a server can verify.

A signed request carries ``AccessKey`` and ``Signature`` in its custom header. The signature is
``base64(HMAC-SHA1(secretKey, V))`` where V is the UTF-8 concatenation of the *values* of every
header field except ``Signature`` (``AccessKey`` included), ordered by field name, followed by
the raw body (RocketMQ's AclClientRPCHook / AclUtils.combineRequestContent).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

from tidemq.remoting.command import RemotingCommand

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
_SKIPPED = frozenset({SIGNATURE, "_UNIQUE_KEY_QUERY"})


def signature(fields: dict[str, str], body: bytes, secret_key: str) -> str:
    content = "".join(fields[k] for k in sorted(fields) if k not in _SKIPPED).encode("utf-8") + body
    digest = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


@dataclass(frozen=True, slots=True)
class AclSigner:
    """An RPC hook for :class:`~tidemq.remoting.transport.RemotingClient`: signs every request."""

    access_key: str
    secret_key: str

    def __call__(self, cmd: RemotingCommand) -> None:
        cmd.ext_fields[ACCESS_KEY] = self.access_key
        cmd.ext_fields.pop(SIGNATURE, None)
        cmd.ext_fields[SIGNATURE] = signature(cmd.ext_fields, cmd.body_bytes(), self.secret_key)


def verify(cmd: RemotingCommand, secret_key: str) -> bool:
    """Whether ``cmd``'s signature matches ``secret_key`` (constant-time compare)."""
    given = cmd.ext_fields.get(SIGNATURE)
    if given is None:
        return False
    expected = signature(cmd.ext_fields, cmd.body_bytes(), secret_key)
    # bytes, not str: compare_digest refuses non-ASCII str (a hostile Signature would raise)
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("ascii"))
