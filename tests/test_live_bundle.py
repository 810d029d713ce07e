"""A bundle changed on disk while a process has it loaded: the process keeps the loaded bundle's
results, never other numbers and never a signal (docs/bundle-format.md, "A bundle in use"). Each
change is made while a child process holds the bundle (between calls, or while calls run); the
child must survive it. A file of at most READ_LIMIT bytes is read into memory; a larger one is
mapped from portkern's own copy in the cache directory, or read where no copy can be kept."""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX models need the 'onnx' package")

from helpers import logged, one_kernel_bundle, run_past_a_pipe

import portkern  # noqa: E402
from portkern.base.errors import BundleChangedError, BundleTruncatedError, DigestMismatchError  # noqa: E402
from portkern.cache.config import CacheConfig, from_env  # noqa: E402
from portkern.cache.store import Store  # noqa: E402
from portkern.examples.large_mlp import reference, write_mlp  # noqa: E402
from portkern.jit import parameters as mapped  # noqa: E402
from portkern.jit.parameters import READ_LIMIT, UNUSED_S, copy_folders  # noqa: E402
from portkern.portable.bundle import read_bundle  # noqa: E402

#: A file of at most READ_LIMIT bytes is read into memory whole; a larger one is mapped.
SIZES = {"read": (64, 512, 256, 256), "mapped": (64, math.isqrt(READ_LIMIT // 4) + 64, math.isqrt(READ_LIMIT // 4) + 64, 64)}
#: How a child holds the bundle: (size, environment changes). "no cache": a large file with no
#: cache directory to keep a copy in, read into memory.
HELD = {"read": ("read", {}), "mapped": ("mapped", {}), "no cache": ("mapped", {"PORTKERN_CACHE_DISABLE": "1"})}
BATCH = 8
RTOL, ATOL = 1e-4, 1e-4

#: Loads the bundle, calls the kernel, waits for a line (the seed of the bundle now at the path,
#: 0: none), calls again, then loads what is at the path now (its results, or the typed error).
CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import portkern
    from portkern.examples.large_mlp import reference

    path, widths = sys.argv[1], tuple(int(w) for w in sys.argv[2].split(","))
    x = np.random.default_rng(0).standard_normal((8, widths[0]), dtype=np.float32)

    def outcome(load, seed):
        try:
            result = load()(x)
        except portkern.PortkernError as exc:
            return {"raised": type(exc).__name__, "message": str(exc)}
        return {"nan": bool(np.isnan(result).any()), "matches": bool(np.allclose(result, reference(x, widths, seed), rtol=1e-4, atol=1e-4))}

    kernel = portkern.load(path).kernel("mlp")
    print(json.dumps(outcome(lambda: kernel, 1)), flush=True)
    now = int(sys.stdin.readline())
    report = {"again": outcome(lambda: kernel, 1), "loaded_again": outcome(lambda: portkern.load(path).kernel("mlp"), now)}
    print(json.dumps(report), flush=True)
    """
)

#: Loads the bundle and calls the kernel in a loop (a line after each call) until stdin has a line;
#: then how many calls did not match or raised.
CALLING = textwrap.dedent(
    """
    import json, sys, threading
    import numpy as np
    import portkern
    from portkern.examples.large_mlp import reference

    path, widths = sys.argv[1], tuple(int(w) for w in sys.argv[2].split(","))
    x = np.random.default_rng(0).standard_normal((8, widths[0]), dtype=np.float32)
    expected = reference(x, widths, 1)
    kernel = portkern.load(path).kernel("mlp")
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    calls, wrong = 0, []
    while not stop.is_set():
        try:
            if not np.allclose(kernel(x), expected, rtol=1e-4, atol=1e-4):
                wrong.append("other numbers")
        except portkern.PortkernError as exc:
            wrong.append(type(exc).__name__ + ": " + str(exc))
        calls += 1
        print(calls, flush=True)
    print(json.dumps({"calls": calls, "wrong": wrong}), flush=True)
    """
)


def build(where: Path, widths: tuple[int, ...], seed: int) -> tuple[Path, Path]:
    """The bundle of the MLP with these weights, and its manifest."""
    where.mkdir(parents=True, exist_ok=True)
    write_mlp(where / "m.onnx", widths, BATCH, seed)
    return one_kernel_bundle(where, "m.onnx", "mlp", bundle="mlp"), where / "mlp.yaml"


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """`library(size)`: {seed: (bundle, manifest)} for seeds 1 and 7 of that size, built once."""
    built: dict[str, dict[int, tuple[Path, Path]]] = {}

    def get(size: str) -> dict[int, tuple[Path, Path]]:
        if size not in built:
            where = tmp_path_factory.mktemp(size)
            built[size] = {seed: build(where / str(seed), SIZES[size], seed) for seed in (1, 7)}
            length = built[size][1][0].stat().st_size
            assert (length <= READ_LIMIT) == (size == "read") and length == built[size][7][0].stat().st_size
        return built[size]

    return get


@pytest.fixture(params=list(HELD))
def held(request, library):
    """(name, widths, {seed: (bundle, manifest)}, the child's environment)."""
    size, env = HELD[request.param]
    return request.param, SIZES[size], library(size), {**os.environ, **env}


def rebuild(live: Path, built) -> int:
    """`portkern build` of the seed-7 model over the live path (it writes by rename)."""
    from portkern.portable.builder import build_file

    inode = live.stat().st_ino
    build_file(built[7][1], live)
    assert live.stat().st_ino != inode  # a new file, renamed over the old one
    return 7


def renamed(live: Path, built) -> int:
    part = live.with_name(".mlp.pkb.part")
    shutil.copyfile(built[7][0], part)
    os.replace(part, live)
    return 7


def rewritten(live: Path, built) -> int:
    shutil.copyfile(built[7][0], live)  # `cp new.pkb live.pkb`: written into the same file
    return 7


def truncated(live: Path, built) -> int:
    os.truncate(live, live.stat().st_size // 2)  # inside the parameter section
    return 0


def cut_to_100_bytes(live: Path, built) -> int:
    os.truncate(live, 100)  # `truncate -s 100 live.pkb`: inside the header
    return 0


def zero_filled(live: Path, built) -> int:
    """Zeros written over the start of the parameter section, in place (size kept; the header
    and metadata still say seed 1's bundle)."""
    section = read_bundle(built[1][0]).parameters
    with open(live, "r+b") as f:
        f.seek(section.offset)
        f.write(bytes(min(section.size, 1 << 20)))
    return 1


CHANGES = [rebuild, renamed, rewritten, truncated, cut_to_100_bytes, zero_filled]


def loaded_again(held: str, change) -> str:
    """What a fresh `load` + kernel + call of what the change leaves at the path gives: the name
    of the error it raises, or "matches" (the results of the bundle whose seed the change returned)."""
    if change in (truncated, cut_to_100_bytes):
        return BundleTruncatedError.__name__
    if change is zero_filled and held != "mapped":
        return DigestMismatchError.__name__
    # (a zero-filled mapped file: its bundle's checked copy, made by the first load, is mapped)
    return "matches"


@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__)
def test_a_bundle_changed_under_a_process_keeps_its_results(tmp_path, held, change):
    name, widths, built, env = held
    live = tmp_path / "mlp.pkb"
    shutil.copyfile(built[1][0], live)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(live), ",".join(map(str, widths))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        first = json.loads(child.stdout.readline() or "null")
        assert first == {"nan": False, "matches": True}, child.communicate(timeout=60)[1]
        now = change(live, built)
        out, err = child.communicate(f"{now}\n", timeout=600)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, f"the child ended with {child.returncode} (a negative status is a signal): {err}"
    report = json.loads(out.strip().splitlines()[-1])
    assert report["again"] == {"nan": False, "matches": True}, report
    if loaded_again(name, change) == "matches":
        assert report["loaded_again"] == {"nan": False, "matches": True}, report
    else:  # a fresh load reads the file at the path now: refused
        assert report["loaded_again"]["raised"] == loaded_again(name, change), report


def test_a_bundle_changed_while_calls_run_keeps_its_results(tmp_path, held):
    """Zero-filled, truncated, rewritten and cut short again and again while another thread calls
    the kernel: every call gives the loaded bundle's results."""
    name, widths, built, env = held
    live = tmp_path / "mlp.pkb"
    shutil.copyfile(built[1][0], live)
    child = subprocess.Popen(
        [sys.executable, "-c", CALLING, str(live), ",".join(map(str, widths))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    lines: list[str] = []
    seen = threading.Condition()

    def read() -> None:
        for line in child.stdout:
            with seen:
                lines.append(line)
                seen.notify_all()
        with seen:
            lines.append("")  # the end
            seen.notify_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        with seen:  # loaded and called once
            assert seen.wait_for(lambda: bool(lines), timeout=600) and "" not in lines, child.stderr.read()
        for _ in range(5):
            for change in (zero_filled, truncated, rewritten, cut_to_100_bytes):
                shutil.copyfile(built[1][0], live)
                with seen:
                    after = len(lines)
                change(live, built)
                with seen:  # a whole call ran after the change was made
                    assert seen.wait_for(lambda: len(lines) >= after + 2 or "" in lines, timeout=600) and "" not in lines, child.stderr.read()
        child.stdin.write("stop\n")
        child.stdin.flush()
        child.wait(timeout=600)
        reader.join(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, f"the child ended with {child.returncode} (a negative status is a signal): {child.stderr.read()}"
    report = json.loads(lines[-2])
    assert report["calls"] >= 41 and report["wrong"] == [], report


@pytest.mark.parametrize("size", list(SIZES))
def test_a_file_changed_between_load_and_first_use_is_refused_or_the_file_loaded(tmp_path, library, store, size):
    """The file is opened at `load`: a bundle renamed over the path before a kernel is made does
    not change what the loaded bundle reads; one written into it is refused when it is read."""
    built, widths = library(size), SIZES[size]
    x = np.random.default_rng(3).standard_normal((BATCH, widths[0]), dtype=np.float32)
    live = tmp_path / "mlp.pkb"
    shutil.copyfile(built[1][0], live)
    loaded = portkern.load(live, store=store)
    renamed(live, built)
    np.testing.assert_allclose(loaded.kernel("mlp")(x), reference(x, widths, 1), rtol=RTOL, atol=ATOL)

    for change, error, match in [
        (rewritten, BundleChangedError, "another bundle than the one loaded"),
        (truncated, BundleTruncatedError, "truncated: the parameter section ends at byte"),
        (zero_filled, DigestMismatchError, "kernel 'mlp': parameter chunk 0 .* does not match its digest"),
    ]:
        other = tmp_path / change.__name__ / "mlp.pkb"
        other.parent.mkdir()
        shutil.copyfile(built[1][0], other)
        loaded = portkern.load(other, store=Store(CacheConfig(tmp_path / change.__name__ / "cache", 1 << 30, False)))
        change(other, built)
        with pytest.raises(error, match=match):
            loaded.kernel("mlp")


def test_a_large_bundle_is_mapped_from_one_checked_copy_that_later_loads_reuse(tmp_path, library, store, monkeypatch):
    built, widths = library("mapped"), SIZES["mapped"]
    x = np.random.default_rng(5).standard_normal((BATCH, widths[0]), dtype=np.float32)
    first = tmp_path / "a" / "mlp.pkb"
    first.parent.mkdir()
    shutil.copyfile(built[1][0], first)
    loaded = portkern.load(first, store=store)
    np.testing.assert_allclose(loaded.kernel("mlp")(x), reference(x, widths, 1), rtol=RTOL, atol=ATOL)
    folder = copy_folders(store)[1]
    copy = folder / f"{loaded.bundle.digest}.pkb"
    assert copy.read_bytes() == first.read_bytes() and not copy.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    made = copy.stat().st_ino

    # another path with the same bundle: the same copy, nothing hashed
    second = tmp_path / "b" / "mlp.pkb"
    second.parent.mkdir()
    shutil.copyfile(built[1][0], second)
    hashed: list[list[int]] = []
    verify = mapped.verify_chunks
    monkeypatch.setattr(mapped, "verify_chunks", lambda f, section, indices, where="": (hashed.append(list(indices)), verify(f, section, indices, where)))
    kernel = portkern.load(second, store=store).kernel("mlp")
    np.testing.assert_allclose(kernel(x), reference(x, widths, 1), rtol=RTOL, atol=ATOL)
    assert hashed == [] and copy.stat().st_ino == made

    # a copy changed behind portkern's back is not used: it is made again from the bundle loaded
    os.chmod(copy, 0o644)
    section = loaded.bundle.parameters
    with open(copy, "r+b") as f:
        f.seek(section.offset)
        f.write(bytes(4096))
    kernel = portkern.load(second, store=store).kernel("mlp")
    np.testing.assert_allclose(kernel(x), reference(x, widths, 1), rtol=RTOL, atol=ATOL)
    assert copy.stat().st_ino != made and copy.read_bytes() == first.read_bytes()
    assert hashed == [[i] for i in range(len(section.chunks))]  # each chunk hashed once, in the new copy

    # `portkern cache verify` keeps the copies; `clear` removes them
    assert not [finding for finding in store.verify() if "parameters" in finding.name]
    assert copy.exists()
    store.clear()
    assert not copy.exists()
    np.testing.assert_allclose(kernel(x), reference(x, widths, 1), rtol=RTOL, atol=ATOL)  # still mapped


def test_copies_not_used_for_a_week_and_partial_copies_of_gone_processes_are_removed(tmp_path, library, store):
    built = library("mapped")
    loaded = portkern.load(built[1][0], store=store)
    loaded.parameters_for(loaded.record("mlp"))
    folder = copy_folders(store)[1]
    old = folder / f"{loaded.bundle.digest}.pkb"
    before = old.stat()
    os.utime(old, ns=(before.st_atime_ns - int(UNUSED_S * 2e9), before.st_mtime_ns))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    part = folder / f".{'0' * 64}.pkb.{dead.stdout.strip()}.abcd1234.part"
    part.write_bytes(b"partial")
    mine = folder / f".{'1' * 64}.pkb.{os.getpid()}.abcd1234.part"
    mine.write_bytes(b"being written")

    other = portkern.load(built[7][0], store=store)
    other.parameters_for(other.record("mlp"))  # makes a copy: the folder is swept first
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{other.bundle.digest}.pkb", mine.name])
    assert all(record.get("path") != str(old) for _, record in store.records(mapped.RECORD_KIND))


def test_without_a_writable_cache_a_large_bundle_is_read_into_memory(tmp_path, library, caplog):
    built, widths = library("mapped"), SIZES["mapped"]
    x = np.random.default_rng(6).standard_normal((BATCH, widths[0]), dtype=np.float32)
    live = tmp_path / "mlp.pkb"
    shutil.copyfile(built[1][0], live)
    read_only = tmp_path / "ro"
    Store(CacheConfig(read_only, 1 << 30, False)).put_record("x", "y", {})  # a cache directory, then made read-only
    read_only.chmod(0o555)
    try:
        for cache in (CacheConfig(tmp_path / "off", 1 << 30, True), CacheConfig(read_only, 1 << 30, False)):
            caplog.clear()
            kernel = portkern.load(live, store=Store(cache)).kernel("mlp")
            if os.geteuid() != 0 or cache.disabled:  # root writes a read-only directory
                assert logged(caplog, r"parameters \(.* MiB\) are read into this process's memory: no cache directory is writable")
            os.truncate(live, 100)
            np.testing.assert_allclose(kernel(x), reference(x, widths, 1), rtol=RTOL, atol=ATOL)
            shutil.copyfile(built[1][0], live)
    finally:
        read_only.chmod(0o755)


def test_a_copy_is_made_once_by_processes_starting_together(tmp_path, library):
    """Two processes loading the same new bundle at once make one copy between them (the cache's
    lock), and both compute with it."""
    built, widths = library("mapped"), SIZES["mapped"]
    cache = tmp_path / "cache"
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(cache)}
    script = textwrap.dedent(
        """
        import logging, sys
        import numpy as np
        import portkern
        from portkern.examples.large_mlp import reference
        logging.getLogger("portkern.jit.parameters").addHandler(logging.StreamHandler())
        logging.getLogger("portkern.jit.parameters").setLevel(logging.DEBUG)
        widths = tuple(int(w) for w in sys.argv[2].split(","))
        x = np.random.default_rng(0).standard_normal((8, widths[0]), dtype=np.float32)
        assert np.allclose(portkern.load(sys.argv[1]).kernel("mlp")(x), reference(x, widths, 1), rtol=1e-4, atol=1e-4)
        """
    )
    children = [subprocess.Popen([sys.executable, "-c", script, str(built[1][0]), ",".join(map(str, widths))], env=env,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    logs = []
    for child in children:
        _, err = child.communicate(timeout=600)
        assert child.returncode == 0, err
        logs.append(err)
    copies = list(cache.glob("*/parameters/*"))  # no partial copy left
    assert [p.name for p in copies] == [f"{read_bundle(built[1][0]).digest}.pkb"]
    assert sorted(log.count(f"parameters copied to {copies[0]}") for log in logs) == [0, 1], logs
    made = [record for _, record in Store(from_env(cache)).records(mapped.RECORD_KIND) if record.get("path") == str(copies[0])]
    assert len(made) == 1, made  # and recorded


def test_a_named_pipe_where_the_checked_copy_lies_is_passed_over(tmp_path, library):
    """Whoever can write in the cache directory puts a named pipe where portkern keeps its checked
    copy of a large bundle: a later process does not wait on it (opening a pipe waits for a
    writer); it makes a copy of its own and computes the same numbers."""
    built, widths = library("mapped"), SIZES["mapped"]
    cache = tmp_path / "cache"
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(cache)}
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        import portkern
        from portkern.examples.large_mlp import reference
        widths = tuple(int(w) for w in sys.argv[2].split(","))
        x = np.random.default_rng(0).standard_normal((8, widths[0]), dtype=np.float32)
        assert np.allclose(portkern.load(sys.argv[1]).kernel("mlp")(x), reference(x, widths, 1), rtol=1e-4, atol=1e-4)
        """
    )
    argv = [sys.executable, "-c", script, str(built[1][0]), ",".join(map(str, widths))]
    subprocess.run(argv, env=env, check=True, timeout=600)
    (copy,) = cache.glob("*/parameters/*.pkb")
    run_past_a_pipe(copy, argv, "a load of the bundle", env)  # (the child asserts its numbers)
