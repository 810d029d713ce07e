"""The worker pool hands out the largest jobs first, runs jobs on workers started ahead
(`Pool.start`), compiles the same code whether a job runs on the compiler's threads or on
one thread, and the build host's prebuild reports every kernel and target once."""

from __future__ import annotations

import os

import numpy as np

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.jit import devices
from portkern.jit.native import compile_job
from portkern.jit.prebuild import prebuild
from portkern.jit.runtime import Executable
from portkern.jit.workers import Pool, Source, compiler_threads, cores
from portkern.portable.builder import build_file

ADD = """func.func @{name}(%a: tensor<{n}xf32>, %b: tensor<{n}xf32>) -> tensor<{n}xf32> {{
  %s = arith.addf %a, %b : tensor<{n}xf32>
  return %s : tensor<{n}xf32>
}}
"""
#: A longer module: the sum, scaled and added again.
ADD_MUL = """func.func @{name}(%a: tensor<{n}xf32>, %b: tensor<{n}xf32>) -> tensor<{n}xf32> {{
  %s = arith.addf %a, %b : tensor<{n}xf32>
  %p = arith.mulf %s, %a : tensor<{n}xf32>
  %q = arith.addf %p, %b : tensor<{n}xf32>
  %r = arith.mulf %q, %s : tensor<{n}xf32>
  return %r : tensor<{n}xf32>
}}
"""


def test_started_workers_take_the_largest_jobs_first():
    target = devices.resolve("cpu")
    texts = [ADD.format(name="k0", n=4), ADD_MUL.format(name="k1", n=4), ADD.format(name="k2", n=8)]
    jobs = [compile_job(i, f"k{i}", target, Source(f"k{i}", text.encode(), "start")) for i, text in enumerate(texts)]
    assert jobs[1].size > jobs[0].size == jobs[2].size
    order: list[int] = []
    with Pool(workers=1) as pool:
        pool.start(wait_ready=True)
        assert len(pool.pids) == 1 and pool.spawned == 1
        started = pool.pids
        results = pool.run(jobs, on_start=lambda job, pid: order.append(job.id))
        assert pool.spawned == 1 and pool.pids == started  # the worker started ahead ran every job
    assert order == [1, 0, 2]  # the largest first, then equal sizes in the order given
    a, b = np.arange(4, dtype=np.float32), np.full(4, 2.0, dtype=np.float32)
    references = {0: a + b, 1: ((a + b) * a + b) * (a + b)}
    for index, reference in references.items():
        result = results[index]
        assert result.ok, result.error
        assert 0 < result.job_s <= result.wall_s
        np.testing.assert_allclose(Executable(result.data["native"], f"k{index}")(a, b)[0], reference, rtol=1e-6)


def test_prebuild_reports_each_kernel_and_target_once(tmp_path):
    (tmp_path / "small.mlir").write_text(ADD.format(name="small", n=4))
    (tmp_path / "large.mlir").write_text(ADD_MUL.format(name="large", n=4))
    (tmp_path / "manifest.yaml").write_text(
        "bundle: two\nkernels:\n  - name: small\n    source: small.mlir\n  - name: large\n    source: large.mlir\n"
    )
    bundle = build_file(tmp_path / "manifest.yaml", tmp_path / "two.pkb")
    target = devices.resolve("cpu:x86-64-v2")
    reported: list[tuple[str, str]] = []
    with Pool(workers=1) as pool:
        done = prebuild(bundle, [target], lambda record, t: reported.append((record.name, t.label)), pool=pool)
    assert not done.failures
    assert sorted(reported) == [("large", target.label), ("small", target.label)]
    assert {record.name: [n.target for n in record.native] for record in done.bundle.kernels} == {
        "small": [target.label], "large": [target.label],
    }


def test_a_job_beside_others_compiles_on_one_thread_to_the_same_code(examples_bundle, tmp_path):
    """Jobs that fill the cores run the compiler on one thread each, a job alone may use its
    threads, and the code is the same byte for byte: alone, two at once, and pinned to one core."""
    assert compiler_threads(1) == (cores() >= 2)
    assert not compiler_threads(cores())
    kernels = ["mlp", "gemm_glu", "gemm_rowsum"]  # the ONNX MLP has the most dispatches

    def code(workers: int, run: str) -> dict[str, bytes]:
        with Pool(workers=workers) as pool:
            store = Store(CacheConfig(tmp_path / run, 1 << 30, False))
            prepared = portkern.load(examples_bundle, store=store, pool=pool).prepare("cpu", kernels, workers=workers)
        assert all(native.origin == "finalized" for native in prepared.values()), prepared
        return {name: native.data for name, native in prepared.items()}

    alone = code(1, "alone")  # one at a time: on the compiler's threads where there is a second core
    assert code(2, "two") == alone  # two at once: on one thread each where two fill the cores
    if hasattr(os, "sched_setaffinity"):  # Linux
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(allowed)})  # the workers started now run on one core: one thread each
        try:
            assert not compiler_threads(1)
            pinned = code(1, "pinned")
        finally:
            os.sched_setaffinity(0, allowed)
        assert pinned == alone
