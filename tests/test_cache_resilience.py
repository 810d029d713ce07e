"""The cache under stress: clears racing a running process, a full disk, read-only and unusable
directories under `verify` and `clear`, `verify` beside writers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from helpers import RUN_EXAMPLES, assert_example
from test_cache_store import flip_byte

import portkern
from portkern.cache import store as cache_store
from portkern.cache.config import CacheConfig, CacheWarning
from portkern.cache.layout import DATABASE_FILES
from portkern.cache.store import Entry, Store

CLI = [sys.executable, "-m", "portkern"]


def entry(key: str) -> Entry:
    return Entry(key=key, kernel="k", bundle="b", bundle_digest="", device={"kind": "cpu", "arch": "x"},
                 device_label="cpu:x", config="default", format="vmfb", size=0, sha256="", compiler="c")


def artifact(i: int, size: int = 100_000) -> tuple[str, bytes]:
    data = i.to_bytes(4, "little") * (size // 4)
    return hashlib.sha256(data).hexdigest(), data


def cli(directory: Path, *argv: str, prefix: list[str] = ()) -> subprocess.CompletedProcess:
    """`portkern cache ARGV --cache-dir DIRECTORY`, with a temporary directory of its own beside DIRECTORY
    (`verify` also sweeps the scratch directories dead processes left in the temporary directory)."""
    scratch = directory.parent / f"{directory.name}-tmp"
    scratch.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(scratch)}
    return subprocess.run([*prefix, *CLI, "cache", *argv, "--cache-dir", str(directory)], capture_output=True, text=True, timeout=300, env=env)


def test_a_clear_that_leaves_the_cache_unusable_for_a_while_then_hits_again(examples_bundle, tmp_path, rng):
    """`portkern cache clear` in another process between lookups, then a directory that cannot be
    opened (what a clear racing this process's open looks like): one warning, and once the
    directory is usable again the process stores and hits again."""
    store = Store(CacheConfig(tmp_path / "v1", 1 << 30, False))
    assert portkern.load(examples_bundle, store=store).kernel("gemm_glu").origin == "finalized"
    assert portkern.load(examples_bundle, store=store).kernel("gemm_glu").origin == "cache"
    cleared = cli(tmp_path, "clear", "--json")
    assert cleared.returncode == 0 and json.loads(cleared.stdout)["removed"] == 1, cleared.stderr
    assert portkern.load(examples_bundle, store=store).kernel("gemm_glu").origin == "finalized"
    assert portkern.load(examples_bundle, store=store).kernel("gemm_glu").origin == "cache"

    assert cli(tmp_path, "clear").returncode == 0
    for name in DATABASE_FILES:  # a clear keeps the emptied database; now it cannot be opened
        (tmp_path / "v1" / name).unlink(missing_ok=True)
    (tmp_path / "v1" / "cache.db").mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert portkern.load(examples_bundle, store=store).kernel("gemm_glu").origin == "finalized"
        cleared = cli(tmp_path, "clear")  # removes what it cannot open: that is how it is made usable again
        assert cleared.returncode == 0, cleared.stderr
        origins = [portkern.load(examples_bundle, store=store).kernel("gemm_glu").origin
                   for _ in range(cache_store.RETRY_FIRST + 2)]
    assert origins[-1] == "cache", origins
    assert origins.count("finalized") <= cache_store.RETRY_FIRST + 1, origins
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(messages) == 1 and "not usable" in messages[0], messages
    fresh = Store(CacheConfig(tmp_path / "v1", 1 << 30, False))
    kernel = portkern.load(examples_bundle, store=fresh).kernel("gemm_glu")
    assert kernel.origin == "cache"
    assert_example(kernel, rng)


CLEAR_LOOP = textwrap.dedent(
    """
    import sys, warnings
    from pathlib import Path
    from portkern.cache.config import CacheConfig
    from portkern.cache.store import Store
    warnings.simplefilter("ignore")
    print("ready", flush=True)
    for _ in range(int(sys.argv[2])):
        Store(CacheConfig(Path(sys.argv[1]), 1 << 30, False)).clear()
    """
)


def test_a_clear_loop_beside_lookups_ends_with_hits_again(tmp_path):
    directory = tmp_path / "v1"
    store = Store(CacheConfig(directory, 1 << 30, False))
    items = [artifact(i) for i in range(3)]
    clearer = subprocess.Popen([sys.executable, "-c", CLEAR_LOOP, str(directory), "40"], stdout=subprocess.PIPE, text=True)
    assert clearer.stdout.readline().strip() == "ready"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        while clearer.poll() is None:
            for key, data in items:
                if store.get(key) is None:
                    store.put(key, data, entry(key))
        assert clearer.wait() == 0
        # The clears are over: within one back-off period every entry is stored and hit again.
        for _ in range(cache_store.RETRY_MAX + 1):
            for key, data in items:
                if store.get(key) is None:
                    store.put(key, data, entry(key))
        found = [store.get(key) for key, _ in items]
    assert [hit[0] if hit else None for hit in found] == [data for _, data in items]
    places = store.places()
    assert places and all(place["state"] == "writable" for place in places)
    fresh = Store(CacheConfig(directory, 1 << 30, False))
    assert [fresh.get(key)[0] for key, _ in items] == [data for _, data in items]
    assert fresh.verify() == []


# Runs inside a private mount namespace with a 24 MiB tmpfs at argv[1]: warms a cache there with
# four kernels, fills the file system, then loads them (and a fifth) in a fresh process.
FULL_DISK = textwrap.dedent(
    """
    import json, os, subprocess, sys
    mount, bundle, run = sys.argv[1], sys.argv[2], sys.argv[3]
    env = {**os.environ, "PORTKERN_CACHE_DIR": mount}
    names = ["gemm_glu", "gemm_rowsum", "mlp", "gemm_bias_relu"]
    def load(*names):
        done = subprocess.run([sys.executable, "-c", run, bundle, *names], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])
    warm = load(*names)
    with open(os.path.join(mount, "filler"), "wb") as filler:
        try:
            while True:
                filler.write(b"\\0" * (1 << 16))
                filler.flush()
        except OSError:
            pass
    free = os.statvfs(mount).f_bavail
    full = load(*names, "gemm_transpose_add")
    print(json.dumps({"warm": warm, "full": full, "free_blocks": free}))
    """
)

def private_mounts() -> str:
    """Why this process cannot mount a file system in a private mount namespace ("" when it can)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"cannot mount a tmpfs in a private mount namespace: {probe.stderr.strip()}"


def test_a_full_disk_serves_its_entries_and_refuses_only_writes(examples_bundle, tmp_path):
    why = private_mounts()
    if why:
        pytest.skip(why)
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=24m tmpfs "$0" && exec "$@"', str(mount),
         sys.executable, "-c", FULL_DISK, str(mount), str(examples_bundle), RUN_EXAMPLES],
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    warm, full = report["warm"], report["full"]
    assert warm["ok"] and set(warm["origins"].values()) == {"finalized"} and warm["warnings"] == []
    assert report["free_blocks"] == 0
    assert full["ok"], full
    assert full["origins"] == {"gemm_glu": "cache", "gemm_rowsum": "cache", "mlp": "cache", "gemm_bias_relu": "cache",
                               "gemm_transpose_add": "finalized"}
    assert len(full["warnings"]) == 1 and "cannot store new entries" in full["warnings"][0], full["warnings"]


def read_only_prefix(directory: Path) -> list[str]:
    """A command prefix under which `directory` is a read-only bind mount (skips when there is none)."""
    why = private_mounts()
    if why:
        pytest.skip(why)
    d = str(directory)
    return ["unshare", "-m", "sh", "-c", f'mount --bind "{d}" "{d}" && mount -o remount,bind,ro "{d}" "{d}" && exec "$0" "$@"']


def test_verify_and_clear_on_a_read_only_directory_say_what_they_could_not_do(tmp_path):
    store = Store(CacheConfig(tmp_path / "v1", 1 << 30, False))
    items = [artifact(i) for i in range(3)]
    for key, data in items:
        assert store.put(key, data, entry(key))
    flip_byte(store, items[1][0])
    store.close()
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    prefix = read_only_prefix(tmp_path)

    verified = cli(tmp_path, "verify", "--json", prefix=prefix)
    assert verified.returncode == 1, verified.stderr
    found = json.loads(verified.stdout)["found"]
    assert [(f["kind"], f["name"], f["fixed"]) for f in found] == [("entry", items[1][0], False)]
    assert "artifact does not match its sha256" in found[0]["problem"] and "read-only" in found[0]["problem"]
    text = cli(tmp_path, "verify", prefix=prefix)
    assert text.returncode == 1 and "all intact" not in text.stdout and "NOT fixed" in text.stdout, text.stdout

    cleared = cli(tmp_path, "clear", "--json", prefix=prefix)
    assert cleared.returncode == 1
    error = json.loads(cleared.stdout)
    assert error["error"] == "CacheError" and "nothing removed" in error["message"] and "read-only" in error["message"]
    assert "removed 0" not in cleared.stdout + cleared.stderr
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    # Writable again, verify removes the corrupt entry and keeps the others.
    again = cli(tmp_path, "verify", "--json")
    assert again.returncode == 1 and [f["fixed"] for f in json.loads(again.stdout)["found"]] == [True]
    fresh = Store(CacheConfig(tmp_path / "v1", 1 << 30, False))
    assert [fresh.get(key) is not None for key, _ in items] == [True, False, True]


def test_a_read_only_cache_an_older_portkern_wrote_is_not_used_and_says_why(tmp_path):
    from test_cache_repair import written_with_diskcache

    store = Store(CacheConfig(tmp_path / "v1", 1 << 30, False))
    key, data = artifact(0)
    assert store.put(key, data, entry(key))
    store.close()
    written_with_diskcache(tmp_path / "v1")
    verified = cli(tmp_path, "verify", "--json", prefix=read_only_prefix(tmp_path))
    assert verified.returncode == 1, verified.stderr
    (found,) = json.loads(verified.stdout)["found"]
    assert (found["kind"], found["fixed"]) == ("directory", False) and "older portkern" in found["problem"], found
    # Writable, it is moved into the current layout on open and serves its entry.
    assert Store(CacheConfig(tmp_path / "v1", 1 << 30, False)).get(key)[0] == data


def test_verify_of_an_unusable_directory_is_not_all_intact(tmp_path):
    (tmp_path / "v1" / "cache.db").mkdir(parents=True)
    verified = cli(tmp_path, "verify")
    assert verified.returncode == 1
    assert "all intact" not in verified.stdout and "not usable" in verified.stdout, verified.stdout
    as_json = cli(tmp_path, "verify", "--json")
    assert as_json.returncode == 1
    (found,) = json.loads(as_json.stdout)["found"]
    assert found["kind"] == "directory" and not found["fixed"]


WRITE_AND_EVICT = textwrap.dedent(
    """
    import hashlib, os, sys, warnings
    from pathlib import Path
    from portkern.cache.config import CacheConfig
    from portkern.cache.store import Entry, Store
    warnings.simplefilter("ignore")
    store = Store(CacheConfig(Path(sys.argv[1]), 3 << 20, False))  # room for three: every put evicts
    print("ready", flush=True)
    while True:
        data = os.urandom(1 << 20)
        key = hashlib.sha256(data).hexdigest()
        store.put(key, data, Entry(key=key, kernel="k", bundle="b", bundle_digest="", device={"kind": "cpu", "arch": "x"},
                                   device_label="cpu:x", config="default", format="vmfb", size=0, sha256="", compiler="c"))
    """
)


def test_verify_beside_writers_removes_nothing_they_write(tmp_path):
    directory = tmp_path / "v1"
    writers = [subprocess.Popen([sys.executable, "-c", WRITE_AND_EVICT, str(directory)], stdout=subprocess.PIPE, text=True)
               for _ in range(2)]
    try:
        for writer in writers:
            assert writer.stdout.readline().strip() == "ready"
        store = Store(CacheConfig(directory, 1 << 40, False))
        findings = [finding for _ in range(40) for finding in store.verify()]
    finally:
        for writer in writers:
            writer.kill()
            writer.wait()
    assert [(f.kind, f.name, f.problem) for f in findings] == []
