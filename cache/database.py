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

Releases of portkern before this layout kept the same records in diskcache's `Cache` table
(values of 32 KiB and more in `ab/cd/<hex>.val` files, text as UTF-8) in the same `cache.db`,
and such a release may still be running beside this one, sharing the directory (its
`diskcache.Cache` creates the table again whenever it opens the directory). So that table is
never moved or dropped: while it exists (`legacy`), reads fall through to it (`get`, `names`,
`count`), and deletes and `clear` remove a record from both tables (a value file once the
transaction that removed its row has committed). New records go to `portkern_records` only.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from portkern.cache.layout import DATABASE

#: The page size of a new database, and how much of a database each connection maps into memory.
PAGE_SIZE = 1 << 16
MMAP_SIZE = 1 << 26
#: Bytes of write-ahead log kept after a checkpoint (a batch of large artifacts grows it past this).
WAL_KEPT = 64 << 20
#: Seconds a write waits for another process's write lock where waiting longer is not worth it: once
#: a wait of `Database.timeout` has run out in this process, and for what the store drops when busy
#: (hit counts, counters, memos): a process that holds the lock long (an import, a verify, a stopped
#: writer) keeps neither a lookup nor an exit waiting.
LOCKED_WAIT = 0.25
#: Tried in order for a read-only directory.
_READ_ONLY_MODES = ("mode=ro", "mode=ro&immutable=1")
_RECORDS = "CREATE TABLE IF NOT EXISTS portkern_records (name TEXT PRIMARY KEY, value NOT NULL)"
#: diskcache's table, and its value mode of text kept in a file (as UTF-8).
LEGACY = "Cache"
_DISKCACHE_TEXT = 3
#: Whether a table of that name is in the database.
_HAS_TABLE = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
#: A record's value (NULL: none), and whether diskcache's table is there: one statement, a miss included.
_GET = f"SELECT (SELECT value FROM portkern_records WHERE name = ?), EXISTS ({_HAS_TABLE})"

Value = bytes | str


def identity(path: Path) -> tuple[int, int] | None:
    """Which file is at `path` now (device and inode), or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


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
    #: Value files of diskcache rows deleted in the open transaction: removed once it commits.
    doomed: list[Path] | None = None
    #: Whether a `get` since the last `took_legacy` was answered from diskcache's table.
    legacy_read: bool = False


def locked(exc: BaseException) -> bool:
    """Whether an error says another connection holds the lock this one waited for ("database is locked")."""
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


class Database:
    """The database of one cache directory, one connection per thread (and per process after a fork).

    Opening checks that the file can be read: `sqlite3.DatabaseError` when it is not a database,
    `sqlite3.OperationalError` (or `OSError`) when it cannot be opened, and, `read_only`,
    `FileNotFoundError` when there is none."""

    def __init__(self, directory: Path, read_only: bool = False, timeout: float = 60.0) -> None:
        self.directory = Path(directory)
        self.read_only = read_only
        self.timeout = timeout
        #: How long `transact` waits for another process's write transaction when not told: None
        #: (`timeout`), or `LOCKED_WAIT` once a wait of `timeout` ran out, until a transaction begins.
        self.write_wait: float | None = None
        self._local = _Local()
        path = self.directory / DATABASE
        if not read_only:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._target = str(path)
            # A database being made holds nothing to lose: its making waits for no disk flush.
            made = not path.exists()
            if made:
                self.con.execute("PRAGMA synchronous = OFF")
            # These two take effect in a new database only: large pages for artifacts of megabytes,
            # and freed pages returned to the file system when entries are evicted.
            self._pragma("page_size", str(PAGE_SIZE), str(PAGE_SIZE))
            self._pragma("auto_vacuum", "1", "FULL")
            self._pragma("journal_mode", "wal", "WAL")
            if made:
                self.con.execute("PRAGMA synchronous = NORMAL")
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
                if not locked(exc) or time.monotonic() - start > self.timeout:
                    raise
                time.sleep(0.001)

    def close(self) -> None:
        """Close this thread's connection."""
        con, self._local.con = self._local.con, None
        if con is not None:
            con.close()

    @contextmanager
    def transact(self, wait: float | None = None) -> Iterator[sqlite3.Connection]:
        """A write transaction (`BEGIN IMMEDIATE`) on this thread's connection; nested ones join it.
        Another process's write transaction is waited for up to `wait` seconds, then
        `sqlite3.OperationalError` ("database is locked"); by default `timeout`, and after a wait of
        `timeout` ran out `LOCKED_WAIT` until a transaction begins again (a process that holds the
        lock that long, a stopped one, keeps this one waiting once, not for each write)."""
        con, local = self.con, self._local
        if local.depth:
            local.depth += 1
            try:
                yield con
            finally:
                local.depth -= 1
            return
        if wait is None:
            wait = self.write_wait
        if wait is None:
            try:
                con.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if locked(exc):
                    self.write_wait = LOCKED_WAIT
                raise
        else:
            con.execute(f"PRAGMA busy_timeout = {max(0, int(wait * 1000))}")
            try:
                con.execute("BEGIN IMMEDIATE")
            finally:
                con.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
        self.write_wait = None
        local.depth, local.doomed = 1, []
        try:
            yield con
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                with suppress(sqlite3.Error):
                    con.execute("ROLLBACK")
            raise
        else:
            for path in local.doomed:
                with suppress(OSError):
                    path.unlink()
        finally:
            local.depth, local.doomed = 0, None

    # --- records ------------------------------------------------------------

    def get(self, name: str) -> Value | None:
        """A record's value (bytes or text as stored), or None; from diskcache's table when this
        layout has none of that name and an older release keeps records there."""
        row = self.con.execute(_GET, (name, LEGACY)).fetchone()
        value: Value | None = row[0]
        if value is not None or not row[1]:  # (row[1]: diskcache's table is there)
            return value
        value = self._legacy_get(name)
        if value is not None:
            self._local.legacy_read = True
        return value

    def set(self, name: str, value: Value) -> None:
        self.con.execute("INSERT OR REPLACE INTO portkern_records VALUES (?, ?)", (name, value))

    def delete(self, name: str) -> bool:
        found = self.con.execute("DELETE FROM portkern_records WHERE name = ?", (name,)).rowcount > 0
        if self.legacy():
            found = self._legacy_delete(name) or found
        return found

    def names(self, prefix: str = "") -> list[str]:
        """The names that start with `prefix`, in order (of both layouts)."""
        found = [name for (name,) in self.con.execute(*self._prefixed("name", "portkern_records", "name", prefix))]
        if self.legacy():
            found = sorted({*found, *(name for (name,) in self.con.execute(*self._prefixed("key", LEGACY, "key", prefix))
                                      if isinstance(name, str))})
        return found

    def count(self, prefix: str = "") -> int:
        if self.legacy():
            return len(self.names(prefix))
        (found,) = self.con.execute(*self._prefixed("count(*)", "portkern_records", "name", prefix)).fetchone()
        return int(found)

    @staticmethod
    def _prefixed(what: str, table: str, column: str, prefix: str) -> tuple[str, tuple[str, ...]]:
        # diskcache rows of this layout's kinds: str keys, values as bytes or text (in a file or
        # not); the pre-index release's hit counters (`s/hits`, integers) are none of them.
        raw = " AND raw = 1 AND (filename IS NOT NULL OR typeof(value) IN ('text', 'blob'))" if table == LEGACY else ""
        if not prefix:
            return f"SELECT {what} FROM {table} WHERE typeof({column}) = 'text'{raw} ORDER BY {column}", ()
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        return f"SELECT {what} FROM {table} WHERE {column} >= ? AND {column} < ?{raw} ORDER BY {column}", (prefix, upper)

    def clear(self) -> None:
        self.con.execute("DELETE FROM portkern_records")
        if self.legacy():
            self.con.execute(f"DELETE FROM {LEGACY}")  # its value files go with the directory's other files

    # --- the layout of older releases ------------------------------------------

    def legacy(self) -> bool:
        """Whether diskcache's table is in the database (an older release wrote, or still writes, here)."""
        return self.con.execute(_HAS_TABLE, (LEGACY,)).fetchone() is not None

    def took_legacy(self) -> bool:
        """Whether a `get` of this thread since the last call was answered from diskcache's table."""
        found, self._local.legacy_read = self._local.legacy_read, False
        return found

    def _legacy_get(self, name: str) -> Value | None:
        row = self.con.execute(f"SELECT filename, mode, value FROM {LEGACY} WHERE key = ? AND raw = 1", (name,)).fetchone()
        if row is None:
            return None
        filename, mode, value = row
        if filename is not None:
            from portkern.base.framing import open_regular  # (diskcache's value files only)

            try:  # (a named pipe or a device there is refused, not read)
                f, _ = open_regular(self.directory / filename, "a cache value", OSError)
                with f:
                    value = f.read()
            except OSError:
                return None  # removed meanwhile by its writer, or lost: the entry reads as damaged
            if mode == _DISKCACHE_TEXT:
                with suppress(UnicodeDecodeError):
                    value = value.decode()
        return value if isinstance(value, (bytes, str)) else None

    def _legacy_delete(self, name: str) -> bool:
        files = [self.directory / f for (f,) in self.con.execute(
            f"SELECT filename FROM {LEGACY} WHERE key = ? AND raw = 1 AND filename IS NOT NULL", (name,))]
        found = self.con.execute(f"DELETE FROM {LEGACY} WHERE key = ? AND raw = 1", (name,)).rowcount > 0
        doomed = self._local.doomed
        if doomed is not None:
            doomed += files
        else:
            for path in files:
                with suppress(OSError):
                    path.unlink()
        return found

    def legacy_folders(self) -> frozenset[str]:
        """The top-level folders of the directory that hold diskcache's value files (none
        without its table): part of the cache while an older release may write there."""
        if not self.legacy():
            return frozenset()
        return frozenset(name for name in os.listdir(self.directory) if len(name) == 2 and all(c in "0123456789abcdef" for c in name))

    # --- layout -------------------------------------------------------------

    def installed(self) -> bool:
        """Whether the records table is there (a read, no lock)."""
        return self.con.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'portkern_records'").fetchone() is not None

    def install(self) -> None:
        """Create the records table (inside the caller's transaction). The records an older
        release keeps in diskcache's table stay where they are and are read from there."""
        self.con.execute(_RECORDS)
