"""Configuration files for `tidemq broker` and `tidemq namesrv`.

A file is either TOML (``*.toml``) or RocketMQ's ``broker.conf`` properties form (``key=value``).
Keys may be our option names (``broker-name``, ``flush``) or RocketMQ's (``brokerName``,
``brokerClusterName``, ``namesrvAddr``, ``listenPort``, ``brokerIP1``, ``flushDiskType`` ... : the
table ``ROCKETMQ_KEYS``). Precedence: command-line flags, then TIDEMQ_* environment variables, then
the file, then defaults.

A key that is neither an option of the command nor a RocketMQ key mapped onto one is ignored, and
said so at start with the closest known key (:func:`config_notes`), so a typo cannot pass silently.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import tomllib
from collections.abc import Collection
from pathlib import Path

import click

log = logging.getLogger("tidemq.cli")

# RocketMQ broker.conf / namesrv.conf keys -> our option (parameter) names, where one maps 1:1.
ROCKETMQ_KEYS = {
    "brokerName": "broker_name",
    "brokerClusterName": "cluster",
    "brokerId": "broker_id",
    "namesrvAddr": "namesrv",
    "storePathRootDir": "store",
    "flushDiskType": "flush",
    "autoCreateTopicEnable": "auto_create_topic",
    "mappedFileSizeCommitLog": "segment_size",
    "mapedFileSizeCommitLog": "segment_size",  # RocketMQ's spelling before 4.5
    "fileReservedTime": "retention_hours",
    "deleteWhen": "delete_when",
    "cleanResourceInterval": "cleanup_interval",
    "warmMapedFileEnable": "warm_segments",
    "maxTransferBytesOnMessageInMemory": "max_pull_bytes",
    "registerNameServerPeriod": "register_interval",
    "messageDelayLevel": "delay_levels",
    "transactionTimeOut": "transaction_timeout",
    "transactionCheckInterval": "transaction_check_interval",
    "transactionCheckMax": "transaction_check_max",
    "serverChannelMaxIdleTimeSeconds": "idle_timeout",
    "waitTimeMillsInSendQueue": "busy_wait_ms",
    "maxMessageSize": "max_message_size",
    "flushIntervalCommitLog": "flush_interval",
    "compressedRegister": "compressed_register",
    "maxTopicCount": "max_topics",
    "maxSubscriptionGroupCount": "max_groups",
    "implicitCreateLimit": "implicit_create_limit",
    "implicitCreateWindowSeconds": "implicit_create_window",
    "maxMappedQueueFiles": "max_mapped_queue_files",
}
# RocketMQ gives these in milliseconds; our options take seconds.
MILLISECOND_KEYS = {"transactionTimeOut", "transactionCheckInterval", "flushIntervalCommitLog",
                    "cleanResourceInterval", "registerNameServerPeriod"}
# RocketMQ keys with no TideMQ counterpart on purpose: ignored with this reason (not "unknown").
NOT_APPLICABLE = {
    "brokerRole": "TideMQ replicas are elected, not configured: set coordination, replica-id and "
                  "replication (sync|async) instead",
}
# Options a file may set but a user is never pointed at (test seams, the file option itself).
_NOT_SUGGESTED = ("test_", "config")


@dataclasses.dataclass(frozen=True, slots=True)
class ConfigFile:
    """A parsed config file: ``values`` is a click default_map (option name -> value) and
    ``origin`` says which key of the file set each option."""

    path: Path | None = None
    values: dict[str, object] = dataclasses.field(default_factory=dict)
    origin: dict[str, str] = dataclasses.field(default_factory=dict)


def _normalise_value(key: str, value: object) -> object:
    if key == "flush" and isinstance(value, str):
        v = value.strip().upper()
        if v in ("SYNC_FLUSH", "SYNC"):
            return "sync"
        if v in ("ASYNC_FLUSH", "ASYNC"):
            return "async"
    return value


def _read_raw(p: Path) -> dict[str, object]:
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise click.BadParameter(f"cannot read {p}: {exc.strerror}", param_hint="--config") from None
    if p.suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise click.BadParameter(f"{p} is not valid TOML: {exc}", param_hint="--config") from None
    raw: dict[str, object] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise click.BadParameter(f"{p}:{n}: expected key=value, got {line!r}", param_hint="--config")
        raw[key.strip()] = value.strip()
    return raw


def read_config_file(path: str | None) -> ConfigFile:
    """Parse ``path`` (nothing when None) into option defaults, remembering each one's key."""
    if not path:
        return ConfigFile()
    p = Path(path)
    raw = _read_raw(p)
    values: dict[str, object] = {}
    origin: dict[str, str] = {}
    # RocketMQ binds listenPort on every interface and advertises brokerIP1 (default: a local
    # address); the advertised port follows the listen port (tidemq.cli.servers.build_broker_config).
    port = raw.pop("listenPort", None)
    if port is not None:
        values["listen"], origin["listen"] = f"0.0.0.0:{port}", "listenPort"
    host = raw.pop("brokerIP1", None)
    if host is not None:
        values["advertise"], origin["advertise"] = str(host), "brokerIP1"
    for key, value in raw.items():
        name = ROCKETMQ_KEYS.get(key, key.replace("-", "_"))
        if key in MILLISECOND_KEYS:
            try:
                value = float(value) / 1000.0  # type: ignore[arg-type]  # float() refuses what is no number
            except (TypeError, ValueError):
                raise click.BadParameter(f"{p}: {key}={value!r} is not a number of milliseconds", param_hint="--config") from None
        values[name] = _normalise_value(name, value)
        origin[name] = key
    return ConfigFile(p, values, origin)


def load_config_file(path: str | None) -> dict[str, object]:
    """Return a click default_map for the file's settings (empty when path is None)."""
    return read_config_file(path).values


def _closest(key: str, known: Collection[str]) -> str | None:
    by_lower = {k.lower(): k for k in known}
    match = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[match[0]] if match else None


def config_notes(cfg: ConfigFile, options: Collection[str]) -> list[tuple[int, str]]:
    """What to log about ``cfg`` for a command whose parameters are ``options``: (level, message)
    for every key the command does not use (with the closest known key), then one line naming
    the keys applied."""
    if cfg.path is None:
        return []
    suggestable = [o for o in options if not o.startswith(_NOT_SUGGESTED)]
    known = {o.replace("_", "-") for o in suggestable}
    known |= {k for k, name in ROCKETMQ_KEYS.items() if name in options}
    known |= {k for k, name in (("listenPort", "listen"), ("brokerIP1", "advertise")) if name in options}
    notes: list[tuple[int, str]] = []
    applied: list[str] = []
    for name, key in cfg.origin.items():
        if name in options:
            applied.append(key)
            continue
        value = cfg.values[name]
        if key in NOT_APPLICABLE:
            notes.append((logging.WARNING, f"{cfg.path}: {key}={value} ignored: {NOT_APPLICABLE[key]}"))
            continue
        guess = _closest(key, known)
        hint = f"; did you mean {guess}?" if guess else " (neither an option of this command nor a RocketMQ key it maps)"
        notes.append((logging.WARNING, f"{cfg.path}: unknown key {key} ignored{hint}"))
    notes.append((logging.INFO, f"{cfg.path}: {len(applied)} setting(s) applied ({', '.join(applied) or 'none'})"
                               + (f", {len(cfg.origin) - len(applied)} ignored" if len(applied) < len(cfg.origin) else "")))
    return notes


def log_config_notes(ctx: click.Context) -> None:
    """Log what :func:`config_notes` found for the command's --config file (after logging is set up)."""
    for level, message in ctx.meta.get("tidemq.config_notes", ()):
        log.log(level, "%s", message)
