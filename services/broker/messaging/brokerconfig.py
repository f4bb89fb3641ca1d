"""The broker-config family: the settings a remote admin may read and change at runtime.

Invariant: a remote request can change only the keys in :data:`UPDATABLE` (RocketMQ names), each
a value the broker reads per request and never a path, a command or anything it executes.
CVE-2023-33246 (remote code execution through ``rocketmqHome`` / filter-server settings) and
CVE-2023-37582 (a deny-list that checked a misspelled key) came from the opposite design. A request
naming any other key changes nothing and is refused NO_PERMISSION (16) naming the key. Changes
are atomic (all keys or none), apply at once, and are not persisted (the config file wins at the
next start). Under ACL, UPDATE_BROKER_CONFIG needs an admin account (tidemq.broker.acl).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from tidemq.broker.messaging.context import Caller, refused
from tidemq.remoting.codes import ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.config import BrokerConfig

log = logging.getLogger(__name__)


def _bool(v: str) -> bool:
    t = v.strip().lower()
    if t not in ("true", "false"):
        raise ValueError("expected true or false")
    return t == "true"


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    def parse(v: str) -> int:
        n = int(v.strip())
        if not lo <= n <= hi:
            raise ValueError(f"expected {lo}..{hi}")
        return n
    return parse


def _perm(v: str) -> int:
    n = int(v.strip())
    if n not in (0, 2, 4, 6):
        raise ValueError("expected 2 (write), 4 (read), 6 (read and write) or 0")
    return n


# RocketMQ key -> (BrokerConfig field, parser).
UPDATABLE: dict[str, tuple[str, Callable[[str], object]]] = {
    "brokerPermission": ("broker_permission", _perm),
    "autoCreateTopicEnable": ("auto_create_topic", _bool),
    "autoCreateSubscriptionGroup": ("auto_create_subscription_group", _bool),
    "longPollingEnable": ("long_polling", _bool),
    "shortPollingTimeMills": ("short_polling_ms", _int_in(0, 60_000)),
    "maxTransferBytesOnMessageInMemory": ("max_pull_bytes", _int_in(4096, 64 * 1024 * 1024)),
}


class BrokerConfigService:
    def __init__(self, *, settings: Callable[[], BrokerConfig], replace: Callable[[BrokerConfig], None],
                 reregister: Callable[[], Awaitable[None]]) -> None:
        self._settings = settings  # the broker's config now
        self._replace = replace  # installs a changed config (every reader sees it at its next request)
        # tells the name servers (the broker's permission is in its routes); done when they were told
        self._reregister = reregister

    def update(self, caller: Caller, items: Sequence[tuple[str, str]]) -> Awaitable[None] | None:
        """Apply every ``(RocketMQ key, value)`` of ``items``, or refuse them all.

        A changed brokerPermission returns the re-registration to await before answering:
        RocketMQ's updateBrokerConfig registers with the name servers before it answers, so a
        client routing right after the admin call sees the new permission (not the previous
        round's, which a registration still running could leave behind)."""
        for key, _value in items:
            if key not in UPDATABLE:
                shown = key if len(key) <= 64 else key[:64] + "..."
                log.warning("refused UPDATE_BROKER_CONFIG of %r from %s: not updatable at runtime", shown, caller.peer)
                raise refused(
                    ResponseCode.NO_PERMISSION,
                    f"broker config key {shown!r} cannot be changed remotely; updatable keys: "
                    f"{', '.join(sorted(UPDATABLE))}",
                )
        changes: dict[str, Any] = {}
        for key, value in items:
            field, parse = UPDATABLE[key]
            try:
                changes[field] = parse(value)
            except ValueError as exc:
                raise refused(ResponseCode.SYSTEM_ERROR, f"broker config {key}={value[:64]!r}: {exc}") from None
        self._replace(dataclasses.replace(self._settings(), **changes))
        log.info("broker config updated from %s (not persisted): %s", caller.peer,
                 ", ".join(f"{k}={v}" for k, v in items))
        if "broker_permission" in changes:
            return self._reregister()
        return None

    def current(self) -> list[tuple[str, str]]:
        """The updatable keys (sorted) with their values, then the broker's identity and flush mode."""
        cfg = self._settings()
        out = []
        for key, (field, _parse) in sorted(UPDATABLE.items()):
            v = getattr(cfg, field)
            out.append((key, str(v).lower() if isinstance(v, bool) else str(v)))
        out += [("brokerClusterName", cfg.cluster_name), ("brokerName", cfg.broker_name),
                ("brokerId", str(cfg.broker_id)), ("flushDiskType", f"{cfg.flush_mode.name}_FLUSH")]
        return out
