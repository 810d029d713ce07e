"""The GPU drivers' host-array path (jit/gpucall.py: kept staging and device buffers, queued copies), run
through IREE's real runtime on its CPU driver, which serves the same HAL calls without a GPU: results
against NumPy across changing sizes, empty arrays, two results, and buffers not kept past the bound."""

from __future__ import annotations

import numpy as np
import pytest
from iree.compiler import compile_str

from portkern.jit import gpucall
from portkern.jit.gpucall import GpuCall
from portkern.jit.vmcall import native_runtime

SOURCE = """
func.func @f(%a: tensor<?xf32>, %b: tensor<?xf32>) -> (tensor<?xf32>, tensor<?xf32>) {
  %s = arith.addf %a, %b : tensor<?xf32>
  %m = arith.mulf %a, %b : tensor<?xf32>
  return %s, %m : tensor<?xf32>, tensor<?xf32>
}
"""


@pytest.fixture(scope="module")
def call() -> GpuCall:
    """The function loaded on IREE's local-task driver, called through `GpuCall`."""
    hal = native_runtime()
    vmfb = compile_str(SOURCE, target_backends=["llvm-cpu"], extra_args=["--iree-llvmcpu-target-cpu=generic"])
    device = hal.create_hal_driver("local-task").create_default_device()
    instance = hal.VmInstance()
    module = hal.VmModule.copy_buffer(instance, vmfb)
    context = hal.VmContext(instance, modules=[hal.create_hal_module(instance, device), module])
    return GpuCall("f", context, module.lookup_function("f"), device)


def operands(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(2)]


def assert_results(results: list[np.ndarray], a: np.ndarray, b: np.ndarray) -> None:
    assert len(results) == 2 and all(type(r) is np.ndarray and r.dtype == np.float32 for r in results)
    np.testing.assert_allclose(results[0], a + b, rtol=1e-6, atol=0)
    np.testing.assert_allclose(results[1], a * b, rtol=1e-6, atol=0)


def test_results_match_numpy_as_sizes_change_and_stay_valid_after_later_calls(call):
    calls = [(n, operands(n, seed)) for seed, n in enumerate((5, 5, 100_000, 100_000, 0, 77, 5))]
    kept = [(call(arrays), arrays) for _, arrays in calls]
    for results, (a, b) in kept:
        assert results[0].shape == a.shape
        assert_results(results, a, b)


def test_calls_beyond_the_kept_bytes_are_served_by_buffers_made_for_them(call, monkeypatch):
    monkeypatch.setattr(gpucall, "KEEP_BYTES", 1024)
    for seed in range(3):
        a, b = operands(50_000, seed)
        assert_results(call([a, b]), a, b)
