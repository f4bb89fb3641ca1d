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
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

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


# --------------------------------------------------------------- server side (broker, name server)
def loggable(value: object, limit: int = 80) -> str:
    """A client-supplied value made safe for a log line or a remark: control characters and
    non-ASCII escaped (a newline cannot forge a log line), cut to ``limit`` characters."""
    text = str(value)
    if len(text) > limit:
        text = f"{text[:limit]}...({len(text)} chars)"
    if text.isascii() and text.isprintable():
        return text
    return text.encode("unicode_escape").decode("ascii")


def peer_host(peer: str) -> str:
    """The host of a ``host:port`` peer address (IPv6 brackets removed)."""
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return host.strip("[]")


class _AddressMatcher(Protocol):
    def match(self, host: str) -> bool: ...


class SignedAccount(Protocol):
    @property
    def secret_key(self) -> str: ...
    @property
    def white_remote_address(self) -> _AddressMatcher | None: ...


A = TypeVar("A", bound=SignedAccount)  # the caller's own account type, given back


def check_account(accounts: Mapping[str, A], cmd: RemotingCommand,
                  host: str) -> tuple[str | None, A | None, str | None]:
    """``(access_key, account, None)`` when ``cmd`` carries a valid signature of a known account
    connecting from an allowed address, else ``(access_key, None, reason)`` in RocketMQ 4.9.8's
    words."""
    ak = cmd.ext_fields.get(ACCESS_KEY)
    if not ak:  # the C++ client without credentials sends an empty AccessKey
        return None, None, "No accessKey is configured"
    acct = accounts.get(ak)
    if acct is None:
        return ak, None, f"No acl config for {ak}"
    if acct.white_remote_address is not None and not acct.white_remote_address.match(host):
        return ak, None, f"Remote address {host} is not in the whiteRemoteAddress of accessKey={ak}"
    if not verify(cmd, acct.secret_key):
        return ak, None, f"Check signature failed for accessKey={ak}"
    return ak, acct, None


class RefusalLog:
    """Logs refusals at most ``per_window`` times per ``window`` seconds, then a count."""

    def __init__(self, logger: logging.Logger, window: float = 10.0, per_window: int = 20,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.window = window
        self.per_window = per_window
        self.clock = clock
        self._start = float("-inf")
        self._logged = 0

    def refused(self, what: str, peer: str, ak: str | None, reason: str) -> None:
        now = self.clock()
        if now - self._start >= self.window:
            if self._logged > self.per_window:
                self.logger.warning("ACL: %d more refusals not logged in the last %g s",
                                    self._logged - self.per_window, self.window)
            self._start, self._logged = now, 0
        self._logged += 1
        if self._logged <= self.per_window:  # the reason names the access key at most, never a secret
            self.logger.warning("ACL refused %s from %s (accessKey=%s): %s", what, peer,
                                None if ak is None else loggable(ak), loggable(reason, 300))
