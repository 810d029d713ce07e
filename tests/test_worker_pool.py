"""The worker pool hands out the largest jobs first, runs jobs on workers started ahead
(`Pool.start`), and the build host's prebuild reports every kernel and target once."""

from __future__ import annotations

import numpy as np

from portkern.jit import devices
from portkern.jit.native import compile_job
from portkern.jit.prebuild import prebuild
from portkern.jit.runtime import Executable
from portkern.jit.workers import Pool, Source
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
