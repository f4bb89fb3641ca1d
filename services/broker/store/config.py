"""Configuration of the message store: one frozen value, built at the edge (CLI / broker config).

Defaults follow RocketMQ 4.x's MessageStoreConfig where TideMQ keeps the same behaviour, except
``sync_flush_timeout``: RocketMQ waits 5 s, longer than the clients' 3 s send timeout, so a slow
disk there makes clients drop the connection; TideMQ answers FLUSH_DISK_TIMEOUT after 2.5 s.
"""

from __future__ import annotations

import enum
import pathlib
from dataclasses import dataclass

from tidemq.errors import ConfigError


DEFAULT_MAX_MAPPED_QUEUE_FILES = 2048


class FlushMode(enum.Enum):
    """ASYNC: acknowledge after the append, flush in the background. SYNC: acknowledge once durable."""

    ASYNC = "async"
    SYNC = "sync"


@dataclass(frozen=True, slots=True)
class StoreConfig:
    root: pathlib.Path
    flush_mode: FlushMode = FlushMode.ASYNC
    commitlog_segment_size: int = 1 << 30
    consume_queue_units_per_file: int = 300_000
    index_hash_slots: int = 5_000_000
    index_max_entries: int = 20_000_000
    async_flush_interval: float = 0.5
    sync_flush_timeout: float = 2.5
    file_reserved_hours: float = 72.0
    delete_when_hours: tuple[int, ...] = (4,)
    disk_clean_ratio: float = 0.75
    disk_refuse_ratio: float = 0.90
    max_message_size: int = 4 * 1024 * 1024
    check_crc_on_recover: bool = True
    cleanup_interval: float = 10.0
    # Above this usage the oldest segments go even when younger than file_reserved_hours (RocketMQ's
    # diskSpaceCleanForciblyRatio), so a full disk does not refuse writes forever.
    disk_force_clean_ratio: float = 0.85
    # How often consume queues and the index are flushed and the checkpoint is written.
    logics_flush_interval: float = 1.0
    # Pre-fault new CommitLog segments in a worker thread (MAP_POPULATE, RocketMQ's
    # warmMapedFileEnable, off by default there too): the loop's appends take no page faults
    # (2.3 -> 0.35 us per 1 KiB record), but the whole segment is resident page cache from its
    # creation on, and while the kernel populates it the process's mmap lock is held, so the
    # loop's own allocations can stall behind it (seconds for 1 GiB on a busy machine).
    warm_segments: bool = False
    # Most consume-queue files mapped at once, store-wide; the least recently used is unmapped
    # (and mapped again when touched), so topic count never exhausts vm.max_map_count (65530) or,
    # on Python < 3.13 where a mapping holds a descriptor, RLIMIT_NOFILE. 2048 keeps the tail of
    # 2048 busy queues (256 topics x 8 queues) mapped, using 3 % of max_map_count; beyond that a
    # miss costs an munmap + mmap (15-25 us while the file's pages are cached), not an error. The
    # store lowers it to a quarter of the open-file limit when mappings hold descriptors
    # (queues.fd_fitted_limit). At least 2: a batch's units may span two files.
    max_mapped_queue_files: int = DEFAULT_MAX_MAPPED_QUEUE_FILES

    def __post_init__(self) -> None:
        if not isinstance(self.root, pathlib.Path):
            object.__setattr__(self, "root", pathlib.Path(self.root))
        if self.commitlog_segment_size < 4096:
            raise ConfigError(f"commitlog_segment_size {self.commitlog_segment_size} is below 4096 bytes")
        if self.consume_queue_units_per_file < 1:
            raise ConfigError("consume_queue_units_per_file must be at least 1")
        if self.index_hash_slots < 1 or self.index_max_entries < 2:
            raise ConfigError("index_hash_slots must be >= 1 and index_max_entries >= 2")
        if not 0.0 < self.disk_clean_ratio <= self.disk_refuse_ratio <= 1.0:
            raise ConfigError("disk ratios must satisfy 0 < disk_clean_ratio <= disk_refuse_ratio <= 1")
        if not self.disk_clean_ratio <= self.disk_force_clean_ratio:
            raise ConfigError("disk_force_clean_ratio must not be below disk_clean_ratio")
        if self.sync_flush_timeout <= 0 or self.async_flush_interval <= 0:
            raise ConfigError("flush interval and timeout must be positive")
        if self.max_message_size < 1:
            raise ConfigError("max_message_size must be positive")
        if self.max_mapped_queue_files < 2:
            raise ConfigError(f"max_mapped_queue_files {self.max_mapped_queue_files} must be at least 2")
        if any(not 0 <= h <= 23 for h in self.delete_when_hours):
            raise ConfigError(f"delete_when_hours {self.delete_when_hours} must be hours 0..23")

    @property
    def commitlog_dir(self) -> pathlib.Path:
        return self.root / "commitlog"

    @property
    def consume_queue_dir(self) -> pathlib.Path:
        return self.root / "consumequeue"

    @property
    def index_dir(self) -> pathlib.Path:
        return self.root / "index"

    @property
    def deleted_topics_path(self) -> pathlib.Path:
        return self.root / "deletedTopics.json"

    @property
    def pending_cut_path(self) -> pathlib.Path:
        return self.root / "pendingCut.json"

    @property
    def checkpoint_path(self) -> pathlib.Path:
        return self.root / "checkpoint"

    @property
    def abort_path(self) -> pathlib.Path:
        return self.root / "abort"
