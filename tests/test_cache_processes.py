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

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.repair import DATABASE_FILES
from portkern.cache.store import Store
from portkern.examples.reference import EXAMPLES

from helpers import assert_matches

# Loads one kernel, checks it against NumPy, prints what happened as JSON.
RUN_KERNEL = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np
    import portkern
    from portkern.examples.reference import EXAMPLES
    bundle, name = sys.argv[1], sys.argv[2]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = portkern.load(bundle).kernel(name)
    example = EXAMPLES[name]
    inputs = example.inputs(np.random.default_rng(7))
    out = kernel(*inputs)
    ok = bool(np.allclose(out, example.reference(*inputs)[0], rtol=example.rtol, atol=example.atol))
    print(json.dumps({"origin": kernel.origin, "ok": ok, "warnings": [str(w.message) for w in caught]}))
    """
)

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


def run(cache_dir: Path, *argv: str, script: str = RUN_KERNEL) -> subprocess.Popen:
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(cache_dir)}
    return subprocess.Popen([sys.executable, "-c", script, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_warm_hit_in_a_new_process(examples_bundle, tmp_path):
    first = result(run(tmp_path, str(examples_bundle), "gemm_glu"))
    second = result(run(tmp_path, str(examples_bundle), "gemm_glu"))
    assert (first["origin"], second["origin"]) == ("finalized", "cache")
    assert first["ok"] and second["ok"]


def test_eight_processes_on_one_cold_kernel(examples_bundle, tmp_path):
    procs = [run(tmp_path, str(examples_bundle), "gemm_bias_relu") for _ in range(8)]
    results = [result(p) for p in procs]
    assert all(r["ok"] for r in results)
    origins = sorted(r["origin"] for r in results)
    assert origins == ["cache"] * 7 + ["finalized"]
    store = Store(CacheConfig(tmp_path / "v1", 1 << 30, False))
    (entry,) = store.entries()
    assert entry.kernel == "gemm_bias_relu" and store.verify() == []


def test_thirty_sigkills_during_writes_then_verify_and_clear(tmp_path):
    """Writers of 4 MiB artifacts, three at a time, killed 30 times: every entry left is intact,
    `verify` removes what the kills left behind (partial files, locks), and `clear` leaves no file."""
    rng = random.Random(0)
    directory = tmp_path / "v1"
    for _ in range(10):
        procs = [run(directory, str(directory), script=WRITE_LOOP) for _ in range(3)]
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
    values = {str(p.relative_to(directory)) for p in directory.rglob("*.val")}
    assert len(values) == len(entries)  # one file per artifact, none without a row
    assert store.stats()["bytes"] == len(entries) << 22
    assert store.clear() == len(entries)
    # everything but the database, which stays, emptied, for the processes that have it open
    assert {p.name for p in directory.rglob("*")} <= set(DATABASE_FILES) and store.entries() == []


def test_sigkill_during_a_cold_finalisation_then_a_clean_read(examples_bundle, tmp_path, rng):
    for delay in (0.3, 0.8, 1.5):
        proc = run(tmp_path, str(examples_bundle), "mlp")
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    store = Store(CacheConfig(tmp_path / "v1", 1 << 30, False))
    # A process killed while it holds the kernel's build lock leaves that lock behind (verify
    # removes it); nothing else may be left: no torn entry, no stray file.
    assert [f for f in store.verify() if f.kind != "lock"] == []
    assert store.verify() == []
    kernel = portkern.load(examples_bundle, store=store).kernel("mlp")
    example = EXAMPLES["mlp"]
    inputs = example.inputs(rng)
    assert_matches(kernel(*inputs), example.reference(*inputs), example.rtol, example.atol)


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


# Loads kernels (argv[2:]) with worker starts counted, checks each against NumPy, prints what happened as JSON.
RUN_COUNTING_WORKERS = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np
    import portkern
    from portkern.examples.reference import EXAMPLES
    from portkern.jit import workers
    started = []
    original = workers._Worker.__init__
    def counting(self, *args, **kwargs):
        started.append(1)
        original(self, *args, **kwargs)
    workers._Worker.__init__ = counting
    report = {"origins": {}, "ok": True}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bundle = portkern.load(sys.argv[1])
        for name in sys.argv[2:]:
            kernel = bundle.kernel(name)
            example = EXAMPLES[name]
            inputs = example.inputs(np.random.default_rng(7))
            out = kernel(*inputs)
            report["ok"] &= bool(np.allclose(out, example.reference(*inputs)[0], rtol=example.rtol, atol=example.atol))
            report["origins"][name] = kernel.origin
        report["workers_started"] = len(started)
    report["warnings"] = [str(w.message) for w in caught]
    print(json.dumps(report))
    """
)


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


def _report(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _files(directory: Path) -> list[tuple[str, int]]:
    return sorted((str(path.relative_to(directory)), path.stat().st_mtime_ns) for path in directory.rglob("*"))


def test_read_only_cache_dir_serves_hits_and_skips_new_entries_with_one_warning(examples_bundle, tmp_path):
    warm = result(run(tmp_path, str(examples_bundle), "gemm_rowsum"))
    assert warm["origin"] == "finalized"
    before = _files(tmp_path)
    report = _report(_read_only(tmp_path, [sys.executable, "-c", RUN_COUNTING_WORKERS, str(examples_bundle), "gemm_rowsum", "gemm_glu", "mlp"],
                                {"PORTKERN_CACHE_DIR": str(tmp_path)}))
    assert report["ok"]
    assert report["origins"] == {"gemm_rowsum": "cache", "gemm_glu": "finalized", "mlp": "finalized"}
    assert report["workers_started"] == 1  # for the two cold kernels; none for the hit
    assert len(report["warnings"]) == 1, report["warnings"]
    assert "read-only" in report["warnings"][0] and "not stored" in report["warnings"][0]
    assert _files(tmp_path) == before


def test_read_only_cache_dir_serves_a_hit_with_no_worker_and_no_warning(examples_bundle, tmp_path):
    result(run(tmp_path, str(examples_bundle), "gemm_bias_relu"))
    report = _report(_read_only(tmp_path, [sys.executable, "-c", RUN_COUNTING_WORKERS, str(examples_bundle), "gemm_bias_relu"],
                                {"PORTKERN_CACHE_DIR": str(tmp_path)}))
    assert report["ok"] and report["origins"] == {"gemm_bias_relu": "cache"}
    assert report["workers_started"] == 0 and report["warnings"] == []


def test_a_read_only_then_a_writable_cache_dir(examples_bundle, tmp_path):
    image, local = tmp_path / "image", tmp_path / "local"
    image.mkdir()
    result(run(image, str(examples_bundle), "gemm_rowsum"))
    both = {"PORTKERN_CACHE_DIR": f"{image}{os.pathsep}{local}"}
    kernels = [sys.executable, "-c", RUN_COUNTING_WORKERS, str(examples_bundle), "gemm_rowsum", "gemm_glu"]
    report = _report(_read_only(image, kernels, both))
    assert report["ok"] and report["origins"] == {"gemm_rowsum": "cache", "gemm_glu": "finalized"}
    assert report["warnings"] == []
    assert [e.kernel for e in Store(CacheConfig(image / "v1", 1 << 30, False)).entries()] == ["gemm_rowsum"]
    assert [e.kernel for e in Store(CacheConfig(local / "v1", 1 << 30, False)).entries()] == ["gemm_glu"]
    again = _report(_read_only(image, kernels, both))
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
