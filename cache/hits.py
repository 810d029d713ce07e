"""Hit and miss counts kept in memory and written in batches, so warm lookups take no write lock."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import field

from portkern.base.records import record

#: Pending counts are written at least this often (seconds) by a process that keeps looking up.
FLUSH_S = 60.0


@record
class Pending:
    """Counts taken out of a `HitLog` to be written in one transaction."""

    hits: dict[str, tuple[int, float]] = field(default_factory=dict)
    hit_count: int = 0
    miss_count: int = 0

    def __bool__(self) -> bool:
        return bool(self.hit_count or self.miss_count)


class HitLog:
    """This process's lookups since the last write: per-entry hits with the latest use, and misses.

    A forked child starts with an empty log, so nothing is counted twice."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._pending = Pending()
        self._since = time.monotonic()

    def _current(self) -> Pending:
        if self._pid != os.getpid():
            self._reset()
        return self._pending

    def hit(self, key: str, when: float) -> None:
        with self._lock:
            pending = self._current()
            count, _ = pending.hits.get(key, (0, when))
            pending.hits[key] = (count + 1, when)
            pending.hit_count += 1

    def miss(self) -> None:
        with self._lock:
            self._current().miss_count += 1

    def pending(self) -> bool:
        """Whether any lookup has not been written yet."""
        with self._lock:
            return bool(self._current())

    def due(self) -> bool:
        """Whether counts have waited `FLUSH_S` or longer."""
        with self._lock:
            return bool(self._current()) and time.monotonic() - self._since >= FLUSH_S

    def take(self) -> Pending:
        """The pending counts, leaving the log empty."""
        with self._lock:
            pending = self._current()
            self._reset()
            return pending
