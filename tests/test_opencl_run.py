"""OpenCL kernels on this machine's OpenCL device (PoCL here): finalise, cache, run, check against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_matches, cli_json, expected_skip, logged, opencl_device_missing, opencl_toolchain_missing

import portkern
from portkern.base.errors import ArgumentShapeError, ArgumentTypeError, DeviceError, TuningError
from portkern.examples import OPENCL_MANIFEST
from portkern.examples.reference import EXAMPLES
from portkern.jit import opencl
from portkern.portable.builder import build_file
from portkern.portable.manifest import load_manifest

pytestmark = [
    pytest.mark.skipif(bool(opencl_toolchain_missing()), reason=opencl_toolchain_missing() or "-"),
    pytest.mark.skipif(bool(opencl_device_missing()), reason=opencl_device_missing() or "-"),
]
NAMES = [k.name for k in load_manifest(OPENCL_MANIFEST).kernels]


@pytest.fixture(scope="module")
def loaded(opencl_examples_bundle, tmp_path_factory):
    """The OpenCL examples opened with a cache shared by this module's tests."""
    from portkern.cache.config import CacheConfig
    from portkern.cache.store import Store

    store = Store(CacheConfig(tmp_path_factory.mktemp("opencl-cache"), 1 << 30, False))
    return portkern.load(opencl_examples_bundle, store=store)


def on_pocl() -> bool:
    return opencl.select(None).fingerprint.property("platform") == "Portable Computing Language"


@pytest.mark.parametrize("name", NAMES)
def test_example_matches_numpy_finalised_then_from_cache(opencl_examples_bundle, store, rng, name):
    example = EXAMPLES[name]
    cold = portkern.load(opencl_examples_bundle, store=store).kernel(name, device="opencl")
    warm = portkern.load(opencl_examples_bundle, store=store).kernel(name, device="opencl")
    assert (cold.origin, warm.origin) == ("finalized", "cache")
    assert cold.device.startswith("opencl:") and cold.native.data == warm.native.data
    for kernel in (cold, warm):
        for _ in range(2):  # two input draws: a kernel cannot pass by luck on one
            inputs = example.inputs(rng)
            assert_matches(kernel(*inputs), example.reference(*inputs), example.rtol, example.atol)


@pytest.mark.parametrize("name", ["matmul_tiled", "softmax_rows"])
def test_tolerances_would_catch_wrong_results(loaded, rng, name):
    example = EXAMPLES[name]
    inputs = example.inputs(rng)
    with pytest.raises(AssertionError):
        assert_matches(loaded.kernel(name, device="opencl")(*inputs) * (1 + 20 * example.rtol), example.reference(*inputs), example.rtol, example.atol)


def test_cache_entry_is_the_native_program_binary(loaded):
    kernel = loaded.kernel("vadd", device="opencl")
    (entry,) = [e for e in loaded.store.entries() if e.kernel == "vadd"]
    assert entry.format == "opencl-binary" and entry.device_label == kernel.device and "local=64" in entry.flags
    if on_pocl():
        # Compiled code for both of PoCL's work-group functions (small and wide grids) is in
        # the binary, so a warm start compiles nothing whatever the call's size.
        assert entry.flags[:3] == ["-x", "spir", "-spir-std=1.2"]
        assert b"/vadd/64-1-1-goffs0-smallgrid/vadd.so" in kernel.native.data
        assert b"/vadd/64-1-1-goffs0/vadd.so" in kernel.native.data


def test_binary_that_does_not_load_is_rebuilt(opencl_examples_bundle, store, rng, caplog):
    bundle = portkern.load(opencl_examples_bundle, store=store)
    native = bundle.kernel("vadd", device="opencl").native
    (entry,) = store.entries()
    store.put(native.key, b"not a program binary", entry)
    rebuilt = bundle.kernel("vadd", device="opencl")
    assert logged(caplog, "cached native code for 'vadd' on opencl:.* does not load")
    assert rebuilt.origin == "finalized" and bundle.kernel("vadd", device="opencl").origin == "cache"
    inputs = EXAMPLES["vadd"].inputs(rng)
    assert_matches(rebuilt(*inputs), EXAMPLES["vadd"].reference(*inputs), 0.0, 0.0)


def test_exported_binary_gives_a_warm_start_on_another_cache(loaded, opencl_examples_bundle, store, tmp_path, rng):
    from portkern.cache import transfer

    key = loaded.kernel("softmax_rows", device="opencl").native.key
    assert transfer.export(loaded.store, tmp_path / "fleet.pkx", keys=[key]).entries == 1
    assert transfer.import_(store, tmp_path / "fleet.pkx", allow_unsigned=True).entries == 1
    warm = portkern.load(opencl_examples_bundle, store=store).kernel("softmax_rows", device="opencl")
    assert warm.origin == "cache" and warm.native.key == key
    inputs = EXAMPLES["softmax_rows"].inputs(rng)
    assert_matches(warm(*inputs), EXAMPLES["softmax_rows"].reference(*inputs), EXAMPLES["softmax_rows"].rtol, EXAMPLES["softmax_rows"].atol)


def test_bad_calls_fail_before_anything_runs(loaded):
    mm = loaded.kernel("matmul_tiled", device="opencl")
    a, b = np.ones((20, 8), np.float32), np.ones((8, 33), np.float32)
    with pytest.raises(ArgumentShapeError, match=r"matmul_tiled\(\) argument 1 \(B\) must have shape KxN, got 9x33 \(K=8, M=20, N=33\)"):
        mm(a, np.ones((9, 33), np.float32))
    with pytest.raises(ArgumentTypeError, match=r"argument 1 must have dtype float32, got float64"):
        mm(a, b.astype(np.float64))
    with pytest.raises(ArgumentTypeError, match=r"matmul_tiled\(\) takes 2 arguments"):
        mm(a)
    with pytest.raises(ArgumentShapeError, match=r"argument 0 must have shape \?x\?, got 160"):
        mm(a.ravel(), b)
    np.testing.assert_array_equal(mm(a, b), np.full((20, 33), 8, np.float32))


def test_empty_inputs_give_empty_results(loaded):
    empty = np.zeros(0, np.float32)
    out = loaded.kernel("vadd", device="opencl")(empty, empty)
    assert out.shape == (0,) and out.dtype == np.float32


def test_kernel_and_device_kinds_must_agree(loaded, examples_bundle):
    with pytest.raises(DeviceError, match=r"'vadd' \(opencl kernel\) runs on an OpenCL device \(device='opencl'\), not on cpu:"):
        loaded.kernel("vadd", device="cpu")
    with pytest.raises(DeviceError, match=r"'gemm_glu' \(mlir kernel\) runs on an IREE device such as 'cpu', not on opencl:"):
        portkern.load(examples_bundle).kernel("gemm_glu", device="opencl")
    with pytest.raises(TuningError, match="runs with its manifest's launch sizes; it is not tuned"):
        loaded.kernel("vadd", device="opencl", tune="quick")


AXPY = """__kernel void axpy(__global float *y, __global const float *x, const float alpha, const int n) {
  const int i = get_global_id(0);
  if (i < n) y[i] += alpha * x[i];
}
"""
AXPY_MANIFEST = """bundle: axpy
kernels:
  - name: axpy
    source: axpy.cl
    args:
      - {name: y, dtype: float32, role: inout, shape: [n]}
      - {name: x, dtype: float32, role: in, shape: [n]}
      - {name: alpha, dtype: float32}
      - {name: n, dtype: int32, value: n}
    global: [n]
    requires: ["n >= 2"]
"""


def test_inout_buffer_caller_scalar_and_driver_chosen_local_size(tmp_path, store, rng):
    (tmp_path / "axpy.cl").write_text(AXPY)
    (tmp_path / "m.yaml").write_text(AXPY_MANIFEST)
    build_file(tmp_path / "m.yaml", tmp_path / "axpy.pkb")
    axpy = portkern.load(tmp_path / "axpy.pkb", store=store).kernel("axpy", device="opencl")
    y, x = rng.standard_normal(1001).astype(np.float32), rng.standard_normal(1001).astype(np.float32)
    before = y.copy()
    out = axpy(y, x, np.float32(2.5))
    np.testing.assert_allclose(out, before + np.float32(2.5) * x, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y, before)  # the caller's array is not written
    with pytest.raises(ArgumentShapeError, match=r"axpy\(\) arguments break `n >= 2` \(n=1\)"):
        axpy(y[:1], x[:1], np.float32(1))
    with pytest.raises(ArgumentTypeError, match=r"argument 2 must be a numpy array of float32, got float \(pass a scalar as a NumPy scalar: np.float32\(2.5\)\)"):
        axpy(y, x, 2.5)


SUBGROUPS = """__kernel void vadd(__global const float *a, __global const float *b, __global float *c, const int n) {
  const int i = get_global_id(0);
  if (i < n) c[i] = a[i] + b[i] + (float)(get_sub_group_size() - PORTKERN_SUBGROUP_SIZE);
}
"""


@pytest.mark.parametrize("variants", [True, False])
def test_device_without_subgroups_refuses_subgroup_kernels_clearly(tmp_path, store, variants):
    if opencl.select(None).fingerprint.property("subgroups") == "1":
        pytest.skip(expected_skip("device", "this OpenCL device has sub-groups"))
    source = SUBGROUPS if variants else SUBGROUPS.replace("PORTKERN_SUBGROUP_SIZE", "32")
    (tmp_path / "sg.cl").write_text(source)
    extra = "    variants:\n      - {subgroup_size: 32}\n      - {subgroup_size: 64}\n" if variants else ""
    (tmp_path / "m.yaml").write_text(
        "bundle: sg\nkernels:\n  - name: vadd\n    source: sg.cl\n    args:\n"
        "      - {name: a, dtype: float32, role: in, shape: [n]}\n      - {name: b, dtype: float32, role: in, shape: [n]}\n"
        "      - {name: c, dtype: float32, role: out, shape: [n]}\n      - {name: n, dtype: int32, value: n}\n"
        "    global: [n]\n    local: [64]\n" + extra
    )
    build_file(tmp_path / "m.yaml", tmp_path / "sg.pkb")
    message = r"built for sub-group sizes 32, 64; opencl:.* has no known sub-group size" if variants else r"uses sub-groups, which opencl:.* does not support"
    with pytest.raises(DeviceError, match=message):
        portkern.load(tmp_path / "sg.pkb", store=store).kernel("vadd", device="opencl")


def test_cli_devices_run_and_inspect(opencl_examples_bundle, tmp_path, capsys, rng):
    status, report = cli_json(capsys, "devices")
    assert status == 0
    found = next(p for p in report if p["kind"] == "opencl")
    device = found["devices"][0]
    assert found["found"] and device["label"].startswith("opencl:") and len(device["fingerprint"]) == 64
    assert {"platform", "driver_version", "device_version", "il_versions", "spir"} <= set(device["properties"])

    inputs = EXAMPLES["vadd"].inputs(rng)
    paths = [tmp_path / "a.npy", tmp_path / "b.npy"]
    for path, array in zip(paths, inputs):
        np.save(path, array)
    status, report = cli_json(capsys, "run", opencl_examples_bundle, "vadd", "--device", "opencl", "--inputs", *paths,
                              "--out", tmp_path / "out.npz", "--cache-dir", tmp_path / "cache")
    assert status == 0
    assert report["device"] == device["label"] and report["origin"] == "finalized"
    with np.load(tmp_path / "out.npz") as saved:
        np.testing.assert_array_equal(saved["result0"], inputs[0] + inputs[1])

    status, report = cli_json(capsys, "inspect", opencl_examples_bundle)
    assert status == 0
    shown = {k["name"]: k for k in report["kernels"]}
    assert shown["vadd"]["launch"]["global"] == ["round_up(n, 64)"]
    assert shown["vadd"]["launch"]["variants"] == [{"subgroup_size": None, "local": [64], "stages": [0, 1]}]
