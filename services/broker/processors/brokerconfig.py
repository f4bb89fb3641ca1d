"""UPDATE_BROKER_CONFIG and GET_BROKER_CONFIG, restricted to an allow-list of harmless keys.

Invariant: a remote request can change only the keys in :data:`UPDATABLE` (RocketMQ names), each
a value the broker reads per request and never a path, a command or anything it executes.
CVE-2023-33246 (remote code execution through ``rocketmqHome`` / filter-server settings) and
CVE-2023-37582 (a deny-list that checked a misspelled key) came from the opposite design. A request
naming any other key changes nothing and is answered NO_PERMISSION (16) naming the key. Changes
are atomic (all keys or none), apply at once, and are not persisted (the config file wins at the
next start). Under ACL, UPDATE_BROKER_CONFIG needs an admin account (tidemq.broker.acl).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.broker import Broker

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


def parse_properties(text: str) -> list[tuple[str, str]]:
    """``key=value`` lines (RocketMQ's MixAll.properties2String), comments and blanks skipped."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s[0] in "#!":
            continue
        key, sep, value = s.partition("=")
        if not sep:
            key, sep, value = s.partition(":")
        out.append((key.strip(), value.strip()))
    return out


class BrokerConfigProcessor:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def handlers(self) -> dict[int, object]:
        return {
            RequestCode.UPDATE_BROKER_CONFIG: self.update,
            RequestCode.GET_BROKER_CONFIG: self.get,
        }

    def update(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        try:
            items = parse_properties(cmd.body_bytes().decode("utf-8"))
        except UnicodeDecodeError:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "UPDATE_BROKER_CONFIG: the body is not UTF-8 text")
        if not items:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "UPDATE_BROKER_CONFIG: no key=value in the body")
        for key, _value in items:
            if key not in UPDATABLE:
                shown = key if len(key) <= 64 else key[:64] + "..."
                log.warning("refused UPDATE_BROKER_CONFIG of %r from %s: not updatable at runtime", shown, conn.peer)
                return cmd.response(
                    ResponseCode.NO_PERMISSION,
                    f"broker config key {shown!r} cannot be changed remotely; updatable keys: "
                    f"{', '.join(sorted(UPDATABLE))}",
                )
        changes: dict[str, object] = {}
        for key, value in items:
            field, parse = UPDATABLE[key]
            try:
                changes[field] = parse(value)
            except ValueError as exc:
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"broker config {key}={value[:64]!r}: {exc}")
        b = self.broker
        b.config = dataclasses.replace(b.config, **changes)
        log.info("broker config updated from %s (not persisted): %s", conn.peer,
                 ", ".join(f"{k}={v}" for k, v in items))
        if "broker_permission" in changes:
            b.topics_changed(persist=False)  # re-register with the name servers
        return cmd.response(ResponseCode.SUCCESS)

    def get(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        cfg = self.broker.config
        lines = []
        for key, (field, _parse) in sorted(UPDATABLE.items()):
            v = getattr(cfg, field)
            lines.append(f"{key}={str(v).lower() if isinstance(v, bool) else v}")
        lines += [f"brokerClusterName={cfg.cluster_name}", f"brokerName={cfg.broker_name}",
                  f"brokerId={cfg.broker_id}", f"flushDiskType={cfg.flush_mode.name}_FLUSH"]
        return cmd.response(body=("\n".join(lines) + "\n").encode())
