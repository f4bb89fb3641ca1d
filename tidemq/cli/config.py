"""Configuration files for `tidemq broker` and `tidemq namesrv`.

A file is either TOML (``*.toml``) or RocketMQ's ``broker.conf`` properties form (``key=value``).
Keys may be our option names (``broker-name``, ``flush``) or RocketMQ's (``brokerName``,
``brokerClusterName``, ``namesrvAddr``, ``listenPort``, ``storePathRootDir``, ``flushDiskType``,
``autoCreateTopicEnable``, ``mappedFileSizeCommitLog``, ``messageDelayLevel``, ``brokerIP1``,
``serverChannelMaxIdleTimeSeconds``, ``waitTimeMillsInSendQueue``, ``maxMessageSize``, ``flushIntervalCommitLog``, ``compressedRegister``). Precedence: command-line
flags, then TIDEMQ_* environment variables, then the file, then defaults.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import click

ROCKETMQ_KEYS = {
    "brokerName": "broker_name",
    "brokerClusterName": "cluster",
    "namesrvAddr": "namesrv",
    "storePathRootDir": "store",
    "flushDiskType": "flush",
    "autoCreateTopicEnable": "auto_create_topic",
    "mappedFileSizeCommitLog": "segment_size",
    "fileReservedTime": "retention_hours",
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
MILLISECOND_KEYS = {"transactionTimeOut", "transactionCheckInterval", "flushIntervalCommitLog"}


def _normalise_value(key: str, value: object) -> object:
    if key == "flush" and isinstance(value, str):
        v = value.strip().upper()
        if v in ("SYNC_FLUSH", "SYNC"):
            return "sync"
        if v in ("ASYNC_FLUSH", "ASYNC"):
            return "async"
    return value


def load_config_file(path: str | None) -> dict[str, object]:
    """Return a click default_map for the file's settings (empty when path is None)."""
    if not path:
        return {}
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise click.BadParameter(f"cannot read {p}: {exc.strerror}", param_hint="--config") from None
    raw: dict[str, object]
    if p.suffix == ".toml":
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise click.BadParameter(f"{p} is not valid TOML: {exc}", param_hint="--config") from None
    else:
        raw = {}
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise click.BadParameter(f"{p}:{n}: expected key=value, got {line!r}", param_hint="--config")
            raw[key.strip()] = value.strip()
    out: dict[str, object] = {}
    host = raw.pop("brokerIP1", None)
    port = raw.pop("listenPort", None)
    if port is not None:
        out["listen"] = f"0.0.0.0:{port}"
        out["advertise"] = f"{host or '127.0.0.1'}:{port}"
    elif host is not None:
        out["advertise"] = f"{host}:10911"
    for key, value in raw.items():
        name = ROCKETMQ_KEYS.get(key, key.replace("-", "_"))
        if key in MILLISECOND_KEYS:
            try:
                value = float(value) / 1000.0
            except (TypeError, ValueError):
                raise click.BadParameter(f"{p}: {key}={value!r} is not a number of milliseconds", param_hint="--config") from None
        out[name] = _normalise_value(name, value)
    return out
