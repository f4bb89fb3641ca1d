"""What every service needs to know about the request it serves: who sent it.

:class:`Caller` is built by a wire front-end from its connection and (ACL-verified) credentials;
services read the peer for born hosts and logs, the principal for creation quotas, and pass the
caller to :class:`StoredAccess` when the resources to check are known only from the store (the
topic of a message looked up by offset).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tidemq.errors import BrokerError

if TYPE_CHECKING:
    from tidemq.broker.acl import Perm


@dataclass(frozen=True, slots=True)
class Caller:
    """The sender of one request."""

    peer: str  # "host:port" of the connection
    code: int = 0  # the request code, for logs and refusals
    access_key: str | None = None  # the account the ACL verified; None when ACL is off

    @property
    def host(self) -> str:
        return self.peer.rpartition(":")[0] or self.peer

    @property
    def principal(self) -> str:
        """Who implicit creations are charged to: the verified access key, else the host."""
        if self.access_key:
            return f"accessKey {self.access_key}"
        return f"host {self.host}"


class StoredAccess(Protocol):
    """The ACL check for resources learnt from the store; raises the refusal when not allowed."""

    def check_stored(self, caller: Caller, need: Mapping[str, "Perm"]) -> None: ...


def refused(code: int, remark: str) -> BrokerError:
    """The error that answers a request with ``code`` and ``remark``."""
    return BrokerError(remark, code, remark)
