"""The store's test seam: an observer told of file creations, fdatasyncs and CommitLog flush rounds.

Fault-injection tests watch and stall the store through it (the power-loss shadow in
tidemq.broker.store.faults, the flush stall in tidemq.broker.faults). It is a visible parameter,
``observer: StoreObserver | None = None  # used for testing``, built at the edge (the CLI's hidden
test flags, or a test) and handed down: MessageStore -> CommitLog, QueueTable / ConsumeQueue,
IndexService -> every store file (mapped_file.StoreFile), and the CommitLog flusher. There are no module-global hooks:
two stores in one process never see each other's observer. Production passes none, and each
hook costs one ``is not None`` check where it would be called.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidemq.broker.store.mapped_file import MappedFile


class StoreObserver:
    """Hooks with nothing in them; an observer overrides those it needs. Every hook runs on a
    store worker thread or at load, never on the event loop's hot path."""

    def file_created(self, path: Path) -> None:
        """``path`` was (re)created, all zeros: none of its content is durable yet."""

    def file_synced(self, mf: MappedFile) -> None:
        """``mf`` was just fdatasynced: its content (read through ``mf.mm``, a private read-only
        mapping valid during the call) is on disk."""

    def before_flush_round(self) -> None:
        """A CommitLog flush round is about to fdatasync (on the flushing thread)."""


class ObserverChain(StoreObserver):
    """Several observers, told in order."""

    def __init__(self, observers: Sequence[StoreObserver]) -> None:
        self.observers = tuple(observers)

    def file_created(self, path: Path) -> None:
        for o in self.observers:
            o.file_created(path)

    def file_synced(self, mf: MappedFile) -> None:
        for o in self.observers:
            o.file_synced(mf)

    def before_flush_round(self) -> None:
        for o in self.observers:
            o.before_flush_round()


def chain(observers: Sequence[StoreObserver]) -> StoreObserver | None:
    """One observer for all of ``observers``: None for none, the one itself for one."""
    if not observers:
        return None
    return observers[0] if len(observers) == 1 else ObserverChain(observers)
