"""The per-device store: native artifacts, tuning results, device probes and bundle checks, in SQLite.

Records in one directory's database (`cache.database`; `str` and `bytes` values only):

- `a/<key>`: the native artifact's bytes;
- `m/<key>`: its metadata, JSON (an `Entry`), written in the same transaction;
- `t/<key>`: a tuning result, JSON;
- `p/<key>`: a memoised device probe, JSON;
- `v/<key>`: the memo "a bundle with this digest passed this schema", JSON;
- `s/<key>`: the memo "this signature over these bytes verified with this trusted key"
  (`cache.verified`), JSON;
- beside them, the entry index (`cache.index`): size, last use,
  hits, kernel, bundle and device of every artifact, per-device totals kept by
  triggers, and the hit/miss counters.

Every artifact read re-hashes the bytes against the sha256 in its metadata; a
mismatch, or a record that does not decode to its kind, evicts that entry (logged
on `portkern.cache.store`) and reads as a miss. A database SQLite cannot read is moved
aside to `cache.db.damaged-<time>-<pid>` (logged) and a fresh one started. Any other failure of
the cache becomes one warning and the store carries on without that directory,
opening it again after `RETRY_FIRST` lookups, then after twice as many each
time it still fails (at most `RETRY_MAX`): a directory cleared or replaced
under a running process is used again once it is usable. A directory that can
be read but not written (a full disk) keeps serving its entries: only writes
are refused, with one warning. Kernels never fail because of the cache.

Costs do not grow with the number of entries: a put updates the index and
totals in its own transaction and evicts, when over budget, least recently
used entries by the index down to `LOW_WATER` of the budget; a warm lookup
writes nothing (hits are counted in memory and written with the next write, at
least every `hits.FLUSH_S` seconds, and at exit).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import sqlite3
import time
import warnings
import weakref
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Iterator, TypeVar

from portkern.base import settings
from portkern.base.errors import CacheError
from portkern.base.logs import logger
from portkern.cache import index, layout
from portkern.cache.config import CacheConfig, CacheWarning, from_env
from portkern.cache.database import LOCKED_WAIT, Database, identity, locked, writable
from portkern.cache.device import DeviceFingerprint
from portkern.cache.entry import CorruptRecordError, Entry
from portkern.cache.hits import HitLog, Pending
from portkern.cache.index import Filter
from portkern.cache.keys import tuning_key

if TYPE_CHECKING:
    from portkern.cache.remote import RemoteCache
    from portkern.cache.repair import Finding

_T = TypeVar("_T")

__all__ = ["CacheWarning", "Entry", "Filter", "Finding", "Store", "default_store", "matches_device", "UNUSABLE"]

log = logger(__name__)

#: Set (to the reason) in a stored tuning result whose config failed to build on its device:
#: the record stays (an import or the remote tier would bring it back) but is not used again.
UNUSABLE = "unusable"

#: After going over budget, evict down to this fraction of it (so eviction runs rarely, in batches).
LOW_WATER = 0.9
#: Entries written per transaction by `put_many`.
BATCH = 500
#: ... and at most this many bytes of artifacts (a larger artifact goes alone): every byte a
#: transaction writes passes through the write-ahead log.
BATCH_BYTES = 64 << 20
#: A directory that could not be opened (or only read) is tried again after this many lookups,
#: then after twice as many each time it still fails, up to `RETRY_MAX`.
RETRY_FIRST = 1
RETRY_MAX = 64


def damaged(exc: BaseException) -> bool:
    """Whether an error says the database file itself is unreadable (not a lock, not a full disk)."""
    return type(exc) is sqlite3.DatabaseError


def _text(db: Database, name: str) -> Any:
    """A stored JSON text; `CorruptRecordError` when its bytes are not text."""
    try:
        return db.get(name)
    except UnicodeDecodeError:
        raise CorruptRecordError("not UTF-8 text") from None
    except sqlite3.OperationalError as exc:
        if "decode" in str(exc).lower():
            raise CorruptRecordError("not UTF-8 text") from None
        raise


def _decode_record(text: Any) -> dict[str, Any]:
    try:
        record = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise CorruptRecordError(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(record, dict):
        raise CorruptRecordError("not a JSON object")
    return record


def _index_row(entry: Entry) -> index.Row:
    try:
        digest = DeviceFingerprint.from_dict(entry.device).digest()
    except (AttributeError, KeyError, TypeError):  # a device record we cannot read is only unmatchable by digest
        digest = ""
    return index.Row(entry.key, entry.size, entry.created, entry.last_used, entry.hits,
                     entry.kernel, entry.bundle, entry.device_label, digest)


def _row_entry(row: index.Row) -> Entry:
    """A summary entry from an index row alone (for what eviction reports)."""
    return Entry(key=row.key, kernel=row.kernel, bundle=row.bundle, bundle_digest="", device={},
                 device_label=row.device_label, config="", format="", size=row.size, sha256="", compiler="",
                 created=row.created, last_used=row.last_used, hits=row.hits)


class _Layer:
    """One cache directory and this process's connection to it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        #: Its database file (whose identity every lookup compares with the one open).
        self.database = directory / layout.DATABASE
        self.db: Database | None = None
        self.identity: tuple[int, int] | None = None
        self.broken: str | None = None
        self.moved_aside = False
        self.read_only = False
        #: Why a directory this process may write is only read (its open for writing failed: a full disk).
        self.refused: str | None = None
        #: Failed opens in a row, and lookups left until the next try (0: none pending).
        self.failures = 0
        self.retry_in = 0
        self.warned = False
        self.write_warned = False

    @property
    def state(self) -> str:
        return "not usable" if self.broken else "read-only" if self.read_only else "writable"

    @property
    def problem(self) -> str | None:
        return self.broken or self.refused

    def back_off(self) -> None:
        """Schedule the next open after a failed one."""
        self.failures += 1
        self.retry_in = min(RETRY_FIRST << min(self.failures - 1, 16), RETRY_MAX)


class Store:
    """One or more cache directories, looked up in order; new entries go to the first writable one.
    Methods never raise for cache failures; they warn once."""

    def __init__(self, config: CacheConfig | None = None, remote: RemoteCache | None = None) -> None:
        self.config = config or from_env()
        #: The fleet's shared tier, if any: tuning results read and write through it here;
        #: native code goes through it in the loader, which alone publishes what it built.
        self.remote = remote
        self._layers = [_Layer(directory) for directory in self.config.directories]
        self._unwritable_warned = False
        self._hits = HitLog()
        if self.config.disabled:
            for layer in self._layers:
                layer.broken = "disabled by PORTKERN_CACHE_DISABLE"
        _live.add(self)

    @property
    def directory(self) -> Path:
        """Where new entries go: the first writable directory (the first directory when none is)."""
        layer = self._writer(warn=False)
        return layer.directory if layer is not None else self.config.directory

    @property
    def enabled(self) -> bool:
        return any(self._open(layer) is not None for layer in self._layers)

    def places(self) -> list[dict[str, str]]:
        """Each directory in lookup order with its state: writable, read-only or not usable (and why)."""
        for layer in self._layers:
            self._open(layer)
        return [{"directory": str(layer.directory), "state": layer.state, **({"problem": layer.problem} if layer.problem else {})}
                for layer in self._layers]

    # --- plumbing -----------------------------------------------------------

    def _connect(self, layer: _Layer) -> Database:
        """A connection to the database at the directory now; the file it opened is recorded as
        `layer.identity` (a database another process replaces during the open is opened again)."""
        for _ in range(3):
            db = self._connect_once(layer)
            if layer.identity == identity(layer.database):
                return db
            db.close()  # cleared or moved aside while it was opened: which file it opened is unknown
        return self._connect_once(layer)

    def _connect_once(self, layer: _Layer) -> Database:
        seen = identity(layer.database)
        layer.read_only = not writable(layer.directory)
        layer.refused = None
        if layer.read_only:
            db = Database(layer.directory, read_only=True)
        else:
            try:
                db = Database(layer.directory)
            except (sqlite3.OperationalError, OSError) as exc:
                db = self._read_instead(layer, exc)
        try:
            if not self._installed(db):
                if db.read_only:
                    raise sqlite3.OperationalError("written by an older portkern: open it writable once")
                with db.transact():
                    if not self._installed(db):
                        self._install(db)
            self._adopt(db)
            now = identity(layer.database)
            layer.identity = now if seen is None or now == seen else None  # None: replaced during the open
        except BaseException:
            db.close()
            raise
        return db

    @staticmethod
    def _installed(db: Database) -> bool:
        return db.installed() and index.installed(db.con)

    def _install(self, db: Database) -> None:
        """The records table and the entry index (inside the caller's transaction), for a new
        database or one an older portkern wrote."""
        db.install()
        if not index.installed(db.con):
            index.install(db.con, self._unindexed(db))

    def _adopt(self, db: Database) -> int:
        """Index what an older release sharing this directory changed behind the index (nothing
        to do, and nothing read, where none ever opened it: `Database.legacy`): its entries
        (diskcache's layout, indexed by it or not) and entries of this layout whose index rows
        it removed (it cannot see them) are indexed; index rows of entries it removed go. Whether
        anything changed. Read-only databases are left as they are."""
        if db.read_only or not db.legacy():
            return 0
        with db.transact():
            con = db.con
            meta = {name[2:] for name in db.names("m/")}
            indexed = index.keys(con)
            added = removed = 0
            for key in sorted(meta - indexed):
                found = self._load(db, key)
                if isinstance(found, tuple):
                    index.add(con, _index_row(found[1]))
                    added += 1
            for key in sorted(indexed - meta):
                index.remove(con, key)
                removed += 1
        if added or removed:
            log.info("portkern cache at %s: %d entries an older portkern wrote indexed, %d index rows of entries it "
                     "removed dropped", db.directory, added, removed)
        return added + removed

    def _read_instead(self, layer: _Layer, exc: BaseException) -> Database:
        """A directory that cannot be opened for writing (a full disk), opened to read its entries;
        `exc` again when it cannot be read either."""
        if not layer.database.is_file():
            raise exc
        try:
            db = Database(layer.directory, read_only=True)
        except Exception:  # noqa: BLE001 - the failure to report is the first one
            raise exc from None
        layer.read_only = True
        layer.refused = f"open for writing: {type(exc).__name__}: {exc}"
        layer.back_off()
        self._refuse(layer)
        return db

    def _refuse(self, layer: _Layer, problem: str | None = None) -> None:
        """Say once per directory that new entries are not stored there."""
        if not layer.write_warned:
            layer.write_warned = True
            warnings.warn(
                f"portkern cache at {layer.directory} cannot store new entries ({problem or layer.refused}); "
                "its cached kernels are still served",
                CacheWarning,
                stacklevel=5,
            )

    def _open(self, layer: _Layer) -> Database | None:
        if layer.retry_in:  # after a failed (or read-only) open: try again once enough lookups have passed
            layer.retry_in -= 1
            if layer.retry_in == 0:
                self._close_connection(layer)
                layer.broken = None
        if layer.db is not None and identity(layer.database) != layer.identity:
            self._close_connection(layer)  # cleared or moved aside by another process: open the new one
        if layer.db is None and layer.broken is None:
            before = identity(layer.database)
            try:
                layer.db = self._connect(layer)
            except Exception as exc:  # noqa: BLE001 - any cache failure degrades, never fails
                if damaged(exc) and not layer.read_only and self._move_aside(layer, exc, before):
                    try:
                        layer.db = self._connect(layer)
                    except Exception as again:  # noqa: BLE001 - as above: the cache degrades, never fails
                        self._fail(layer, "open", again)
                else:
                    self._fail(layer, "open", exc)
            if layer.db is not None and layer.refused is None:
                layer.failures = layer.retry_in = 0
        return layer.db

    def _writer(self, warn: bool = True) -> _Layer | None:
        """The first writable directory; None (one warning, when `warn`) when every usable one is read-only."""
        for layer in self._layers:
            if self._open(layer) is not None and not layer.read_only:
                return layer
        read_only = [str(layer.directory) for layer in self._layers if layer.read_only and layer.problem is None]
        if warn and read_only and not self._unwritable_warned:
            self._unwritable_warned = True
            warnings.warn(
                f"portkern cache at {', '.join(read_only)} is read-only and PORTKERN_CACHE_DIR lists no writable "
                f"directory (separate several with {os.pathsep!r}); cached kernels are served, new ones are not stored",
                CacheWarning,
                stacklevel=4,
            )
        return None

    def _move_aside(self, layer: _Layer, exc: BaseException, seen: tuple[int, int] | None) -> bool:
        """Move an unreadable database aside (once per store); whether to open a fresh one."""
        if layer.moved_aside:
            return False
        layer.moved_aside = True
        self._close_connection(layer)
        database = layer.database
        if identity(database) != seen:
            return True  # another process already replaced it
        from portkern.cache import repair  # (verify, clear and damage only: not on a lookup's path)

        try:
            aside = repair.move_aside(layer.directory)
        except OSError as error:
            self._fail(layer, "move aside", error)
            return False
        log.warning("portkern cache database %s cannot be read (%s); moved aside to %s, starting a fresh one", database, exc, aside.name)
        return True

    def _fail(self, layer: _Layer, what: str, exc: BaseException) -> None:
        """Stop using a directory (one warning per directory) until its next try (`RETRY_FIRST`)."""
        if layer.broken is None:
            layer.broken = f"{what}: {type(exc).__name__}: {exc}"
            layer.back_off()
        if not layer.warned:
            layer.warned = True
            warnings.warn(
                f"portkern cache at {layer.directory} is not usable ({layer.broken}); running without it "
                "until it can be opened again",
                CacheWarning,
                stacklevel=3,
            )
        self._close_connection(layer)

    def _guard(self, layer: _Layer | None, what: str, action: Callable[[Database], _T], default: _T,
               writing: bool = False) -> _T:
        """`action(db)` on one directory; `default` when it is absent, unusable or fails. A
        `writing` action that fails leaves the directory in use for reads (one warning)."""
        if layer is None:
            return default
        for attempt in range(2):  # a second time on a fresh database after moving a damaged one aside
            db = self._open(layer)
            if db is None:
                return default
            try:
                return action(db)
            except Exception as exc:  # noqa: BLE001 - the store's boundary: a failing directory degrades, never fails a kernel
                if attempt == 0 and damaged(exc) and not layer.read_only and self._move_aside(layer, exc, layer.identity):
                    continue
                if writing and not damaged(exc):
                    self._refuse(layer, f"{what}: {type(exc).__name__}: {exc}")
                    return default
                self._fail(layer, what, exc)
                return default
        return default

    def _each(self, what: str, action: Callable[[Database], _T], default: _T) -> Iterator[_T]:
        """`action(db)` on every usable directory in lookup order."""
        for layer in self._layers:
            yield self._guard(layer, what, action, default)

    def _write(self, what: str, action: Callable[[Database], _T], default: _T) -> _T:
        """`action(db)` on the directory new entries go to."""
        return self._guard(self._writer(), what, action, default, writing=True)

    @staticmethod
    def _close_connection(layer: _Layer) -> None:
        if layer.db is not None:
            try:
                layer.db.close()
            except Exception:  # noqa: BLE001 - closing a broken database must not raise
                pass
            layer.db = None

    def close(self) -> None:
        """Write pending hit counts and close the databases."""
        self.flush()
        for layer in self._layers:
            self._close_connection(layer)

    def _corrupt(self, db: Database, key: str, problem: str, label: str = "") -> None:
        if db.read_only:
            log.warning("portkern cache entry %s%s in read-only %s is corrupt; not used (%s)", key[:16], label, db.directory, problem)
            return
        with db.transact():  # under the writers' lock: an entry written meanwhile is intact now
            if isinstance(self._load(db, key), tuple):
                return
            self._remove(db, key)
        log.warning("portkern cache entry %s%s is corrupt; evicted, it will be rebuilt (%s)", key[:16], label, problem)

    # --- artifacts ----------------------------------------------------------

    def _load(self, db: Database, key: str) -> tuple[bytes, Entry] | str | None:
        """An intact artifact and its metadata, None when absent, or what is wrong with it."""
        try:
            meta = _text(db, f"m/{key}")
            if meta is None:
                return None
            entry = Entry.from_json(meta)
        except CorruptRecordError as exc:
            return f"metadata record {exc}"
        if entry.key != key:
            return "metadata record belongs to another key"
        data = db.get(f"a/{key}")
        if data is None:
            return "artifact missing"
        if not isinstance(data, bytes) or len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
            return "artifact does not match its sha256"
        return data, entry

    def get(self, key: str, *, count: bool = True) -> tuple[bytes, Entry] | None:
        """The artifact and its metadata, if present and intact (counts a hit or miss; writes nothing
        until a batch of counts is due)."""

        def read(db: Database) -> tuple[bytes, Entry] | None:
            db.took_legacy()
            found = self._load(db, key)
            if isinstance(found, str):
                found = self._load(db, key)  # a concurrent delete or replace reads right the second time
                if isinstance(found, str):
                    self._corrupt(db, key, found)
                    found = None
            if found is not None and db.took_legacy() and not db.read_only and index.lookup(db.con, key) is None:
                with db.transact():  # an entry an older release wrote: counted from now on
                    index.add(db.con, _index_row(found[1]))
            return found

        found = next((hit for hit in self._each("read", read, None) if hit is not None), None)
        if count:
            if found is None:
                self._hits.miss()
            else:
                self._hits.hit(key, time.time())
        if count and self._hits.due():
            self.flush()
        return found

    def _prepare(self, key: str, data: bytes, entry: Entry) -> tuple[str, bytes, Entry]:
        entry.key = key
        entry.size = len(data)
        entry.sha256 = hashlib.sha256(data).hexdigest()
        entry.created = entry.created or time.time()
        entry.last_used = entry.last_used or entry.created
        entry.hits = 0
        return key, bytes(data), entry

    def put(self, key: str, data: bytes, entry: Entry) -> bool:
        """Store an artifact (evicting least recently used ones if over budget); False if the cache could not take it."""
        return self.put_many([(key, data, entry)]) == 1

    def put_many(self, items: Iterable[tuple[str, bytes, Entry]]) -> int:
        """Store artifacts, `BATCH` (or `BATCH_BYTES`) per transaction; how many were stored."""
        batches: list[list[tuple[str, bytes, Entry]]] = []
        size = 0
        for item in items:
            if not batches or len(batches[-1]) == BATCH or size + len(item[1]) > BATCH_BYTES:
                batches.append([])
                size = 0
            batches[-1].append(self._prepare(*item))
            size += len(item[1])
        stored = 0
        for batch in batches:

            def write(db: Database, batch: list[tuple[str, bytes, Entry]] = batch) -> int:
                with db.transact():
                    self._write_counts(db)
                    for key, data, entry in batch:
                        db.set(f"a/{key}", data)
                        db.set(f"m/{key}", entry.to_json())
                        index.add(db.con, _index_row(entry))
                    self._evict(db, self.config.max_size, int(self.config.max_size * LOW_WATER))
                return len(batch)

            done = self._write("write", write, 0)
            stored += done
            if not done:
                break
        return stored

    def delete(self, key: str) -> bool:
        def remove(db: Database) -> bool:
            with db.transact():
                return self._remove(db, key)

        return bool(self._write("delete", remove, False))

    @staticmethod
    def _remove(db: Database, key: str) -> bool:
        """Remove an entry's index row, metadata and artifact (inside the caller's transaction)."""
        indexed = index.remove(db.con, key)
        found = db.delete(f"m/{key}")
        db.delete(f"a/{key}")
        return bool(indexed or found)

    def _evict(self, db: Database, budget: int, target: int) -> list[Entry]:
        """When the entries pass `budget` bytes, remove least recently used ones until they fit `target`."""
        con = db.con
        total = index.total_bytes(con)
        evicted: list[Entry] = []
        if total <= budget:
            return evicted
        while total > target:
            victims = index.least_recent(con, 256)
            if not victims:
                break
            for row in victims:
                if total <= target:
                    break
                self._remove(db, row.key)
                total -= row.size
                evicted.append(_row_entry(row))
        return evicted

    def _entries(self, db: Database, rows: list[index.Row]) -> list[Entry]:
        """Full entries for index rows (hits and last use from the index); corrupt ones are evicted."""
        found, bad = [], []
        for row in rows:
            try:
                meta = _text(db, f"m/{row.key}")
                if meta is None:
                    raise CorruptRecordError("missing")
                entry = Entry.from_json(meta)
            except CorruptRecordError as exc:
                bad.append((row, f"metadata record {exc}"))
                continue
            entry.hits, entry.last_used = row.hits, row.last_used
            found.append(entry)
        for row, problem in bad:
            self._corrupt(db, row.key, problem, f" ({row.kernel} on {row.device_label})")
        return found

    def entries(self, where: Filter = Filter(), limit: int | None = None) -> list[Entry]:
        """Metadata of the artifacts that match, most recently used first (at most `limit`)."""
        self.flush()

        def scan(db: Database) -> list[Entry]:
            self._adopt(db)
            return self._entries(db, index.rows(db.con, where, limit))

        return _merged(self._each("scan", scan, []), limit)

    def count(self, where: Filter = Filter()) -> int:
        """How many artifacts match (from the totals when there is no filter)."""

        def scan(db: Database) -> int:
            self._adopt(db)
            return index.count(db.con, where)

        return sum(self._each("scan", scan, 0))

    def find(self, prefix: str) -> list[Entry]:
        """Entries whose key starts with `prefix` (at most two: enough to say it is ambiguous)."""
        prefix = prefix.lower()
        if not prefix or any(c not in "0123456789abcdef" for c in prefix):
            return []
        self.flush()
        return _merged(self._each("scan", lambda db: self._entries(db, index.with_prefix(db.con, prefix)), []), 2)

    def directory_of(self, key: str) -> Path | None:
        """The first directory (in lookup order) that holds the entry `key`."""
        for layer, row in zip(self._layers, self._each("scan", lambda db: index.lookup(db.con, key), None)):
            if row is not None:
                return layer.directory
        return None

    def read_raw(self, key: str) -> bytes | None:
        """An artifact's bytes without checking or counting (for verify and export)."""
        return next((data for data in self._each("read", lambda db: db.get(f"a/{key}"), None) if isinstance(data, bytes)), None)

    def enforce_budget(self, max_size: int | None = None) -> list[Entry]:
        """Evict least recently used artifacts until they fit `max_size` (default: the configured budget)."""
        budget = self.config.max_size if max_size is None else max_size

        def evict(db: Database) -> list[Entry]:
            with db.transact():
                self._write_counts(db)
                return self._evict(db, budget, budget)

        return self._write("evict", evict, [])

    def prune(self, max_size: int | None = None, older_than: float | None = None) -> list[Entry]:
        """Evict entries unused for `older_than` seconds, then LRU down to `max_size` bytes."""
        evicted: list[Entry] = []
        if older_than is not None:
            cutoff = time.time() - older_than

            def old(db: Database) -> list[Entry]:
                with db.transact():
                    self._write_counts(db)
                    rows = index.used_before(db.con, cutoff)
                    return [_row_entry(row) for row in rows if self._remove(db, row.key)]

            evicted += self._write("prune", old, [])
        if max_size is not None:
            evicted += self.enforce_budget(max_size)
        return evicted

    # --- verify and clear ---------------------------------------------------

    def verify(self) -> list[Finding]:
        """Check rows against files and files against rows, decode every record, re-hash every
        artifact, remove stale locks; remove (or re-index) what is inconsistent and return it.
        Only the directory new entries go to: a read-only one cannot be repaired."""
        from portkern.cache import repair
        from portkern.cache.repair import Finding

        self.flush()
        findings: list[Finding] = []
        writer = self._writer(warn=False)
        for layer in self._layers:
            if layer is writer:
                self._guard(layer, "verify", lambda db: self._verify_structure(db, findings), None)
                self._guard(layer, "verify", lambda db: self._verify_contents(db, findings), None)
                if layer.broken is None:
                    findings += [Finding("lock", name, "stale lock (no process holds it)") for name in repair.stale_locks(layer.directory)]
            elif self._open(layer) is not None:
                self._guard(layer, "verify", lambda db: self._verify_contents(db, findings, fix=False), None)
            if layer.broken is not None:
                findings.append(Finding("directory", str(layer.directory), f"not usable ({layer.broken}); not checked", fixed=False))
        return findings

    def _verify_structure(self, db: Database, findings: list[Finding]) -> None:
        """Records, index and files agree (under the write lock, so no write is half done)."""
        from portkern.cache import repair
        from portkern.cache.repair import Finding

        con = db.con
        self._adopt(db)  # what an older release sharing the directory changed is no damage
        with db.transact():
            meta = {name[2:] for name in db.names("m/")}
            artifacts = {name[2:] for name in db.names("a/")}
            indexed = index.keys(con)
            for key in sorted(indexed - (meta & artifacts)):
                self._remove(db, key)
                findings.append(Finding("entry", key, "index row without its metadata or artifact"))
            for key in sorted(artifacts - meta):
                db.delete(f"a/{key}")
                findings.append(Finding("entry", key, "artifact without metadata"))
            for key in sorted((meta & artifacts) - indexed):
                try:
                    entry = Entry.from_json(_text(db, f"m/{key}"))
                    index.add(con, _index_row(entry))
                    findings.append(Finding("entry", key, "entry missing from the index; re-indexed", entry))
                except CorruptRecordError as exc:
                    self._remove(db, key)
                    findings.append(Finding("entry", key, f"metadata record {exc}"))
            for key in sorted(meta - artifacts):
                db.delete(f"m/{key}")
                findings.append(Finding("entry", key, "metadata without artifact"))
            for name in repair.stray_files(db.directory, keep=db.legacy_folders()):
                repair.remove_path(db.directory / name)
                findings.append(Finding("file", name, "not part of the cache"))
            if index.rebuild_totals(con):
                findings.append(Finding("totals", "portkern_totals", "per-device totals did not match the entries; recounted"))

    def _verify_contents(self, db: Database, findings: list[Finding], fix: bool = True) -> None:
        """Every entry re-hashed and every record decoded (entry by entry, without holding the write
        lock; what looks bad is checked again under it before it is removed, so an entry being
        written or replaced meanwhile stays). Without `fix` (a read-only directory), only reported."""
        con = db.con
        from portkern.cache.repair import Finding

        unfixed = "" if fix else f"; not removed: {db.directory} is read-only"
        for row in index.rows(con):
            found = self._load(db, row.key)
            if isinstance(found, str) and fix:
                with db.transact():
                    if index.lookup(con, row.key) is None:
                        continue  # removed or evicted meanwhile
                    found = self._load(db, row.key)
                    if isinstance(found, str):
                        self._remove(db, row.key)
            if isinstance(found, str):
                findings.append(Finding("entry", row.key, found + unfixed, _row_entry(row), fixed=fix))
        for kind in ("t", "p", "v", "w", "s"):
            for name in db.names(f"{kind}/"):
                try:
                    _decode_record(_text(db, name))
                except CorruptRecordError as exc:
                    if fix:
                        db.delete(name)
                    findings.append(Finding("record", name, f"record {exc}{unfixed}", fixed=fix))

    def clear(self, device: str | None = None) -> int:
        """Remove everything, files unknown to the database included, or only the artifacts and
        tuning results of one device. `device` is a label ("cpu:znver5") or a prefix of a fingerprint
        digest. Returns how many artifacts were removed. Only the directory new entries go to (or,
        when none can be opened, the first one this process may write): a read-only one stays as it
        is. `CacheError` when no directory can be written, or when files were left behind."""
        from portkern.cache import repair

        if device is not None:
            return self._clear_device(device)
        self._hits.take()
        layer = self._writer(warn=False)
        if layer is None:
            # A directory this process may write but cannot open (a damaged or full one) is
            # emptied all the same: clearing is how it is made usable again.
            layer = next((layer for layer in self._layers if not self.config.disabled and layer.directory.is_dir()
                          and writable(layer.directory)), None)
        if layer is None:
            problems = [f"{layer.directory} ({layer.problem or layer.state})" for layer in self._layers]
            raise CacheError(f"cannot clear the portkern cache: no directory can be written: {', '.join(problems)}; nothing removed")

        emptied: list[bool] = []

        def empty(db: Database) -> int:
            if db.read_only:
                return index.count(db.con)
            with db.transact():
                removed = index.count(db.con)
                db.clear()
                index.clear(db.con)
            emptied.append(True)
            return removed

        removed = self._guard(layer, "clear", empty, 0)
        self._close_connection(layer)
        # An emptied database stays where it is: a process using it meanwhile goes on in the same,
        # now empty, file (one it had open and that was removed would take its writes unseen);
        # one that could not be emptied (a damaged one) goes with the rest.
        left = repair.remove_everything(layer.directory, keep=layout.DATABASE_FILES if emptied else ())
        if left:
            raise CacheError(f"portkern cache clear could not remove {', '.join(left)} from {layer.directory} "
                             f"({removed} entries removed)")
        return removed

    def _clear_device(self, device: str) -> int:
        def remove(db: Database) -> int:
            with db.transact():
                rows = index.rows(db.con, Filter(device=device))
                return sum(1 for row in rows if self._remove(db, row.key))

        count = self._write("clear", remove, 0)
        for key, record in list(self.records("t")):
            if isinstance(record.get("device"), dict) and matches_device(record["device"], device):
                self.delete_record("t", key)
        return count

    def stats(self) -> dict[str, Any]:
        """Entries, bytes and hits overall and per device, and the hit/miss counters (no scan), summed
        over the directories; `directories` gives each one's state and totals."""
        self.flush()

        def read(db: Database) -> tuple[dict[str, dict[str, int]], dict[str, int], int]:
            self._adopt(db)
            con = db.con
            return index.totals(con), index.counters(con), db.count("t/")

        per_device: dict[str, dict[str, int]] = {}
        counters = dict.fromkeys(index.COUNTERS, 0)
        tuning = 0
        places: list[dict[str, Any]] = []
        unread: tuple[dict[str, dict[str, int]], dict[str, int], int] = ({}, dict.fromkeys(index.COUNTERS, 0), 0)
        for place, (devices, counted, records) in zip(self.places(), self._each("read", read, unread)):
            places.append({**place, "entries": sum(d["entries"] for d in devices.values()),
                           "bytes": sum(d["bytes"] for d in devices.values())})
            for label, totals in devices.items():
                into = per_device.setdefault(label, dict.fromkeys(totals, 0))
                for name, value in totals.items():
                    into[name] = into.get(name, 0) + value
            for name, value in counted.items():
                counters[name] = counters.get(name, 0) + value
            tuning += records
        return {
            "directory": str(self.directory),
            "directories": places,
            "enabled": self.enabled,
            "entries": sum(d["entries"] for d in per_device.values()),
            "bytes": sum(d["bytes"] for d in per_device.values()),
            "max_size": self.config.max_size,
            "tuning_results": tuning,
            **counters,
            "devices": per_device,
        }

    # --- hit counts ---------------------------------------------------------

    def _write_counts(self, db: Database) -> None:
        """Write this process's pending hit and miss counts (inside the caller's transaction)."""
        pending = self._hits.take()
        if pending:
            self._record(db, pending)

    @staticmethod
    def _record(db: Database, pending: Pending) -> None:
        index.record_hits(db.con, pending.hits)
        index.add_counts(db.con, hits=pending.hit_count, misses=pending.miss_count)

    def flush(self) -> None:
        """Write pending hit and miss counts now (one transaction; nothing when there are none).
        Counts that cannot be written (a read-only database, or one whose write lock another
        process holds for longer than `LOCKED_WAIT`) are dropped: they are statistics, never a
        reason to keep a lookup or the process's exit waiting."""
        if not self._hits.pending():
            return
        layer = self._writer(warn=False)
        db = self._open(layer) if layer is not None else None
        pending = self._hits.take()
        if db is None:
            return
        try:
            with db.transact(wait=LOCKED_WAIT):
                self._record(db, pending)
        except Exception:  # noqa: BLE001 - see above
            pass

    def counters(self, every: bool = False) -> dict[str, int]:
        """Lookups that hit and missed, over all processes (this one's pending counts included);
        with `every`, every other counter too (`add_counts`)."""
        self.flush()
        totals = dict.fromkeys(index.COUNTERS, 0)
        unread: dict[str, int] = {}
        for counted in self._each("read", lambda db: index.counters(db.con, every), unread):
            for name, value in counted.items():
                totals[name] = totals.get(name, 0) + value
        return totals

    def add_counts(self, deltas: dict[str, int]) -> None:
        """Add to named counters now, in one transaction (`cache.metrics` names them); dropped where
        nothing is writable or another process holds the write lock for longer than `LOCKED_WAIT`:
        they are statistics."""
        if not any(deltas.values()):
            return

        def write(db: Database) -> None:
            try:
                with db.transact(wait=LOCKED_WAIT):
                    index.add_counts(db.con, **deltas)
            except sqlite3.OperationalError as exc:
                if not locked(exc):  # (busy: these counts are dropped, the directory stays in use)
                    raise

        self._write("write", write, None)

    # --- small JSON records: tuning results, device probes, bundle checks ----

    def get_record(self, kind: str, key: str) -> dict[str, Any] | None:
        """A stored record, or None; a record that does not decode is evicted with a warning."""

        def read(db: Database) -> dict[str, Any] | None:
            name = f"{kind}/{key}"
            try:
                text = _text(db, name)
                return None if text is None else _decode_record(text)
            except CorruptRecordError as exc:
                if db.read_only:
                    log.warning("portkern cache record %s in read-only %s is corrupt (%s); not used", name[:18], db.directory, exc)
                    return None
                log.warning("portkern cache record %s is corrupt (%s); evicted", name[:18], exc)
                db.delete(name)
                return None

        return next((record for record in self._each("read", read, None) if record is not None), None)

    def put_record(self, kind: str, key: str, record: dict[str, Any], *, memo: bool = False) -> bool:
        """Store a record; False where nothing is writable. A `memo` (what only saves a later process
        work: a check passed, a probe's answer) is dropped, the directory kept in use, where another
        process holds the write lock for longer than `LOCKED_WAIT`."""
        text = json.dumps(record, sort_keys=True)

        def write(db: Database) -> bool:
            try:
                with db.transact(wait=LOCKED_WAIT if memo else None):
                    self._write_counts(db)
                    db.set(f"{kind}/{key}", text)
            except sqlite3.OperationalError as exc:
                if memo and locked(exc):
                    return False
                raise
            return True

        return bool(self._write("write", write, False))

    def records(self, kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
        prefix = f"{kind}/"
        unread: list[str] = []
        names = dict.fromkeys(name for found in self._each("scan", lambda db: db.names(prefix), unread) for name in found)
        for name in names:
            record = self.get_record(kind, name[len(prefix) :])
            if record is not None:
                yield name[len(prefix) :], record

    def delete_record(self, kind: str, key: str) -> bool:
        return bool(self._write("delete", lambda db: db.delete(f"{kind}/{key}"), False))

    def get_tuning(self, problem: str, device: DeviceFingerprint, compiler: str) -> dict[str, Any] | None:
        """The stored tuning result for a problem on a device, if any (here, else from the remote tier)."""
        key = tuning_key(problem, device, compiler)
        record = self.get_record("t", key)
        if record is None and self.remote is not None:
            shared = self.remote.get_tuning(key)
            if shared is not None and (shared.get("problem"), shared.get("device"), shared.get("compiler")) == (
                problem, device.to_dict(), compiler
            ) and not shared.get(UNUSABLE):
                self.put_record("t", key, shared)
                record = shared
        return record

    def put_tuning(self, problem: str, device: DeviceFingerprint, compiler: str, result: dict[str, Any]) -> bool:
        """Store a tuning result together with the parts of its key (so imports can check it),
        and share it through the remote tier."""
        record = {**result, "problem": problem, "device": device.to_dict(), "compiler": compiler}
        stored = self.put_record("t", tuning_key(problem, device, compiler), record)
        if self.remote is not None and not record.get(UNUSABLE):
            self.remote.put_tuning(tuning_key(problem, device, compiler), record)
        return stored

    # --- locks --------------------------------------------------------------

    def lock(self, key: str, timeout: float = 900.0) -> ContextManager[None]:
        """A cross-process lock for building `key`, so concurrent processes build it once (in the
        directory new entries go to; none when no directory is writable). Held by another process
        for more than `timeout` seconds, it is not taken: the caller goes on unlocked (duplicate work,
        never a failure)."""
        layer = self._writer()
        if layer is None:
            return nullcontext()
        try:
            from filelock import FileLock

            locks = layer.directory / layout.LOCKS
            locks.mkdir(exist_ok=True)
            return _tolerant(FileLock(str(locks / f"{key[:32]}.lock"), timeout=timeout))
        except Exception as exc:  # noqa: BLE001 - no lock costs duplicate work, and reads go on
            self._refuse(layer, f"lock: {type(exc).__name__}: {exc}")
            return nullcontext()

    # --- migration ----------------------------------------------------------

    def _unindexed(self, db: Database) -> Iterator[index.Row]:
        """Index rows for the entries of a cache written before the index existed."""
        for name in db.names("m/"):
            found = self._load(db, name[2:])
            if isinstance(found, tuple):
                yield _index_row(found[1])


def _merged(found: Iterable[list[Entry]], limit: int | None) -> list[Entry]:
    """Entries from several directories, each key once (the first directory's), most recently used first."""
    lists = [entries for entries in found if entries]
    if len(lists) <= 1:
        return lists[0] if lists else []
    unique = list({entry.key: entry for entries in reversed(lists) for entry in entries}.values())
    unique.sort(key=lambda entry: entry.last_used, reverse=True)
    return unique[:limit] if limit is not None else unique


def matches_device(device: dict[str, Any], wanted: str) -> bool:
    """Whether a fingerprint (as plain data) is the device a user named by label or digest prefix."""
    fingerprint = DeviceFingerprint.from_dict(device)
    return wanted == fingerprint.label or (len(wanted) >= 8 and fingerprint.digest().startswith(wanted))


@contextmanager
def _tolerant(lock: Any) -> Iterator[None]:
    """Hold `lock` if it can be taken; run unlocked (duplicate work, never failure) if not.
    The lock file is removed before release, so lock files do not pile up."""
    try:
        lock.acquire()
    except Exception:  # noqa: BLE001 - a lock we cannot take only costs duplicate work
        yield
        return
    try:
        yield
    finally:
        if lock.lock_counter == 1:
            from portkern.cache import repair

            repair.release_lock_file(lock.lock_file)
        lock.release()


def __getattr__(name: str) -> Any:
    """`Finding` (what `verify` reports), loaded with `cache.repair` when first asked for."""
    if name == "Finding":
        from portkern.cache.repair import Finding

        return Finding
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_live: "weakref.WeakSet[Store]" = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for store in list(_live):
        store.flush()


_default: Store | None = None


def remote_from_env() -> RemoteCache | None:
    """The remote tier the settings name (`cache.remote.from_env`), or None; its module (a Redis
    client, signatures) is loaded only when one is named."""
    if not settings.remote_url():
        return None
    from portkern.cache.remote import from_env

    return from_env()


def default_store() -> Store:
    """The process-wide store configured from the environment."""
    global _default
    remote = remote_from_env()
    if _default is None or _default.config != from_env() or _default.remote is not remote:
        _default = Store(remote=remote)
    return _default
