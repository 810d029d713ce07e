"""The compile pool survives candidates that fail, crash or hang; the rest still compile."""

from __future__ import annotations

import os
import signal

import pytest

from portkern.jit import cpu
from portkern.portable.bundle import read_bundle
from portkern.tuner.pool import CompilePool, Job, Source

GOOD = "0=cpu:v1:64x64x0,8x32x0,0x0x4"
#: Distribution tiles only: the vector ops cover whole 64x512 slices, which LLVMCPU refuses.
TOO_LARGE = "0=cpu:v1:64x64x0,0x0x0,0x0x0"


@pytest.fixture(scope="module")
def source(examples_bundle) -> Source:
    bundle = read_bundle(examples_bundle)
    record = bundle.kernel("gemm_bias_relu")
    stage = record.stage("any")
    return Source(stage.blob, bundle.blob(stage.blob), stage.phase, record.name)


@pytest.fixture(scope="module")
def flags() -> tuple[str, ...]:
    return cpu.flags(cpu.host())


def test_errors_and_crashes_do_not_stop_the_others(source, flags):
    configs = ["default", TOO_LARGE, GOOD, GOOD.replace("x0x4", "x0x1"), "0=cpu:v1:128x128x0,8x32x0,0x0x4"]
    jobs = [Job(i, source, c) for i, c in enumerate(configs)]

    def crash_job_3(job, pid):
        if job.id == 3:
            os.kill(pid, signal.SIGKILL)

    with CompilePool(flags, workers=2) as pool:
        results = pool.run(jobs, on_start=crash_job_3)
        assert [results[i].status for i in range(len(jobs))] == ["ok", "error", "ok", "crash", "ok"]
        assert "large vector sizes" in results[1].error
        assert "exit code -9" in results[3].error
        assert results[0].vmfb != results[2].vmfb
        assert all(results[i].compile_s > 0 and results[i].stamp_s >= 0 for i in (0, 2, 4))
        assert pool.spawned == 3  # two workers and the crashed one's replacement


def test_a_hung_compile_times_out_and_the_pool_carries_on(source, flags):
    with CompilePool(flags, workers=1, timeout_s=0.05) as pool:
        timed_out = pool.run([Job(0, source, GOOD)])[0]
        assert timed_out.status == "timeout" and "timeout after 0.05 s" in timed_out.error
        pool.timeout_s = 120
        assert pool.run([Job(1, source, GOOD)])[1].ok
        assert pool.spawned == 2


def test_config_strings_are_checked_in_the_worker(source, flags):
    with CompilePool(flags, workers=1) as pool:
        results = pool.run([Job(0, source, "0=amdgpu:v1:64x128x0,2x4x0,0x0x16,none,256x1x1,64,2,0"), Job(1, source, "junk")])
    assert results[0].status == "error" and "needs a cpu config" in results[0].error
    assert results[1].status == "error" and "dispatch index" in results[1].error
