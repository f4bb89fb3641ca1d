"""Typed, validated settings of the push and lite-pull consumers (RocketMQ
DefaultMQPushConsumer's and DefaultLitePullConsumer's knobs), defined here once: each consumer
takes one of these objects (``settings=``) and/or its fields by name as keyword arguments
(``PushConsumer(group, orderly=True)``), which :meth:`ConsumerSettings.make` merges and checks.

Invariant: a settings object is valid once built (every field is checked in ``__post_init__``,
so ``dataclasses.replace`` checks again); a keyword that names no field is a ConfigError that
names the closest field.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass
from typing import Self

from tidemq.client.allocate import AllocateStrategy, allocate_averagely
from tidemq.client.config import check_positive
from tidemq.client.pull import MAX_PULL_NUMS
from tidemq.client.push.process_queue import LOCK_EXPIRY
from tidemq.client.push.types import ConsumeFromWhere, MessageModel
from tidemq.errors import ConfigError

MAX_CONSUME_BATCH = 1024
MAX_SUSPEND_MS = 60_000
DEFAULT_LOOKBACK_MS = 30 * 60 * 1000  # CONSUME_FROM_TIMESTAMP without a timestamp


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """What both consumers' settings start with; each subclass checks its own in ``_check``."""

    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET
    consume_timestamp: int | None = None  # ms; None: 30 minutes before the start
    # Which queues of a topic this consumer owns, given all queues and the group's client ids.
    allocate_strategy: AllocateStrategy = allocate_averagely
    # Where BROADCASTING offsets are kept (one file per group); None: ~/.tidemq/offsets.
    offset_store_dir: str | os.PathLike[str] | None = None

    @classmethod
    def make(cls, base: Self | None = None, /, **options: object) -> Self:
        """``base`` (None: the defaults) with the fields named in ``options`` replaced."""
        if base is not None and not isinstance(base, cls):
            raise ConfigError(f"settings must be a {cls.__name__}, not {type(base).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        for name in options:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                # TypeError, as for any unexpected keyword argument, with the closest name added
                raise TypeError(f"unknown consumer setting {name!r}{hint}; the settings of this "
                                f"consumer are {', '.join(known)}")
        if base is None:
            return cls(**options)  # type: ignore[arg-type]
        return dataclasses.replace(base, **options)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        if not isinstance(self.message_model, MessageModel):
            raise ConfigError(f"message_model must be a MessageModel, not {self.message_model!r}")
        if not isinstance(self.consume_from, ConsumeFromWhere):
            raise ConfigError(f"consume_from must be a ConsumeFromWhere, not {self.consume_from!r}")
        self._check()
        if self.consume_timestamp is not None and self.consume_timestamp < 0:
            raise ConfigError("consume_timestamp must be a time in ms since the epoch")

    def _check(self) -> None:
        pass

    def start_timestamp(self, now_ms: int) -> int:
        """The time CONSUME_FROM_TIMESTAMP starts at: ``consume_timestamp``, else 30 minutes
        before ``now_ms``."""
        if self.consume_timestamp is not None:
            return self.consume_timestamp
        return now_ms - DEFAULT_LOOKBACK_MS


@dataclass(frozen=True, slots=True)
class PushSettings(ConsumerSettings):
    """Settings of a push consumer (RocketMQ DefaultMQPushConsumer's knobs)."""

    orderly: bool = False  # consume each queue in order, one batch at a time
    pull_batch_size: int = 32
    consume_batch_max_size: int = 1
    pull_threshold_for_queue: int = 1000
    pull_threshold_size_for_queue: int = 100  # MiB
    consume_concurrently_max_span: int = 2000
    max_reconsume_times: int = 16
    rebalance_interval: float = 20.0
    persist_interval: float = 5.0
    lock_interval: float = 20.0
    consume_concurrency: int = 20
    suspend_ms: int = 15000
    shutdown_timeout: float = 10.0

    def _check(self) -> None:
        _range("pull_batch_size", self.pull_batch_size, 1, MAX_PULL_NUMS)
        _range("consume_batch_max_size", self.consume_batch_max_size, 1, MAX_CONSUME_BATCH)
        _range("pull_threshold_for_queue", self.pull_threshold_for_queue, 1, 65535)
        _range("pull_threshold_size_for_queue", self.pull_threshold_size_for_queue, 1, 1024)
        _range("consume_concurrently_max_span", self.consume_concurrently_max_span, 1, 65535)
        _range("max_reconsume_times", self.max_reconsume_times, 0, 10_000)
        _range("consume_concurrency", self.consume_concurrency, 1, 1000)
        _range("suspend_ms", self.suspend_ms, 0, MAX_SUSPEND_MS)
        check_positive(self, ("rebalance_interval", "persist_interval", "lock_interval"))
        if self.lock_interval >= LOCK_EXPIRY:
            raise ConfigError(f"lock_interval must be below {LOCK_EXPIRY:g} s, the age at which a "
                              "queue lock no longer counts")
        if self.shutdown_timeout < 0:
            raise ConfigError("shutdown_timeout must be >= 0")


@dataclass(frozen=True, slots=True)
class LitePullSettings(ConsumerSettings):
    """Settings of a lite-pull consumer (RocketMQ DefaultLitePullConsumer's knobs)."""

    pull_batch_size: int = 10
    pull_threshold_for_queue: int = 1000
    pull_threshold_size_for_queue: int = 100  # MiB
    pull_threshold_for_all: int = 10000
    consume_max_span: int = 2000
    auto_commit: bool = True
    auto_commit_interval: float = 5.0
    rebalance_interval: float = 20.0
    suspend_ms: int = 15000
    poll_timeout: float = 5.0

    def _check(self) -> None:
        _range("pull_batch_size", self.pull_batch_size, 1, MAX_PULL_NUMS)
        _range("pull_threshold_for_queue", self.pull_threshold_for_queue, 1, 65535)
        _range("pull_threshold_size_for_queue", self.pull_threshold_size_for_queue, 1, 1024)
        _range("pull_threshold_for_all", self.pull_threshold_for_all, 1, 1_000_000)
        _range("consume_max_span", self.consume_max_span, 1, 65535)
        _range("suspend_ms", self.suspend_ms, 0, MAX_SUSPEND_MS)
        check_positive(self, ("auto_commit_interval", "rebalance_interval", "poll_timeout"))


def _range(name: str, value: object, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ConfigError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
