"""PollCache: what the lite-pull consumer's pull loops fetched and poll() has not handed out.

Pure state. Entries are whole pull results ``(queue, process queue, messages)`` in arrival order;
:meth:`take` hands out up to ``n`` messages across entries, splitting the last one if needed, and
skips entries of dropped process queues. Invariant: ``count`` is the number of messages held.
"""

from __future__ import annotations

from collections import deque

from tidemq.client.push.process_queue import ProcessQueue
from tidemq.client.route import MessageQueue
from tidemq.message import MessageExt

Entry = tuple[MessageQueue, ProcessQueue, list[MessageExt]]


class PollCache:
    def __init__(self) -> None:
        self._entries: deque[Entry] = deque()
        self.count = 0

    def add(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        self._entries.append((mq, pq, msgs))
        self.count += len(msgs)

    def take(self, n: int) -> list[Entry]:
        """Up to ``n`` messages, grouped by the entry they came from, oldest first."""
        out: list[Entry] = []
        room = n
        while self._entries and room > 0:
            mq, pq, msgs = self._entries.popleft()
            self.count -= len(msgs)
            if pq.dropped:
                continue
            if len(msgs) > room:
                self._entries.appendleft((mq, pq, msgs[room:]))
                self.count += len(msgs) - room
                msgs = msgs[:room]
            out.append((mq, pq, msgs))
            room -= len(msgs)
        return out

    def holds(self, mq: MessageQueue) -> bool:
        return any(e[0] == mq for e in self._entries)

    def drop(self, mq: MessageQueue) -> None:
        self._entries = deque(e for e in self._entries if e[0] != mq)
        self.count = sum(len(e[2]) for e in self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.count = 0
