"""The cache across processes: warm starts, concurrent cold starts, SIGKILL, read-only directories."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import RUN_EXAMPLES, assert_example, last_json, spawn

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.layout import DATABASE_FILES
from portkern.cache.store import Store

# Writes large artifacts in a loop until killed.
WRITE_LOOP = textwrap.dedent(
    """
    import hashlib, os, sys
    from portkern.cache.config import CacheConfig
    from portkern.cache.store import Entry, Store
    store = Store(CacheConfig(__import__("pathlib").Path(sys.argv[1]), 1 << 40, False))
    print("ready", flush=True)
    i = 0
    while True:
        data = os.urandom(1 << 22)
        key = hashlib.sha256(data).hexdigest()
        store.put(key, data, Entry(key=key, kernel="k", bundle="b", bundle_digest="", device={"kind": "cpu", "arch": "x"},
                                   device_label="cpu:x", config="default", format="vmfb", size=0, sha256="", compiler="c"))
        i += 1
    """
)


def test_warm_hit_in_a_new_process(examples_bundle, tmp_path):
    first = last_json(spawn(RUN_EXAMPLES, examples_bundle, "gemm_glu", cache_dir=tmp_path))
    second = last_json(spawn(RUN_EXAMPLES, examples_bundle, "gemm_glu", cache_dir=tmp_path))
    assert (first["origins"], second["origins"]) == ({"gemm_glu": "finalized"}, {"gemm_glu": "cache"})
    assert first["ok"] and second["ok"]


def test_eight_processes_on_one_cold_kernel(examples_bundle, tmp_path):
    procs = [spawn(RUN_EXAMPLES, examples_bundle, "gemm_bias_relu", cache_dir=tmp_path) for _ in range(8)]
    results = [last_json(p) for p in procs]
    assert all(r["ok"] for r in results)
    origins = sorted(r["origins"]["gemm_bias_relu"] for r in results)
    assert origins == ["cache"] * 7 + ["finalized"]
    store = Store(CacheConfig(tmp_path / "v1", 1 << 30, False))
    (entry,) = store.entries()
    assert entry.kernel == "gemm_bias_relu" and store.verify() == []


# Holds the write lock of the cache database at argv[1] until killed (a long import, a stopped writer).
HOLD_WRITE_LOCK = textwrap.dedent(
    """
    import sqlite3, sys, time
    con = sqlite3.connect(sys.argv[1], isolation_level=None)
    con.execute("BEGIN IMMEDIATE")
    print("holding", flush=True)
    time.sleep(3600)
    """
)


def test_a_process_holding_the_write_lock_keeps_no_warm_process_waiting(examples_bundle, tmp_path):
    """A warm process counts its hits at exit; where another process holds the cache's write lock
    (SQLite's wait is 60 s), the counts are dropped, and the warm process serves, checks its result
    and exits as it would on an idle cache. Several runs, each far within the lock's wait."""
    assert last_json(spawn(RUN_EXAMPLES, examples_bundle, "gemm_glu", cache_dir=tmp_path))["ok"]
    holder = subprocess.Popen([sys.executable, "-c", HOLD_WRITE_LOCK, str(tmp_path / "v1" / "cache.db")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        for _ in range(3):
            began = time.monotonic()
            report = last_json(spawn(RUN_EXAMPLES, examples_bundle, "gemm_glu", cache_dir=tmp_path))
            took = time.monotonic() - began
            assert report["ok"] and report["origins"] == {"gemm_glu": "cache"}, report
            assert took < 30, f"a warm process took {took:.1f} s while another held the write lock"
    finally:
        holder.kill()
        holder.wait()


def _held(lock: Path) -> bool:
    """Whether another process holds the file lock `lock` (filelock's `flock`)."""
    import fcntl

    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_a_stopped_process_holding_a_build_lock_keeps_others_waiting_only_as_long_as_a_compile(examples_bundle, tmp_path):
    """A process stopped (Ctrl-Z, a debugger) while it holds a cold kernel's build lock: another
    process asking for the kernel waits for the lock no longer than a compile may run
    (`PORTKERN_COMPILE_TIMEOUT`, here 3 s), then builds it itself; both results are right."""
    from portkern.cache.layout import LOCKS

    env = {**os.environ, "PORTKERN_CACHE_DIR": str(tmp_path), "PORTKERN_BACKGROUND": "0"}
    holder = subprocess.Popen([sys.executable, "-c", RUN_EXAMPLES, str(examples_bundle), "gemm_glu"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(_held(lock) for lock in (tmp_path / "v1" / LOCKS).glob("*.lock")):
            assert holder.poll() is None and time.monotonic() < deadline, "the first process never held a build lock"
            time.sleep(0.01)
        holder.send_signal(signal.SIGSTOP)
        waiter = subprocess.run([sys.executable, "-c", RUN_EXAMPLES, str(examples_bundle), "gemm_glu"], capture_output=True,
                                text=True, timeout=120, env={**env, "PORTKERN_COMPILE_TIMEOUT": "3s"})
        report = last_json(waiter)
        assert report["ok"] and report["origins"] == {"gemm_glu": "finalized"}, report
    finally:
        holder.send_signal(signal.SIGCONT)
    assert last_json(holder)["ok"]


def test_thirty_sigkills_during_writes_then_verify_and_clear(tmp_path):
    """Writers of 4 MiB artifacts, three at a time, killed 30 times: every entry left is intact,
    `verify` removes what the kills left behind (partial files, locks), and `clear` leaves no file."""
    rng = random.Random(0)
    directory = tmp_path / "v1"
    for _ in range(10):
        procs = [spawn(WRITE_LOOP, directory, cache_dir=directory) for _ in range(3)]
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.6))
        for proc in procs:
            time.sleep(rng.uniform(0.0, 0.05))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    store = Store(CacheConfig(directory, 1 << 40, False))
    entries = store.entries()
    assert entries, "the writers never completed a single entry"
    for entry in entries:
        hit = store.get(entry.key, count=False)
        assert hit is not None and len(hit[0]) == 1 << 22
    assert {f.kind for f in store.verify()} <= {"file", "lock"}
    assert store.verify() == []
    assert store.stats()["bytes"] == len(entries) << 22
    assert store.clear() == len(entries)
    # everything but the database, which stays, emptied, for the processes that have it open
    assert {p.name for p in directory.rglob("*")} <= set(DATABASE_FILES) and store.entries() == []


def test_sigkill_during_a_cold_finalisation_then_a_clean_read(examples_bundle, tmp_path, rng):
    for delay in (0.3, 0.8, 1.5):
        proc = spawn(RUN_EXAMPLES, examples_bundle, "mlp", cache_dir=tmp_path)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    store = Store(CacheConfig(tmp_path / "v1", 1 << 30, False))
    # A process killed while it holds the kernel's build lock leaves that lock behind (verify
    # removes it); nothing else may be left: no torn entry, no stray file.
    assert [f for f in store.verify() if f.kind != "lock"] == []
    assert store.verify() == []
    assert_example(portkern.load(examples_bundle, store=store).kernel("mlp"), rng)


def _read_only_runner(directory: Path) -> list[str] | None:
    """A command prefix under which `directory` is read-only, even for root; None if there is none."""
    if os.geteuid() != 0:
        return []
    if shutil.which("unshare") is None:
        return None
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        return None
    d = str(directory)
    return ["unshare", "-m", "sh", "-c", f'mount --bind "{d}" "{d}" && mount -o remount,bind,ro "{d}" "{d}" && exec "$0" "$@"']


def _read_only(directory: Path, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run `argv` with `directory` read-only (a private read-only bind mount as root, chmod otherwise)."""
    prefix = _read_only_runner(directory)
    if prefix is None:
        pytest.skip("running as root without a private mount namespace (unshare -m), so no directory is read-only")
    if not prefix:
        for path in [directory, *directory.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        return subprocess.run([*prefix, *argv], env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    finally:
        if not prefix:
            for path in [directory, *directory.rglob("*")]:
                path.chmod(0o755 if path.is_dir() else 0o644)


def _files(directory: Path) -> list[tuple[str, int]]:
    return sorted((str(path.relative_to(directory)), path.stat().st_mtime_ns) for path in directory.rglob("*"))


def test_read_only_cache_dir_serves_hits_and_skips_new_entries_with_one_warning(examples_bundle, tmp_path):
    warm = last_json(spawn(RUN_EXAMPLES, examples_bundle, "gemm_rowsum", cache_dir=tmp_path))
    assert warm["origins"] == {"gemm_rowsum": "finalized"}
    before = _files(tmp_path)
    report = last_json(_read_only(tmp_path, [sys.executable, "-c", RUN_EXAMPLES, str(examples_bundle), "gemm_rowsum", "gemm_glu", "mlp"],
                                {"PORTKERN_CACHE_DIR": str(tmp_path)}))
    assert report["ok"]
    assert report["origins"] == {"gemm_rowsum": "cache", "gemm_glu": "finalized", "mlp": "finalized"}
    assert report["workers_started"] == 1  # for the two cold kernels; none for the hit
    assert len(report["warnings"]) == 1, report["warnings"]
    assert "read-only" in report["warnings"][0] and "not stored" in report["warnings"][0]
    assert _files(tmp_path) == before


def test_read_only_cache_dir_serves_a_hit_with_no_worker_and_no_warning(examples_bundle, tmp_path):
    last_json(spawn(RUN_EXAMPLES, examples_bundle, "gemm_bias_relu", cache_dir=tmp_path))
    report = last_json(_read_only(tmp_path, [sys.executable, "-c", RUN_EXAMPLES, str(examples_bundle), "gemm_bias_relu"],
                                {"PORTKERN_CACHE_DIR": str(tmp_path)}))
    assert report["ok"] and report["origins"] == {"gemm_bias_relu": "cache"}
    assert report["workers_started"] == 0 and report["warnings"] == []


def test_a_read_only_then_a_writable_cache_dir(examples_bundle, tmp_path):
    image, local = tmp_path / "image", tmp_path / "local"
    image.mkdir()
    last_json(spawn(RUN_EXAMPLES, examples_bundle, "gemm_rowsum", cache_dir=image))
    both = {"PORTKERN_CACHE_DIR": f"{image}{os.pathsep}{local}"}
    kernels = [sys.executable, "-c", RUN_EXAMPLES, str(examples_bundle), "gemm_rowsum", "gemm_glu"]
    report = last_json(_read_only(image, kernels, both))
    assert report["ok"] and report["origins"] == {"gemm_rowsum": "cache", "gemm_glu": "finalized"}
    assert report["warnings"] == []
    assert [e.kernel for e in Store(CacheConfig(image / "v1", 1 << 30, False)).entries()] == ["gemm_rowsum"]
    assert [e.kernel for e in Store(CacheConfig(local / "v1", 1 << 30, False)).entries()] == ["gemm_glu"]
    again = last_json(_read_only(image, kernels, both))
    assert again["ok"] and again["origins"] == {"gemm_rowsum": "cache", "gemm_glu": "cache"}
    assert again["workers_started"] == 0
    cli = [sys.executable, "-m", "portkern"]
    listed = json.loads(_read_only(image, [*cli, "cache", "ls", "--json"], both).stdout)
    assert {(e["kernel"], e["directory"]) for e in listed} == {("gemm_rowsum", str(image / "v1")), ("gemm_glu", str(local / "v1"))}
    stats = json.loads(_read_only(image, [*cli, "cache", "stats", "--json"], both).stdout)
    assert [(p["directory"], p["state"], p["entries"]) for p in stats["directories"]] == [
        (str(image / "v1"), "read-only", 1), (str(local / "v1"), "writable", 1)]
    assert stats["entries"] == 2
    text = _read_only(image, [*cli, "cache", "ls"], both).stdout
    assert f"{image / 'v1'} (read-only)" in text and f"{local / 'v1'} (writable)" in text
