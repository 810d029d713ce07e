"""One cache directory's SQLite database, `cache.db`: named records and the transactions around them.

`portkern_records` holds every value by name (`a/<key>` artifact bytes, `m/<key>` metadata JSON,
...: see `cache.store`); the entry index (`cache.index`) keeps its tables in the same file, so
one transaction moves a record and its index row together. The database runs in WAL mode:
readers never wait for a writer, and writers across threads and processes take turns with
`BEGIN IMMEDIATE` (waiting up to `timeout` seconds).

A directory this process cannot write (a read-only mount, an image layer) is opened with
SQLite's `mode=ro` URI; where SQLite cannot share a database that way (a WAL database whose
`-shm` file is absent and cannot be created, which is how a cleanly closed cache looks on a
read-only mount) with `immutable=1`: the file as last checkpointed, without locks. Every write
to such a database raises `sqlite3.OperationalError`.

A cache written by portkern before this layout (diskcache's `Cache` table, values of 32 KiB
and more in `ab/cd/<hex>.val` files) has its records moved into `portkern_records` the first
time it is opened writable (`install`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

DATABASE = "cache.db"
#: The page size of a new database, and how much of a database each connection maps into memory.
PAGE_SIZE = 1 << 16
MMAP_SIZE = 1 << 26
#: Bytes of write-ahead log kept after a checkpoint (a batch of large artifacts grows it past this).
WAL_KEPT = 64 << 20
#: Tried in order for a read-only directory.
_READ_ONLY_MODES = ("mode=ro", "mode=ro&immutable=1")
_RECORDS = "CREATE TABLE IF NOT EXISTS portkern_records (name TEXT PRIMARY KEY, value NOT NULL)"
#: diskcache's value modes: values kept in files as bytes or as UTF-8 text.
_DISKCACHE_TEXT = 3

log = logging.getLogger(__name__)

Value = bytes | str


def writable(directory: Path) -> bool:
    """Whether this process may create files in `directory` (false on a read-only mount, even for root).
    A directory that does not exist yet counts as writable: creating it is how a cache starts."""
    while not directory.exists() and directory.parent != directory:
        directory = directory.parent
    return os.access(directory, os.W_OK)


class _Local(threading.local):
    con: sqlite3.Connection | None = None
    pid: int = 0
    depth: int = 0


class Database:
    """The database of one cache directory, one connection per thread (and per process after a fork).

    Opening checks that the file can be read: `sqlite3.DatabaseError` when it is not a database,
    `sqlite3.OperationalError` (or `OSError`) when it cannot be opened, and, `read_only`,
    `FileNotFoundError` when there is none."""

    def __init__(self, directory: Path, read_only: bool = False, timeout: float = 60.0) -> None:
        self.directory = Path(directory)
        self.read_only = read_only
        self.timeout = timeout
        self._local = _Local()
        path = self.directory / DATABASE
        if not read_only:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._target = str(path)
            # These two take effect in a new database only: large pages for artifacts of megabytes,
            # and freed pages returned to the file system when entries are evicted.
            self._pragma("page_size", str(PAGE_SIZE), str(PAGE_SIZE))
            self._pragma("auto_vacuum", "1", "FULL")
            self._pragma("journal_mode", "wal", "WAL")
            return
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
        for mode in _READ_ONLY_MODES:
            self._target = f"{path.resolve().as_uri()}?{mode}"
            self.close()
            try:
                self.con.execute("SELECT count(*) FROM sqlite_master").fetchone()
                return
            except sqlite3.OperationalError:
                if mode == _READ_ONLY_MODES[-1]:
                    raise

    @property
    def con(self) -> sqlite3.Connection:
        """This thread's connection (autocommit outside `transact`)."""
        local = self._local
        if local.con is None or local.pid != os.getpid():
            con = sqlite3.connect(self._target, timeout=self.timeout, isolation_level=None, uri=self.read_only)
            con.execute(f"PRAGMA mmap_size = {MMAP_SIZE}")
            if not self.read_only:
                con.execute("PRAGMA synchronous = NORMAL")
                con.execute(f"PRAGMA journal_size_limit = {WAL_KEPT}")
            local.con, local.pid, local.depth = con, os.getpid(), 0
        return local.con

    def _pragma(self, name: str, current: str, value: str) -> None:
        """Set a persistent pragma unless it is set already, retrying while another process holds the lock."""
        start = time.monotonic()
        while True:
            try:
                (found,) = self.con.execute(f"PRAGMA {name}").fetchone()
                if str(found).lower() != current:
                    self.con.execute(f"PRAGMA {name} = {value}").fetchall()
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() - start > self.timeout:
                    raise
                time.sleep(0.001)

    def close(self) -> None:
        """Close this thread's connection."""
        con, self._local.con = self._local.con, None
        if con is not None:
            con.close()

    @contextmanager
    def transact(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (`BEGIN IMMEDIATE`) on this thread's connection; nested ones join it."""
        con, local = self.con, self._local
        if local.depth:
            local.depth += 1
            try:
                yield con
            finally:
                local.depth -= 1
            return
        con.execute("BEGIN IMMEDIATE")
        local.depth = 1
        try:
            yield con
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                with suppress(sqlite3.Error):
                    con.execute("ROLLBACK")
            raise
        finally:
            local.depth = 0

    # --- records ------------------------------------------------------------

    def get(self, name: str) -> Value | None:
        """A record's value (bytes or text as stored), or None."""
        row = self.con.execute("SELECT value FROM portkern_records WHERE name = ?", (name,)).fetchone()
        value: Value | None = None if row is None else row[0]
        return value

    def set(self, name: str, value: Value) -> None:
        self.con.execute("INSERT OR REPLACE INTO portkern_records VALUES (?, ?)", (name, value))

    def delete(self, name: str) -> bool:
        return self.con.execute("DELETE FROM portkern_records WHERE name = ?", (name,)).rowcount > 0

    def names(self, prefix: str = "") -> list[str]:
        """The names that start with `prefix`, in order."""
        return [name for (name,) in self.con.execute(*self._prefixed("name", prefix))]

    def count(self, prefix: str = "") -> int:
        (found,) = self.con.execute(*self._prefixed("count(*)", prefix)).fetchone()
        return int(found)

    @staticmethod
    def _prefixed(what: str, prefix: str) -> tuple[str, tuple[str, ...]]:
        if not prefix:
            return f"SELECT {what} FROM portkern_records ORDER BY name", ()
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        return f"SELECT {what} FROM portkern_records WHERE name >= ? AND name < ? ORDER BY name", (prefix, upper)

    def clear(self) -> None:
        self.con.execute("DELETE FROM portkern_records")

    # --- layout -------------------------------------------------------------

    def installed(self) -> bool:
        """Whether the records table is there and nothing is left to move into it (a read, no lock)."""
        tables = {name for (name,) in self.con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('portkern_records', 'Cache')")}
        return tables == {"portkern_records"}

    def install(self) -> list[Path]:
        """Create the records table (inside the caller's transaction), moving in the records of a
        cache written with diskcache; the folders of its value files, to remove once the transaction
        is committed."""
        con = self.con
        con.execute(_RECORDS)
        if con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'Cache'").fetchone() is None:
            return []
        moved, folders = 0, set()
        for name, filename, mode, value in con.execute("SELECT key, filename, mode, value FROM Cache WHERE raw = 1").fetchall():
            if filename is not None:
                folders.add(self.directory / Path(filename).parts[0])
                try:
                    value = (self.directory / filename).read_bytes()
                except OSError:
                    continue  # a value file lost before: the entry reads as damaged and is removed
                if mode == _DISKCACHE_TEXT:
                    with suppress(UnicodeDecodeError):
                        value = value.decode()
            if isinstance(name, str) and isinstance(value, (bytes, str)):
                self.set(name, value)
                moved += 1
        con.execute("DROP TABLE Cache")
        con.execute("DROP TABLE IF EXISTS Settings")
        log.info("portkern cache at %s: %d records moved from the diskcache layout", self.directory, moved)
        return sorted(folders)
