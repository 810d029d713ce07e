"""Every process exits promptly: with a background build pending, and with daemon threads calling kernels.

Each scenario runs as a fresh process on an empty cache (or, where said, a warm one), several
times, while another process keeps a core busy. A hang never ends, so the bound on each run (`HANG_S`) only has
to be finite: it detects a hang, it does not judge speed.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import expected_skip, prebuilt_example

import portkern
from portkern.examples.reference import EXAMPLES

LEVELS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")
NAME = "gemm_bias_relu"
#: Runs of each scenario.
RUNS = 5
#: A run still going after this long has hung.
HANG_S = 60
SEED = 7

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason=expected_skip("cpu", "x86-64 ISA levels"))

SCRIPT = textwrap.dedent(
    """
    import atexit, sys, threading, time
    import numpy as np
    import portkern
    from portkern.base.errors import PortkernError
    from portkern.examples.reference import EXAMPLES
    from portkern.jit.workers import shared_pool

    mode, bundle, out = sys.argv[1:4]
    example = EXAMPLES["gemm_bias_relu"]
    inputs = example.inputs(np.random.default_rng(int(sys.argv[4])))

    def late():  # an exit handler registered before portkern's: it runs after them
        try:
            kernel(*inputs)
            print("late: ran", flush=True)
        except PortkernError as exc:
            print("late:", type(exc).__name__, flush=True)

    if mode == "late":
        atexit.register(late)
    kernel = portkern.load(bundle).kernel("gemm_bias_relu")
    print("origin:", kernel.origin, flush=True)
    if mode in ("call", "late"):  # call, then exit at once
        np.save(out, kernel(*inputs))
    elif mode == "started":  # call, then exit once the background build has a worker
        np.save(out, kernel(*inputs))
        for _ in range(2000):
            if shared_pool().pids or kernel.specialisation.done:
                break
            time.sleep(0.01)
        print("workers:", *shared_pool().pids, flush=True)  # workers this process must not leave behind
    elif mode == "threads":  # daemon threads calling in a loop while the main thread exits
        results, called = [], threading.Barrier(5)

        def caller():
            try:
                results.append(kernel(*inputs))
                called.wait()
                while True:
                    kernel(*inputs)
            except PortkernError:
                pass

        for _ in range(4):
            threading.Thread(target=caller, daemon=True).start()
        called.wait()
        np.save(out, results[0])
    """
)


@pytest.fixture(scope="module")
def levels(tmp_path_factory):
    """A one-kernel bundle with baseline code for each x86-64 ISA level."""
    return prebuilt_example(tmp_path_factory.mktemp("exit-levels"), "levels", [f"cpu:{level}" for level in LEVELS], NAME)


@pytest.fixture(scope="module")
def busy():
    """Another process keeping a core busy while the scenarios run."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield
    spinner.kill()
    spinner.wait()


def run_scenario(
    mode: str, levels, tmp_path, monkeypatch, origin: str = "baseline", cache: Path | None = None, runs: int = RUNS
) -> list[dict[str, str]]:
    """Run the scenario `runs` times, each in a fresh process on an empty cache (or on `cache`):
    each run exits with status 0 within `HANG_S`, was served code of `origin`, left no worker
    process alive, and (when it called the kernel) saved a result that matches NumPy. What
    each run printed, by label."""
    example = EXAMPLES[NAME]
    inputs = example.inputs(np.random.default_rng(SEED))
    (want,) = example.reference(*inputs)
    printed_by_run = []
    for run in range(runs):
        monkeypatch.setenv("PORTKERN_CACHE_DIR", str(cache or tmp_path / f"cache-{run}"))
        out = tmp_path / f"out-{run}.npy"
        try:
            done = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(levels), str(out), str(SEED)],
                                  capture_output=True, text=True, timeout=HANG_S)
        except subprocess.TimeoutExpired as exc:
            done = exc
        if isinstance(done, subprocess.TimeoutExpired):
            pytest.fail(f"run {run} of {mode!r} did not exit within {HANG_S} s (stdout: {done.stdout!r})")
        assert done.returncode == 0, f"run {run} of {mode!r}: exit status {done.returncode}\n{done.stderr[-3000:]}"
        assert "terminate called" not in done.stderr, done.stderr[-3000:]
        if mode != "threads":  # an abandoned build keeps no runtime object alive (the callers' own threads do)
            assert "leaked" not in done.stderr, done.stderr[:3000]
        printed = dict(line.partition(": ")[::2] for line in done.stdout.splitlines())
        assert printed.get("origin") == origin, done.stdout
        alive = [pid for pid in printed.get("workers", "").split() if _alive(int(pid))]
        assert not alive, f"run {run} of {mode!r} left its workers {alive} alive"
        if mode != "origin":
            np.testing.assert_allclose(np.load(out), want, rtol=example.rtol, atol=example.atol)
        printed_by_run.append(printed)
    return printed_by_run


def test_a_fresh_process_served_baseline_code_exits(levels, busy, tmp_path, monkeypatch):
    run_scenario("origin", levels, tmp_path, monkeypatch)


def test_a_process_that_called_the_kernel_exits_with_its_background_build_pending(levels, busy, tmp_path, monkeypatch):
    run_scenario("call", levels, tmp_path, monkeypatch)


def test_a_process_exits_while_its_background_build_runs_on_a_worker(levels, busy, tmp_path, monkeypatch):
    run_scenario("started", levels, tmp_path, monkeypatch)


def test_daemon_threads_calling_at_exit_neither_hang_nor_abort_the_process(levels, busy, tmp_path, monkeypatch):
    run_scenario("threads", levels, tmp_path, monkeypatch)


def test_daemon_threads_calling_cached_code_at_exit_do_not_abort_the_process(levels, busy, tmp_path, monkeypatch):
    """No background build at all (the exact code is cached): only the calls in flight at exit."""
    cache = tmp_path / "warm"
    monkeypatch.setenv("PORTKERN_CACHE_DIR", str(cache))
    outcome = portkern.load(levels).prepare(kernels=[NAME])
    assert not isinstance(outcome[NAME], Exception), outcome
    run_scenario("threads", levels, tmp_path, monkeypatch, origin="cache", cache=cache)


def test_a_call_after_the_runtime_closed_at_exit_is_refused_with_a_typed_error(levels, tmp_path, monkeypatch):
    """A call made by an exit handler that runs after portkern's: refused (`ExitingError`), not run
    on a runtime about to be torn down."""
    (printed,) = run_scenario("late", levels, tmp_path, monkeypatch, runs=1)
    assert printed["late"] == "ExitingError"


def _alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
