"""Cold start: ISA-level baseline code at once, the exact code built in the background and swapped in."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_example, expected_skip, prebuilt_example

import portkern
from portkern.cli.build import code_kind
from portkern.jit import background, cpu

LEVELS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")
NAME = "gemm_bias_relu"

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason=expected_skip("cpu", "x86-64 ISA levels"))


@pytest.fixture(scope="module")
def levels(tmp_path_factory):
    """A one-kernel bundle with baseline code for each x86-64 ISA level."""
    return prebuilt_example(tmp_path_factory.mktemp("levels"), "levels", [f"cpu:{level}" for level in LEVELS])


def highest_level_here() -> str:
    here = cpu.host()
    runnable = [level for level in LEVELS if cpu.can_run(cpu.resolve(level), here)]
    if not runnable:
        pytest.skip(expected_skip("cpu", f"this host runs none of {LEVELS}"))
    return runnable[-1]


def check(kernel, seed: int) -> None:
    assert_example(kernel, np.random.default_rng(seed))


def test_the_highest_isa_level_this_cpu_has_serves_at_once_then_the_exact_code(levels, store):
    kernel = portkern.load(levels, store=store).kernel(NAME)
    assert kernel.origin == "baseline" and kernel.native.built_for == f"cpu:{highest_level_here()}"
    check(kernel, 0)
    assert kernel.wait()
    assert kernel.origin == "finalized" and kernel.native.built_for == cpu.host(store).label
    check(kernel, 1)
    assert portkern.load(levels, store=store).kernel(NAME).origin == "cache"  # the cache kept the exact code
    listed = {e.device_label: code_kind(e.device, e.config) for e in store.entries()}  # as `cache ls` says
    assert listed == {f"cpu:{highest_level_here()}": "baseline", cpu.host(store).label: "finalized"}


def test_a_baseline_whose_features_this_cpu_lacks_is_never_used(levels, store, monkeypatch):
    """A host fingerprint without the x86-64-v2 features (plain x86-64): no level's code may run
    on it, so the kernel is finalised for it, before `kernel()` returns."""
    plain = cpu.resolve("x86-64", store)
    assert not any(cpu.can_run(cpu.resolve(level, store), plain) for level in LEVELS)
    monkeypatch.setattr(cpu, "host", lambda store=None: plain)
    kernel = portkern.load(levels, store=store).kernel(NAME)
    assert kernel.origin == "finalized" and kernel.native.built_for == plain.label
    assert kernel.specialisation is None and kernel.wait(0)
    check(kernel, 2)


def test_background_off_finalises_before_kernel_returns(levels, store, monkeypatch):
    monkeypatch.setenv(background.ENV, "0")
    kernel = portkern.load(levels, store=store).kernel(NAME)
    assert kernel.origin == "finalized" and kernel.native.built_for == cpu.host(store).label
    assert kernel.specialisation is None
    check(kernel, 3)


def test_the_swap_under_concurrent_calls_keeps_every_result_correct(levels, store):
    kernel = portkern.load(levels, store=store).kernel(NAME)
    assert kernel.origin == "baseline"
    problems: list[str] = []
    origins: list[set[str]] = []

    def caller(seed: int) -> None:
        seen, extra = set(), 3
        rng = np.random.default_rng(seed)
        try:
            while extra > 0:  # until three calls after the swap
                seen.add(kernel.origin)
                assert_example(kernel, rng)
                if kernel.specialisation.done:
                    extra -= 1
        except Exception as exc:  # reported, and the test fails on it
            problems.append(f"{type(exc).__name__}: {exc}")
        origins.append(seen)

    threads = [threading.Thread(target=caller, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert problems == [] and len(origins) == 4
    assert kernel.wait() and kernel.origin == "finalized"
    assert any(seen == {"baseline", "finalized"} for seen in origins), origins


def test_a_forked_child_keeps_the_baseline_and_does_not_wait(levels, store):
    kernel = portkern.load(levels, store=store).kernel(NAME)
    assert kernel.origin == "baseline"
    pid = os.fork()
    if pid == 0:  # the child: the parent's background job is not here
        code = 1
        try:
            check(kernel, 4)
            code = 0 if (kernel.wait(0.5) is False and kernel.origin == "baseline") else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert kernel.wait() and kernel.origin == "finalized"


EXIT_PENDING = textwrap.dedent(
    """
    import sys, time
    import portkern
    from portkern.cache.config import CacheConfig
    from portkern.cache.store import Store
    from pathlib import Path
    from portkern.jit.workers import shared_pool
    import numpy as np
    from portkern.examples.reference import EXAMPLES
    kernel = portkern.load(sys.argv[1], store=Store(CacheConfig(Path(sys.argv[2]), 1 << 30, False))).kernel("gemm_bias_relu")
    example = EXAMPLES["gemm_bias_relu"]
    inputs = example.inputs(np.random.default_rng(0))
    np.testing.assert_allclose(kernel(*inputs), example.reference(*inputs)[0], example.rtol, example.atol)
    pool = shared_pool()  # the specialisation's: a bundle's compiles run on the process's pool
    for _ in range(6000):
        if pool.pids or kernel.specialisation.done:
            break
        time.sleep(0.01)
    print(kernel.origin, *pool.pids, flush=True)
    """
)


def test_exit_with_a_pending_specialisation_leaves_no_worker(levels, tmp_path):
    done = subprocess.run([sys.executable, "-c", EXIT_PENDING, str(levels), str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    origin, *pids = done.stdout.split()
    assert origin == "baseline" and pids, done.stdout  # it exited while its worker compiled
    for pid in map(int, pids):
        deadline = time.monotonic() + 60  # a bound on a hang, not a timing judgement
        while _alive(pid):  # killed by the exiting process; reaped by it or by init
            if time.monotonic() > deadline:
                pytest.fail(f"worker {pid} outlived the process that started it")
            time.sleep(0.01)


def _alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_tune_on_a_cold_device_serves_the_baseline_and_tunes_in_the_background(levels, store):
    kernel = portkern.load(levels, store=store).kernel(NAME, tune="quick")
    assert kernel.origin == "baseline" and kernel.tuning is None
    check(kernel, 5)
    assert kernel.wait(), kernel.specialisation.error
    assert kernel.tuning is not None and kernel.native.built_for == cpu.host(store).label
    assert kernel.origin == ("tuned" if kernel.tuning.source == "search" else "finalized")
    assert kernel.config == kernel.tuning.config
    check(kernel, 6)
    again = portkern.load(levels, store=store).kernel(NAME, tune="quick")  # the device is warm now: no baseline
    assert again.specialisation is None and again.config == kernel.config
