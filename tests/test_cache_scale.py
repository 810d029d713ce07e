"""The cache at scale: size counters, eviction by index, cheap hits, listing limits, closed pipes."""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

from portkern.cache import store as store_module
from portkern.cache.config import CacheConfig
from portkern.cache.store import LOW_WATER, Entry, Filter, Store
from portkern.cli.main import main


def synthetic(i: int, size: int = 100, kernel: str = "k", bundle: str = "b", arch: str = "x") -> tuple[str, bytes, Entry]:
    """A valid-looking entry with distinct bytes (what the bench and these tests store)."""
    key = f"{i:064x}"
    data = (i.to_bytes(8, "little") * (size // 8 + 1))[:size]
    return key, data, Entry(key=key, kernel=kernel, bundle=bundle, bundle_digest="", device={"kind": "cpu", "arch": arch},
                            device_label=f"cpu:{arch}", config="default", format="vmfb", size=0, sha256="", compiler="c")


def assert_counters_match(store: Store) -> None:
    """The size and count counters equal the sums over the entries actually stored."""
    entries = store.entries()
    stats = store.stats()
    sizes = [len(store.read_raw(e.key)) for e in entries]
    assert stats["entries"] == len(entries) == store.count()
    assert stats["bytes"] == sum(e.size for e in entries) == sum(sizes)
    for label, device in stats["devices"].items():
        mine = [e for e in entries if e.device_label == label]
        assert device == {"entries": len(mine), "bytes": sum(e.size for e in mine), "hits": sum(e.hits for e in mine)}


def test_size_counter_follows_puts_deletes_and_evictions(tmp_path):
    rng = random.Random(3)
    store = Store(CacheConfig(tmp_path / "c", 60_000, False))
    for step in range(120):
        action = rng.random()
        if action < 0.6:
            i = rng.randrange(80)
            key, data, entry = synthetic(i, rng.choice([10, 500, 3000, 40_000]), arch=rng.choice("xy"))
            assert store.put(key, data, entry)
        elif action < 0.8:
            store.delete(f"{rng.randrange(80):064x}")
        elif action < 0.9:
            store.get(f"{rng.randrange(80):064x}")
        else:
            store.prune(max_size=rng.randrange(10_000, 60_000))
        if step % 10 == 0:
            assert_counters_match(store)
        assert store.stats()["bytes"] <= 60_000
    assert_counters_match(store)
    assert store.verify() == []


def test_eviction_keeps_the_budget_and_removes_least_recently_used_first(tmp_path, monkeypatch):
    clock = [1_000_000.0]
    monkeypatch.setattr(store_module.time, "time", lambda: clock[0])
    store = Store(CacheConfig(tmp_path / "c", 10_000, False))
    for i in range(10):
        clock[0] += 1
        store.put(*synthetic(i, 1000))
    for i in (0, 1, 2):  # used again: now the most recently used
        clock[0] += 1
        assert store.get(f"{i:064x}") is not None
    clock[0] += 1
    store.put(*synthetic(10, 1000))  # 11,000 bytes: over budget, evict down to the low-water mark
    kept = {int(e.key, 16) for e in store.entries()}
    assert kept == {0, 1, 2, 5, 6, 7, 8, 9, 10}  # 3 and 4 were the least recently used
    assert store.stats()["bytes"] <= LOW_WATER * 10_000
    assert [int(e.key, 16) for e in store.entries(limit=3)] == [10, 2, 1]
    assert_counters_match(store)


def test_prune_to_a_size_evicts_in_lru_order(tmp_path, monkeypatch):
    clock = [2_000_000.0]
    monkeypatch.setattr(store_module.time, "time", lambda: clock[0])
    store = Store(CacheConfig(tmp_path / "c", 1 << 30, False))
    for i in range(6):
        clock[0] += 1
        store.put(*synthetic(i, 1000))
    clock[0] += 1
    store.get(f"{0:064x}")
    evicted = store.prune(max_size=3000)
    assert [int(e.key, 16) for e in evicted] == [1, 2, 3]
    assert store.stats()["bytes"] == 3000


# Puts, gets and deletes its share of keys; some keys are shared with the other writers.
WRITER = textwrap.dedent(
    """
    import random, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from test_cache_scale import synthetic
    from portkern.cache.config import CacheConfig
    from portkern.cache.store import Store
    store = Store(CacheConfig(Path(sys.argv[1]), 150_000, False))
    rng = random.Random(int(sys.argv[2]))
    for step in range(60):
        i = rng.randrange(120)
        if rng.random() < 0.75:
            store.put(*synthetic(i, rng.choice([100, 2000, 40_000])))
        else:
            store.delete(f"{i:064x}")
        store.get(f"{rng.randrange(120):064x}")
    """
)


def test_eight_concurrent_writers_keep_the_counters_exact(tmp_path):
    directory = tmp_path / "c"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(directory), str(seed), str(Path(__file__).parent)],
                              stderr=subprocess.PIPE, text=True) for seed in range(8)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        assert "not usable" not in err, err
    store = Store(CacheConfig(directory, 150_000, False))
    assert store.stats()["bytes"] <= 150_000
    assert_counters_match(store)
    assert [f for f in store.verify() if f.kind != "lock"] == []


def test_warm_lookups_take_no_write_lock(tmp_path):
    store = Store(CacheConfig(tmp_path / "c", 1 << 30, False))
    key, data, entry = synthetic(1)
    store.put(key, data, entry)
    blocker = sqlite3.connect(store.directory / "cache.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        for _ in range(5):
            hit = store.get(key)
            assert hit is not None and hit[0] == data
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert store.counters() == {"hits": 5, "misses": 0, "remote_hits": 0, "remote_misses": 0, "remote_errors": 0}
    assert store.entries()[0].hits == 5


# Looks up every key of the cache 150 times in all, then exits (counts are written at exit).
LOOKUPS = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from portkern.cache.config import CacheConfig
    from portkern.cache.store import Store
    store = Store(CacheConfig(Path(sys.argv[1]), 1 << 30, False))
    keys = [f"{i:064x}" for i in range(5)]
    assert all(store.get(keys[n % 5]) is not None for n in range(150))
    """
)


def test_hit_counts_from_concurrent_processes_add_up(tmp_path):
    directory = tmp_path / "c"
    store = Store(CacheConfig(directory, 1 << 30, False))
    for i in range(5):
        store.put(*synthetic(i))
    procs = [subprocess.Popen([sys.executable, "-c", LOOKUPS, str(directory)], stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    entries = store.entries()
    assert [e.hits for e in entries] == [120] * 5
    assert store.counters() == {"hits": 600, "misses": 0, "remote_hits": 0, "remote_misses": 0, "remote_errors": 0}
    assert store.stats()["devices"]["cpu:x"]["hits"] == 600


def test_ls_lists_the_most_recent_fifty_with_limits_and_filters(tmp_path, capsys, monkeypatch):
    clock = [3_000_000.0]
    monkeypatch.setattr(store_module.time, "time", lambda: clock[0])
    store = Store(CacheConfig(tmp_path / "v1", 1 << 30, False))
    for i in range(60):
        clock[0] += 1
        store.put(*synthetic(i, kernel=f"k{i % 2}", bundle=f"b{i % 3}", arch="x" if i < 30 else "y"))

    def ls(*argv):
        assert main(["cache", "ls", "--cache-dir", str(tmp_path), "--json", *argv]) == 0
        return [int(e["key"], 16) for e in json.loads(capsys.readouterr().out)]

    assert ls() == list(range(59, 9, -1))
    assert ls("--limit", "3") == [59, 58, 57]
    assert sorted(ls("--all")) == list(range(60))
    assert ls("--kernel", "k1", "--limit", "2") == [59, 57]
    assert sorted(ls("--bundle", "b0", "--device", "cpu:x")) == list(range(0, 30, 3))
    assert main(["cache", "ls", "--cache-dir", str(tmp_path)]) == 0
    assert "the 50 most recently used of 60 entries" in re.sub(r"\s+", " ", capsys.readouterr().out)
    assert store.count(Filter(kernel="k0")) == 30


def test_usage_errors_are_json_under_json(capsys):
    assert main(["cache", "ls", "--limit", "0", "--json"]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out)["error"] == "UsageError"
    assert captured.err.strip().splitlines()[-1].startswith("portkern: error: argument --limit")


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    store = Store(CacheConfig(tmp_path / "v1", 1 << 30, False))
    store.put_many(synthetic(i) for i in range(1500))
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(tmp_path)}
    for command in ("cache ls --all", "cache ls --all --json", "devices --json"):
        done = subprocess.run(["sh", "-c", f'"$0" -m portkern {command} | head -c 600 >/dev/null', sys.executable],
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0
        assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_hit_counts_that_cannot_be_written_never_stop_the_hits(tmp_path, monkeypatch):
    from portkern.cache import hits, index

    store = Store(CacheConfig(tmp_path / "c", 1 << 30, False))
    key, data, entry = synthetic(1)
    store.put(key, data, entry)

    def read_only(*args, **kwargs):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(hits, "FLUSH_S", 0.0)  # every lookup tries to write its count
    monkeypatch.setattr(index, "record_hits", read_only)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert all(store.get(key) is not None for _ in range(3))
    assert store.enabled
