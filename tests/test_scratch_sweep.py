"""Scratch directories of a killed process (an ONNX `prepare`'s model and bundle) are removed by
the next `portkern cache verify`; those of a live process are kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from helpers import dense_onnx


def verify(tmp_path) -> tuple[int, list[str]]:
    """`portkern cache verify --json` with the temporary directory at `tmp_path`: its exit status
    and the scratch directories it reports removed."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PORTKERN_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(["nice", "-n", "10", sys.executable, "-m", "portkern", "cache", "verify", "--json"],
                          env=env, capture_output=True, text=True, timeout=300)
    found = json.loads(done.stdout)["found"]
    return done.returncode, sorted(f["name"] for f in found if f["kind"] == "scratch" and f["fixed"])


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(timeout=60)
    return process.pid


def test_verify_removes_the_onnx_scratch_of_a_dead_process_and_keeps_a_live_ones(tmp_path):
    dead = tmp_path / f"portkern-onnx-{dead_pid()}-abc123"
    (dead / "nested").mkdir(parents=True)
    (dead / "model.onnx").write_bytes(dense_onnx())
    (dead / "nested" / "model.pkb").write_bytes(b"bundle")
    live = tmp_path / f"portkern-onnx-{os.getpid()}-def456"
    live.mkdir()
    (live / "model.onnx").write_bytes(dense_onnx())
    status, removed = verify(tmp_path)
    assert (status, removed) == (1, [str(dead)])  # something was found (and fixed): exit 1
    assert not dead.exists()
    assert (live / "model.onnx").read_bytes() == dense_onnx()
    assert verify(tmp_path) == (0, [])


def test_a_sigkilled_prepare_leaves_nothing_after_the_next_verify(tmp_path):
    model = tmp_path / "dense.onnx"
    model.write_bytes(dense_onnx())
    env = {**os.environ, "TMPDIR": str(tmp_path), "PORTKERN_CACHE_DIR": str(tmp_path / "cache")}
    code = "import sys, onnx, portkern.onnx; portkern.onnx.prepare(onnx.load(sys.argv[1]))"
    process = subprocess.Popen(["nice", "-n", "10", sys.executable, "-c", code, str(model)], env=env)
    try:
        deadline = time.monotonic() + 300  # a bound on a hang, not a timing judgement
        while not list(tmp_path.glob(f"portkern-onnx-{process.pid}-*")):
            assert process.poll() is None, "prepare ended before it made its scratch directory"
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    left = list(tmp_path.glob(f"portkern-*-{process.pid}-*"))
    assert left  # what the killed process left behind
    status, removed = verify(tmp_path)
    assert status == 1 and set(map(str, left)) <= set(removed)
    assert not [p for p in tmp_path.glob(f"portkern-*-{process.pid}-*")]
