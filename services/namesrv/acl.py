"""Write protection of the name server: requests that change routes must be signed by an admin.

RocketMQ 4.x name servers accept REGISTER_BROKER, UNREGISTER_BROKER, WIPE_WRITE_PERM_OF_BROKER,
DELETE_TOPIC_IN_NAMESRV ... from anyone, so any client can re-point a topic's route or keep stale
queue data advertised. A TideMQ name server given accounts (``tidemq namesrv --acl-file
plain_acl.yml``, RocketMQ's plain ACL format) requires every request it serves that is not a
read (:data:`tidemq.namesrv.server.READ_CODES`) to carry ``AccessKey`` and a valid ``Signature``
(RocketMQ's AclClientRPCHook, :mod:`tidemq.remoting.acl`) of an account with ``admin: true``.

Invariants:

- Reads stay open: clients without credentials keep resolving routes.
- A refusal is answered as RocketMQ's ACL refuses (``SYSTEM_ERROR``, remark ``AclException:
  <reason>``, the reasons worded as RocketMQ's PlainAccessValidator), and changes nothing.
- The signature is checked over the extFields exactly as received, compared in constant time;
  an account's ``whiteRemoteAddress`` restricts where it may connect from, never skips the check.
- The name server does not parse the file itself: it reads the accounts from an
  :class:`AccountSource` (the broker's ACL service, :class:`tidemq.broker.acl.AclService`, built by
  the CLI, which also reloads the file when it changes); the name server and the broker stay
  independent packages.
- Secret keys never reach a log line or a remark; refusals are logged at most 20 per 10 s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from tidemq.remoting import Connection, RemotingCommand, ResponseCode
from tidemq.remoting.acl import RefusalLog, check_account, peer_host

log = logging.getLogger(__name__)

LOG_WINDOW = 10.0
LOG_PER_WINDOW = 20


class AddressMatcher(Protocol):
    def match(self, host: str) -> bool: ...


# Read-only members (properties), so that frozen dataclasses and Mapping-typed fields satisfy them.
class Account(Protocol):
    @property
    def access_key(self) -> str: ...
    @property
    def secret_key(self) -> str: ...
    @property
    def admin(self) -> bool: ...
    @property
    def white_remote_address(self) -> AddressMatcher | None: ...


class Accounts(Protocol):
    @property
    def accounts(self) -> Mapping[str, Account]: ...


class AccountSource(Protocol):
    """The current accounts (``config.accounts``) and a loop that reloads them (``watch``)."""

    @property
    def config(self) -> Accounts: ...

    def watch(self) -> Coroutine[Any, Any, None]: ...


def authorize_write(accounts: Mapping[str, Account], cmd: RemotingCommand, host: str) -> tuple[str | None, str | None]:
    """``(access_key, None)`` when ``cmd`` from ``host`` may change the name server's state, else
    ``(access_key, reason)`` in RocketMQ's words."""
    ak, acct, reason = check_account(accounts, cmd, host)
    if acct is None:
        return ak, reason
    if not acct.admin:
        return ak, f"Need admin permission for request code={cmd.code}, but accessKey={ak} is not"
    return ak, None


class WriteGuard:
    """Checks the name server's state-changing requests against an AccountSource."""

    def __init__(self, source: AccountSource, clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.clock = clock
        self.refused = 0
        self._refusals = RefusalLog(log, LOG_WINDOW, LOG_PER_WINDOW, clock)

    def check(self, conn: Connection, cmd: RemotingCommand, what: str) -> RemotingCommand | None:
        """None when allowed; else the refusal to answer with."""
        ak, reason = authorize_write(self.source.config.accounts, cmd, peer_host(conn.peer))
        if reason is None:
            return None
        self.refused += 1
        self._refusals.refused(what, conn.peer, ak, reason)
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"AclException: {reason}")
