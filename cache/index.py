"""The entry index: SQL tables beside the records (`cache.database`) in `cache.db`.

- `portkern_entries`: one row per cached artifact (key, size, created, last use,
  hits, kernel, bundle, device label and fingerprint digest), indexed on last
  use, so least-recently-used order never reads the metadata records;
- `portkern_totals`: entries, bytes and hits per device, kept by triggers on
  `portkern_entries`, so they change in the same transaction as every insert,
  delete and hit update and are never summed by a scan;
- `portkern_counters`: lookups that hit and missed, for `cache stats`.

Every function takes the connection that holds the transaction (`Database.transact`),
so index rows move together with the records they describe.
"""

from __future__ import annotations

import sqlite3
from dataclasses import fields
from typing import Iterable

from portkern.base.records import frozen_record

SCHEMA = "1"

_DDL = (
    "CREATE TABLE IF NOT EXISTS portkern_entries ("
    " key TEXT PRIMARY KEY, size INTEGER NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL,"
    " hits INTEGER NOT NULL, kernel TEXT NOT NULL, bundle TEXT NOT NULL,"
    " device_label TEXT NOT NULL, device_digest TEXT NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS portkern_entries_last_used ON portkern_entries (last_used)",
    "CREATE TABLE IF NOT EXISTS portkern_totals ("
    " device_label TEXT PRIMARY KEY, entries INTEGER NOT NULL, bytes INTEGER NOT NULL, hits INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS portkern_counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS portkern_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TRIGGER IF NOT EXISTS portkern_entries_insert AFTER INSERT ON portkern_entries BEGIN"
    " INSERT OR IGNORE INTO portkern_totals VALUES (NEW.device_label, 0, 0, 0);"
    " UPDATE portkern_totals SET entries = entries + 1, bytes = bytes + NEW.size, hits = hits + NEW.hits"
    " WHERE device_label = NEW.device_label; END",
    "CREATE TRIGGER IF NOT EXISTS portkern_entries_delete AFTER DELETE ON portkern_entries BEGIN"
    " UPDATE portkern_totals SET entries = entries - 1, bytes = bytes - OLD.size, hits = hits - OLD.hits"
    " WHERE device_label = OLD.device_label;"
    " DELETE FROM portkern_totals WHERE device_label = OLD.device_label AND entries <= 0; END",
    "CREATE TRIGGER IF NOT EXISTS portkern_entries_hits AFTER UPDATE OF hits ON portkern_entries BEGIN"
    " UPDATE portkern_totals SET hits = hits + NEW.hits - OLD.hits WHERE device_label = NEW.device_label; END",
)


@frozen_record
class Row:
    """The index row of one artifact."""

    key: str
    size: int
    created: float
    last_used: float
    hits: int
    kernel: str
    bundle: str
    device_label: str
    device_digest: str


_NAMES = tuple(f.name for f in fields(Row))
_COLUMNS = ", ".join(_NAMES)


@frozen_record
class Filter:
    """Which entries a listing wants: by kernel name, bundle name, device label or fingerprint prefix."""

    kernel: str | None = None
    bundle: str | None = None
    device: str | None = None

    def where(self) -> tuple[str, list[str | int]]:
        clauses: list[str] = []
        params: list[str | int] = []
        if self.kernel is not None:
            clauses.append("kernel = ?")
            params.append(self.kernel)
        if self.bundle is not None:
            clauses.append("bundle = ?")
            params.append(self.bundle)
        if self.device is not None:
            if len(self.device) >= 8:
                clauses.append("(device_label = ? OR substr(device_digest, 1, ?) = ?)")
                params += [self.device, len(self.device), self.device.lower()]
            else:
                clauses.append("device_label = ?")
                params.append(self.device)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def installed(con: sqlite3.Connection) -> bool:
    """Whether this database has the index tables at this schema or a later one (a read, no lock).

    A later release of this layout (`cache.config.LAYOUT`) may add tables or columns beside
    these but keeps what they hold and mean; one that cannot moves to a new layout directory.
    So an index a later release wrote is used as it is, never installed again or marked back."""
    try:
        row = con.execute("SELECT value FROM portkern_meta WHERE name = 'schema'").fetchone()
    except sqlite3.OperationalError as exc:  # "no such table" is the only expected one
        if "no such table" in str(exc):
            return False
        raise
    return row is not None and str(row[0]).isdigit() and int(row[0]) >= int(SCHEMA)


def install(con: sqlite3.Connection, rows: Iterable[Row]) -> None:
    """Create the tables (inside the caller's transaction) and index `rows` (existing entries)."""
    for statement in _DDL:
        con.execute(statement)
    for row in rows:
        add(con, row)
    con.execute("INSERT OR REPLACE INTO portkern_meta VALUES ('schema', ?)", (SCHEMA,))


def add(con: sqlite3.Connection, row: Row) -> None:
    """Index an artifact, replacing any row of the same key (the totals follow)."""
    con.execute("DELETE FROM portkern_entries WHERE key = ?", (row.key,))
    con.execute(f"INSERT INTO portkern_entries ({_COLUMNS}) VALUES ({', '.join('?' * len(_NAMES))})",
                tuple(getattr(row, name) for name in _NAMES))


def remove(con: sqlite3.Connection, key: str) -> bool:
    return con.execute("DELETE FROM portkern_entries WHERE key = ?", (key,)).rowcount > 0


def lookup(con: sqlite3.Connection, key: str) -> Row | None:
    found = con.execute(f"SELECT {_COLUMNS} FROM portkern_entries WHERE key = ?", (key,)).fetchone()
    return Row(*found) if found else None


def rows(con: sqlite3.Connection, where: Filter = Filter(), limit: int | None = None) -> list[Row]:
    """Index rows, most recently used first."""
    clause, params = where.where()
    query = f"SELECT {_COLUMNS} FROM portkern_entries{clause} ORDER BY last_used DESC, key"
    if limit is not None:
        query += " LIMIT ?"
        params.append(limit)
    return [Row(*r) for r in con.execute(query, params).fetchall()]


def with_prefix(con: sqlite3.Connection, prefix: str, limit: int = 2) -> list[Row]:
    """Rows whose key starts with a lowercase hex `prefix` (a range on the primary key)."""
    return [Row(*r) for r in con.execute(
        f"SELECT {_COLUMNS} FROM portkern_entries WHERE key >= ? AND key < ? ORDER BY key LIMIT ?",
        (prefix, prefix + "g", limit)).fetchall()]


def least_recent(con: sqlite3.Connection, limit: int) -> list[Row]:
    return [Row(*r) for r in con.execute(
        f"SELECT {_COLUMNS} FROM portkern_entries ORDER BY last_used, key LIMIT ?", (limit,)).fetchall()]


def used_before(con: sqlite3.Connection, cutoff: float) -> list[Row]:
    return [Row(*r) for r in con.execute(
        f"SELECT {_COLUMNS} FROM portkern_entries WHERE last_used < ? ORDER BY last_used", (cutoff,)).fetchall()]


def count(con: sqlite3.Connection, where: Filter = Filter()) -> int:
    if where == Filter():
        return sum(t["entries"] for t in totals(con).values())
    clause, params = where.where()
    return int(con.execute(f"SELECT count(*) FROM portkern_entries{clause}", params).fetchone()[0])


def totals(con: sqlite3.Connection) -> dict[str, dict[str, int]]:
    """Entries, bytes and hits per device label, from the counters."""
    return {d: {"entries": n, "bytes": b, "hits": h}
            for d, n, b, h in con.execute("SELECT device_label, entries, bytes, hits FROM portkern_totals").fetchall()}


def total_bytes(con: sqlite3.Connection) -> int:
    return int(con.execute("SELECT coalesce(sum(bytes), 0) FROM portkern_totals").fetchone()[0])


#: The counters of `cache stats`: local lookups that hit and missed, and lookups of native code in
#: the remote tier (`remote_errors`: those that got no answer from Redis). Others (`cache.metrics`)
#: share the table.
COUNTERS = ("hits", "misses", "remote_hits", "remote_misses", "remote_errors")


def counters(con: sqlite3.Connection, every: bool = False) -> dict[str, int]:
    """The `COUNTERS` (0 when never counted); with `every`, every other counter stored too."""
    found = {name: int(value) for name, value in con.execute("SELECT name, value FROM portkern_counters").fetchall()}
    named = {name: found.get(name, 0) for name in COUNTERS}
    return {**named, **found} if every else named


def add_counts(con: sqlite3.Connection, **deltas: int) -> None:
    for name, delta in deltas.items():
        if delta:
            con.execute("INSERT INTO portkern_counters VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
                (name, delta))


def record_hits(con: sqlite3.Connection, hits: dict[str, tuple[int, float]]) -> None:
    """Add hit counts and move last-use times forward (never back) for entries still present."""
    con.executemany(
        "UPDATE portkern_entries SET hits = hits + ?, last_used = max(last_used, ?) WHERE key = ?",
        [(n, when, key) for key, (n, when) in hits.items()],
    )


def rebuild_totals(con: sqlite3.Connection) -> bool:
    """Recount the per-device totals from the rows (a scan, for verify); whether they had drifted."""
    before = totals(con)
    con.execute("DELETE FROM portkern_totals")
    con.execute("INSERT INTO portkern_totals SELECT device_label, count(*), sum(size), sum(hits)"
        " FROM portkern_entries GROUP BY device_label")
    return totals(con) != before


def clear(con: sqlite3.Connection) -> None:
    """Remove every row and count (inside the caller's transaction)."""
    for table in ("portkern_entries", "portkern_totals", "portkern_counters"):
        con.execute(f"DELETE FROM {table}")


def keys(con: sqlite3.Connection) -> set[str]:
    return {k for (k,) in con.execute("SELECT key FROM portkern_entries").fetchall()}
