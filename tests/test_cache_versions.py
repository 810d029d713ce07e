"""Two portkern releases sharing one cache directory: the current layout beside an older writer.

The older writers are the real `diskcache` package driven the way portkern's releases before
the current layout drove it (`git show 12c3cc1^:cache/store.py`, and before the entry index,
`git show 7b825c8^:cache/store.py`): `diskcache.Cache(directory, eviction_policy="none",
size_limit=1 << 62, statistics=0)`, an artifact as `a/<key>` and its metadata as `m/<key>` in one
`transact()`, values of 32 KiB and more in diskcache's value files; the indexed release also
wrote the entry index row (the same SQL as `portkern.cache.index.add`) in that database, and
removed the index rows of entries it could not read (its `ls` and `verify`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from helpers import run_past_a_pipe
from test_cache_scale import assert_counters_match, synthetic

from portkern.cache import index
from portkern.cache.config import CacheConfig
from portkern.cache.entry import Entry
from portkern.cache.store import Store

diskcache = pytest.importorskip("diskcache", reason="the older releases' store package (pip install diskcache)")

CLI = [sys.executable, "-m", "portkern"]


def older_release(directory: Path):
    """The cache as an older release opened it (it creates diskcache's tables if absent)."""
    return diskcache.Cache(str(directory), eviction_policy="none", size_limit=1 << 62, statistics=0)


def older_put(cache, key: str, data: bytes, entry: Entry, indexed: bool) -> None:
    """An entry written as the older release wrote it (with its index row, for the indexed one)."""
    import hashlib
    import time

    entry.key, entry.size, entry.sha256 = key, len(data), hashlib.sha256(data).hexdigest()
    entry.created = entry.last_used = time.time()
    with cache.transact():
        cache.set(f"a/{key}", data)
        cache.set(f"m/{key}", entry.to_json())
    if indexed:
        with closing(sqlite3.connect(Path(cache.directory) / "cache.db", timeout=60)) as con, con:
            index.add(con, index.Row(key, entry.size, entry.created, entry.last_used, 0, entry.kernel, entry.bundle,
                                     entry.device_label, ""))


def older_unindexes(directory: Path, keys) -> None:
    """What the indexed older release's `ls` and `verify` did to entries of the current layout,
    which it cannot read: it removed their index rows."""
    with closing(sqlite3.connect(directory / "cache.db", timeout=60)) as con, con:
        for key in keys:
            index.remove(con, key)


def cli(directory: Path, *argv: str) -> subprocess.CompletedProcess:
    """`portkern cache ARGV` on DIRECTORY's parent, with a temporary directory of its own (`verify` also
    sweeps the scratch directories dead processes left in the temporary directory)."""
    scratch = directory.parent.parent / f"{directory.parent.name}-tmp"
    scratch.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(scratch)}
    return subprocess.run([*CLI, "cache", *argv, "--cache-dir", str(directory.parent)], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("indexed", [True, False], ids=["indexed-release", "pre-index-release"])
def test_an_older_writers_entries_are_served_and_counted_and_verify_passes(tmp_path, indexed):
    directory = tmp_path / "v1"
    store = Store(CacheConfig(directory, 1 << 30, False))
    mine = [synthetic(i, 40_000 if i % 2 else 300) for i in range(3)]
    assert store.put_many(mine) == 3
    assert store.stats()["entries"] == 3

    # The older release opens the same directory while this one has it open, and writes two
    # entries (one in a value file of its own); the indexed one also drops the index rows of
    # this layout's entries when it lists the cache.
    older = older_release(directory)
    theirs = [synthetic(10 + i, 50_000 if i else 500, kernel="old") for i in range(2)]
    for key, data, entry in theirs:
        older_put(older, key, data, entry, indexed)
    if indexed:
        older_unindexes(directory, [key for key, _, _ in mine])
    else:  # the pre-index release counted its lookups as integer records
        older.incr("s/misses", default=0)
        older.incr("s/hits", default=0)

    # Served, by this process and a fresh one; counted by stats, ls and count.
    for reader in (store, Store(CacheConfig(directory, 1 << 30, False))):
        assert [reader.get(key)[0] for key, _, _ in mine + theirs] == [data for _, data, _ in mine + theirs]
        stats = reader.stats()
        assert stats["entries"] == 5 and stats["bytes"] == sum(len(d) for _, d, _ in mine + theirs)
        assert {e.key for e in reader.entries()} == {key for key, _, _ in mine + theirs}
        assert_counters_match(reader)

    listed = cli(directory, "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 5
    counted = cli(directory, "stats", "--json")
    assert counted.returncode == 0 and json.loads(counted.stdout)["entries"] == 5, counted.stderr
    verified = cli(directory, "verify", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["found"] == []
    assert store.verify() == []

    # The older release still serves its own entries: nothing of its layout was moved or removed.
    assert [older.get(f"a/{key}") for key, _, _ in theirs] == [data for _, data, _ in theirs]
    older.close()


def test_what_either_release_removes_is_gone_for_both(tmp_path):
    directory = tmp_path / "v1"
    store = Store(CacheConfig(directory, 1 << 30, False))
    older = older_release(directory)
    theirs = [synthetic(20 + i, 60_000, kernel="old") for i in range(3)]
    for key, data, entry in theirs:
        older_put(older, key, data, entry, indexed=False)
    assert store.stats()["entries"] == 3

    # This release deletes one of the older release's entries: gone for the older one too
    # (its value file with it), and the counts follow.
    gone, _, _ = theirs[0]
    assert store.delete(gone)
    assert older.get(f"a/{gone}") is None and older.get(f"m/{gone}") is None
    # The older release deletes another (as its eviction did): no longer served or counted here.
    with older.transact():
        older.delete(f"m/{theirs[1][0]}")
        older.delete(f"a/{theirs[1][0]}")
    assert store.get(theirs[1][0]) is None
    assert store.stats()["entries"] == 1 and store.count() == 1
    assert [e.key for e in store.entries()] == [theirs[2][0]]
    assert store.verify() == []
    assert older.get(f"a/{theirs[2][0]}") == theirs[2][1]

    # clear empties both layouts.
    assert store.clear() == 1
    assert store.get(theirs[2][0]) is None and older.get(f"a/{theirs[2][0]}") is None
    assert store.stats()["entries"] == 0
    older.close()


def test_an_index_a_later_release_of_this_layout_marked_is_used_as_it_is(tmp_path):
    """A later release of the same layout directory (schema 2) adds to the index, never breaks
    it: this release neither re-indexes its database nor marks it back."""
    directory = tmp_path / "v1"
    store = Store(CacheConfig(directory, 1 << 30, False))
    items = [synthetic(i) for i in range(3)]
    store.put_many(items)
    store.close()
    with closing(sqlite3.connect(directory / "cache.db")) as con, con:
        con.execute("UPDATE portkern_meta SET value = '2' WHERE name = 'schema'")
    reopened = Store(CacheConfig(directory, 1 << 30, False))
    assert [reopened.get(key)[0] for key, _, _ in items] == [data for _, data, _ in items]
    assert reopened.stats()["entries"] == 3 and reopened.verify() == []
    reopened.close()
    with closing(sqlite3.connect(directory / "cache.db")) as con:
        assert con.execute("SELECT value FROM portkern_meta WHERE name = 'schema'").fetchone() == ("2",)


def test_a_named_pipe_in_place_of_an_older_writers_value_file_is_a_miss(tmp_path):
    """Whoever can write in the cache directory swaps one of diskcache's value files for a named
    pipe: the lookup is a miss in a fresh process (the entry reads as damaged), not a wait."""
    directory = tmp_path / "v1"
    Store(CacheConfig(directory, 1 << 30, False)).close()
    older = older_release(directory)
    key, data, entry = synthetic(1, 50_000, kernel="old")  # (large enough for a value file)
    older_put(older, key, data, entry, indexed=False)
    older.close()
    (value_file,) = [p for p in directory.rglob("*.val")]
    script = ("import sys; from pathlib import Path; from portkern.cache.config import CacheConfig; "
              "from portkern.cache.store import Store; "
              "print(Store(CacheConfig(Path(sys.argv[1]), 1 << 30, False)).get(sys.argv[2]) is None)")
    done = run_past_a_pipe(value_file, [sys.executable, "-c", script, str(directory), key], "a lookup")
    assert done.stdout.strip() == "True", done.stderr[-3000:]
