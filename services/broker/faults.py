"""Test-only fault injection for the broker: store observers built by the CLI's hidden test flags
(never from the environment), handed to the Broker as ``observer``.

:class:`FlushStall` (``--test-flush-stall-file PATH``): while the file ``path`` exists, every
CommitLog flush round waits (polling every 20 ms, on the flushing thread) before it starts, so
SYNC_FLUSH waits pile up exactly as behind a stalled disk. A test creates the file to start the
stall and deletes it to end it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from tidemq.broker.store.observer import StoreObserver

log = logging.getLogger(__name__)

POLL = 0.02


class FlushStall(StoreObserver):
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        log.warning("fault injection armed: CommitLog flushes stall while %s exists (test-only)", path)

    def before_flush_round(self) -> None:  # runs on the flushing thread, never on the event loop
        if self.path.exists():
            log.warning("fault injection: CommitLog flush stalled while %s exists", self.path)
            while self.path.exists():
                time.sleep(POLL)
            log.warning("fault injection: CommitLog flush resumed")
