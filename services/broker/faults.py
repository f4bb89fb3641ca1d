"""Test-only fault injection for the broker, enabled through BrokerConfig (never the environment).

``install_flush_stall(store, path)``: while the file ``path`` exists, every CommitLog flush round
waits (polling every 20 ms, on the flushing thread) before it starts, so SYNC_FLUSH waits pile
up exactly as behind a stalled disk. A test creates the file to start the stall and deletes it to end it. Nothing is
installed unless ``BrokerConfig.fault_flush_stall_file`` is set.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from tidemq.broker.store.store import MessageStore

log = logging.getLogger(__name__)

POLL = 0.02


def install_flush_stall(store: MessageStore, path: Path) -> None:
    flusher = store._flusher  # the store's CommitLog flusher: it calls before_round on its thread

    def stall() -> None:  # runs on the flushing thread, never on the event loop
        if path.exists():
            log.warning("fault injection: CommitLog flush stalled while %s exists", path)
            while path.exists():
                time.sleep(POLL)
            log.warning("fault injection: CommitLog flush resumed")

    flusher.before_round = stall
    log.warning("fault injection armed: CommitLog flushes stall while %s exists (test-only)", path)
