"""Damage costs one entry, never the cache: damaged records and databases, verify, clear, bad settings."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import tempfile
import warnings
from pathlib import Path

import pytest
from helpers import assert_matches, logged_messages
from test_cache_scale import assert_counters_match, synthetic

import portkern
from portkern.base.settings import SettingWarning
from portkern.cache import scratch
from portkern.cache.config import DEFAULT_MAX_SIZE, CacheConfig, CacheWarning, from_env
from portkern.cache.layout import DATABASE_FILES
from portkern.cache.store import Store
from portkern.cli.main import main
from portkern.examples.reference import EXAMPLES


def caught_warnings(action):
    """What `action` returns, and the cache and setting warnings it gave, warned or logged."""
    with warnings.catch_warnings(record=True) as caught, logged_messages() as logged:
        warnings.simplefilter("always")
        result = action()
    return result, [str(w.message) for w in caught if issubclass(w.category, (CacheWarning, SettingWarning))] + logged


def damage_record(directory: Path, name: str, how: str) -> None:
    db = sqlite3.connect(directory / "cache.db")
    if how == "truncate":
        db.execute("UPDATE portkern_records SET value = substr(value, 1, length(value) / 2) WHERE name = ?", (name,))
    elif how == "not-utf8":
        db.execute("UPDATE portkern_records SET value = CAST(X'7B22FF' AS TEXT) WHERE name = ?", (name,))
    else:  # valid JSON, wrong shape
        db.execute("UPDATE portkern_records SET value = '{\"key\": 3}' WHERE name = ?", (name,))
    db.commit()
    db.close()


@pytest.mark.parametrize("how", ["truncate", "not-utf8", "wrong-shape"])
def test_one_damaged_record_among_seven_costs_only_that_entry(tmp_path, capsys, how, monkeypatch):
    # `cache verify` also reports scratch directories of gone processes in the temp directory: a
    # private one keeps other processes' leftovers on this machine out of this test.
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    directory = tmp_path / "v1"
    store = Store(CacheConfig(directory, 1 << 30, False))
    store.put_many(synthetic(i, 50_000 if i % 2 else 300) for i in range(7))
    store.close()
    victim = f"{3:064x}"
    damage_record(directory, f"m/{victim}", how)

    fresh = Store(CacheConfig(directory, 1 << 30, False))
    hits, messages = caught_warnings(lambda: [fresh.get(f"{i:064x}") for i in range(7)])
    assert [hit is not None for hit in hits] == [True, True, True, False, True, True, True]
    assert [h[0] for h in hits if h] == [synthetic(i, 50_000 if i % 2 else 300)[1] for i in range(7) if i != 3]
    assert len(messages) == 1 and "is corrupt; evicted, it will be rebuilt" in messages[0]
    assert fresh.put(*synthetic(3))  # rebuilt
    assert fresh.get(victim) is not None
    assert_counters_match(fresh)

    # the same damage found by `cache verify`: exit 1, the entry removed, the other six untouched
    damage_record(directory, f"m/{victim}", how)
    assert main(["cache", "verify", "--cache-dir", str(tmp_path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(f["kind"], f["name"]) for f in report["found"]] == [("entry", victim)]
    assert main(["cache", "verify", "--cache-dir", str(tmp_path), "--json"]) == 0
    capsys.readouterr()
    after = Store(CacheConfig(directory, 1 << 30, False))
    assert sorted(int(e.key, 16) for e in after.entries()) == [0, 1, 2, 4, 5, 6]
    assert all(after.get(f"{i:064x}") is not None for i in (0, 1, 2, 4, 5, 6))


def test_a_tuning_record_that_does_not_decode_is_evicted(tmp_path):
    store = Store(CacheConfig(tmp_path / "v1", 1 << 30, False))
    store.put_record("t", "a" * 64, {"config": "x"})
    store.put_record("t", "b" * 64, {"config": "y"})
    damage_record(store.directory, "t/" + "a" * 64, "truncate")
    record, messages = caught_warnings(lambda: store.get_record("t", "a" * 64))
    assert record is None and len(messages) == 1 and "corrupt" in messages[0]
    assert store.get_record("t", "b" * 64) == {"config": "y"}
    damage_record(store.directory, "t/" + "b" * 64, "not-utf8")
    assert [(f.kind, f.name) for f in store.verify()] == [("record", "t/" + "b" * 64)]


def damage_database(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[3] ^= 0x01  # inside "SQLite format 3"
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_damaged_database_is_moved_aside_and_the_next_run_works(examples_bundle, tmp_path, rng, how):
    directory = tmp_path / "v1"
    store = Store(CacheConfig(directory, 1 << 30, False))
    store.put_many(synthetic(i, 300) for i in range(300))
    store.close()
    damage_database(directory / "cache.db", how)

    fresh = Store(CacheConfig(directory, 1 << 30, False))
    kernel, messages = caught_warnings(lambda: portkern.load(examples_bundle, store=fresh).kernel("gemm_rowsum"))
    assert len(messages) == 1 and "moved aside to cache.db.damaged-" in messages[0], messages
    assert kernel.origin == "finalized"
    assert len([p for p in directory.glob("cache.db.damaged-*") if not p.name.endswith(("-wal", "-shm"))]) == 1
    fresh.close()

    again = Store(CacheConfig(directory, 1 << 30, False))
    kernel, messages = caught_warnings(lambda: portkern.load(examples_bundle, store=again).kernel("gemm_rowsum"))
    assert kernel.origin == "cache" and messages == []
    example = EXAMPLES["gemm_rowsum"]
    inputs = example.inputs(rng)
    assert_matches(kernel(*inputs), example.reference(*inputs), example.rtol, example.atol)


def test_verify_removes_stray_files_and_stale_locks_and_clear_removes_everything(tmp_path):
    directory = tmp_path / "v1"
    store = Store(CacheConfig(directory, 1 << 30, False))
    store.put_many(synthetic(i, 40_000) for i in range(3))
    stray = directory / "ab" / "cd" / "0123456789abcdef0123456789.val"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"a value file of the diskcache layout")
    (directory / "locks").mkdir(exist_ok=True)
    (directory / "locks" / "deadbeef.lock").write_text("")
    (directory / "notes.txt").write_text("unknown to the database")
    found = {(f.kind, f.name) for f in store.verify()}
    assert found == {("file", "ab"), ("lock", "locks/deadbeef.lock"), ("file", "notes.txt")}
    assert store.verify() == [] and len(store.entries()) == 3
    (directory / "more-unknown").mkdir()
    assert store.clear() == 3
    # everything but the database, which stays, emptied, for the processes that have it open
    assert {p.name for p in directory.iterdir()} <= set(DATABASE_FILES) and store.entries() == []
    assert Store(CacheConfig(directory, 1 << 30, False)).entries() == []
    assert store.entries() == [] and store.stats()["bytes"] == 0


def written_with_diskcache(directory: Path) -> None:
    """Rewrite a closed cache in the layout portkern wrote with diskcache: its `Cache` table, with
    values of 32 KiB and more in `ab/cd/<hex>.val` files (text as UTF-8), and its `Settings`."""
    db = sqlite3.connect(directory / "cache.db")
    db.execute("CREATE TABLE Settings (key TEXT NOT NULL UNIQUE, value)")
    db.execute("CREATE TABLE Cache (rowid INTEGER PRIMARY KEY, key BLOB, raw INTEGER, store_time REAL, expire_time REAL,"
               " access_time REAL, access_count INTEGER DEFAULT 0, tag BLOB, size INTEGER DEFAULT 0,"
               " mode INTEGER DEFAULT 0, filename TEXT, value BLOB)")
    for i, (name, value) in enumerate(db.execute("SELECT name, value FROM portkern_records").fetchall()):
        if len(value) < 1 << 15:
            db.execute("INSERT INTO Cache (key, raw, mode, value) VALUES (?, 1, 1, ?)", (name, value))
            continue
        filename = f"{i % 256:02x}/{i // 256:02x}/{i:032x}.val"
        (directory / filename).parent.mkdir(parents=True, exist_ok=True)
        (directory / filename).write_bytes(value if isinstance(value, bytes) else value.encode())
        db.execute("INSERT INTO Cache (key, raw, size, mode, filename) VALUES (?, 1, ?, ?, ?)",
                   (name, len(value), 2 if isinstance(value, bytes) else 3, filename))
    db.execute("DROP TABLE portkern_records")
    db.commit()
    db.close()


@pytest.mark.parametrize("indexed", [True, False])
def test_a_cache_written_with_diskcache_is_read_where_it_is(tmp_path, indexed):
    directory = tmp_path / "v1"
    store = Store(CacheConfig(directory, 1 << 30, False))
    items = [synthetic(i, 40_000 if i % 2 else 300) for i in range(4)]
    store.put_many(items)
    store.put_record("t", "a" * 64, {"config": "x" * 40_000})
    store.put_record("t", "b" * 64, {"config": "y"})
    assert store.get(items[0][0]) is not None
    store.close()
    written_with_diskcache(directory)
    if not indexed:  # written before the entry index existed
        db = sqlite3.connect(directory / "cache.db")
        for table in ("portkern_entries", "portkern_totals", "portkern_counters", "portkern_meta"):
            db.execute(f"DROP TABLE {table}")
        db.commit()
        db.close()

    reopened = Store(CacheConfig(directory, 1 << 30, False))
    assert [reopened.get(key)[0] for key, _, _ in items] == [data for _, data, _ in items]
    assert reopened.get_record("t", "a" * 64) == {"config": "x" * 40_000}
    assert reopened.get_record("t", "b" * 64) == {"config": "y"}
    assert_counters_match(reopened)
    # An older release may still write there (tests/test_cache_versions.py): its table and value
    # files stay, and verify finds nothing wrong with them.
    assert reopened.verify() == []
    assert [reopened.get(key)[0] for key, _, _ in items] == [data for _, data, _ in items]


def test_lock_files_do_not_pile_up(tmp_path):
    store = Store(CacheConfig(tmp_path / "v1", 1 << 30, False))
    for i in range(5):
        with store.lock(f"{i:064x}"):
            assert len(list((store.directory / "locks").iterdir())) == 1
    assert list((store.directory / "locks").iterdir()) == []


def test_scratch_directories_of_dead_processes_are_swept(tmp_path):
    dead = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout.strip()
    orphan = tmp_path / f"portkern-pocl-{dead}-abc123"
    mine = Path(scratch.make("pocl"))
    try:
        orphan.mkdir()
        (orphan / "kernel.so").write_bytes(b"x")
        alive = tmp_path / mine.name
        alive.mkdir()
        assert scratch.orphaned(tmp_path) == [orphan]
        assert scratch.sweep(tmp_path) == [orphan] and not orphan.exists() and alive.exists()
    finally:
        mine.rmdir()


def test_an_old_cache_without_the_index_is_indexed_on_open(tmp_path):
    directory = tmp_path / "v1"
    store = Store(CacheConfig(directory, 1 << 30, False))
    store.put_many(synthetic(i, 1000) for i in range(4))
    store.close()
    db = sqlite3.connect(directory / "cache.db")
    for table in ("portkern_entries", "portkern_totals", "portkern_counters", "portkern_meta"):
        db.execute(f"DROP TABLE {table}")
    db.commit()
    db.close()
    reopened = Store(CacheConfig(directory, 1 << 30, False))
    assert len(reopened.entries()) == 4 and reopened.stats()["bytes"] == 4000
    assert_counters_match(reopened)


@pytest.mark.parametrize("value", ["-1", "abc", "1e9"])
def test_a_bad_size_setting_warns_once_and_runs(examples_bundle, monkeypatch, rng, value):
    monkeypatch.setenv("PORTKERN_CACHE_MAXSIZE", value)
    config, messages = caught_warnings(from_env)
    assert config.max_size == DEFAULT_MAX_SIZE and len(messages) == 1 and "PORTKERN_CACHE_MAXSIZE" in messages[0]
    kernel, messages = caught_warnings(lambda: portkern.load(examples_bundle).kernel("gemm_rowsum"))
    assert messages == []  # said once per process
    example = EXAMPLES["gemm_rowsum"]
    inputs = example.inputs(rng)
    assert_matches(kernel(*inputs), example.reference(*inputs), example.rtol, example.atol)


@pytest.mark.parametrize(
    "value, disabled, warns",
    [("1", True, False), ("TRUE", True, False), (" yes ", True, False), ("on", True, False),
     ("0", False, False), ("false", False, False), ("No", False, False), ("off", False, False),
     ("", False, False), ("2", False, True), ("disable", False, True)],
)
def test_boolean_settings_take_the_usual_spellings(monkeypatch, value, disabled, warns):
    monkeypatch.setenv("PORTKERN_CACHE_DISABLE", value)
    config, messages = caught_warnings(from_env)
    assert config.disabled is disabled
    assert len(messages) == (1 if warns else 0)


def test_an_empty_cache_dir_setting_warns_and_uses_the_default(monkeypatch):
    from portkern.cache.config import default_directory

    monkeypatch.setenv("PORTKERN_CACHE_DIR", "")
    config, messages = caught_warnings(from_env)
    assert config.directory.parent == default_directory()
    assert len(messages) == 1 and "PORTKERN_CACHE_DIR" in messages[0] and "empty" in messages[0]
