"""OpenCL kernels with a parameter space: built once into one bundle, tuned on this machine's OpenCL
device (PoCL here), the winner checked against NumPy, cached per device and reused without timing."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import yaml
from helpers import cli_json, opencl_device_missing, opencl_toolchain_missing

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.portable import opencl as cl_build
from portkern.portable.builder import build_file
from portkern.portable.bundle import read_bundle
from portkern.portable.launch import launch_of
from portkern.portable.opencl import BuildWarning
from portkern.tuner import evaluate

pytestmark = pytest.mark.skipif(bool(opencl_toolchain_missing()), reason=opencl_toolchain_missing() or "-")
needs_device = pytest.mark.skipif(bool(opencl_device_missing()), reason=opencl_device_missing() or "-")

# y = 2x, W elements per work-item; BAD=1 computes something else; (W=4, L=32) does not compile.
SCALE = """
#if W == 4 && L == 32
#error "this point does not build"
#endif
__kernel void scale(__global const float *x, __global float *y, const int n) {
  const int i = get_global_id(0) * W;
  for (int k = 0; k < W; ++k) y[i + k] = x[i + k] * 2.0f + (BAD ? 1.0f : 0.0f);
}
"""
SCALE_ENTRY = {
    "name": "scale",
    "source": "scale.cl",
    "args": [
        {"name": "x", "dtype": "float32", "role": "in", "shape": ["n"]},
        {"name": "y", "dtype": "float32", "role": "out", "shape": ["n"]},
        {"name": "n", "dtype": "int32", "value": "n"},
    ],
    "global": ["n // W"],
    "local": ["L"],
    "requires": ["n % 256 == 0"],
    "defines": {"W": 1, "L": 16, "BAD": 0},
    # L=8192 is more than PoCL's work-group limit (4096): built, refused on the device
    "tune": {"params": {"W": [1, 2, 4], "L": [16, 32, 8192], "BAD": [0, 1]}, "at": {"n": 16384}},
}

# A tiled matmul whose -O2 build llvm-spirv-15 turns into SPIR-V that spirv-val rejects
# ("Block ... appears in the binary before its dominator") at these block and tile sizes.
TILED = """
__kernel void tiled(__global float *C, __global const float *A, __global const float *B, const int WIDTH) {
  __local float sA[BY * TY][BX];
  __local float sB[BY * TY][BX * TX];
  int tx = get_local_id(0), ty = get_local_id(1);
  int x = get_group_id(0) * BX * TX + tx, y = get_group_id(1) * BY * TY + ty;
  float sum[TY][TX];
  for (int i = 0; i < TY; i++)
    for (int j = 0; j < TX; j++) sum[i][j] = 0.0f;
  for (int k = 0; k < WIDTH; k += BX) {
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < TY; i++) {
      sA[ty + BY * i][tx] = A[(y + i * BY) * WIDTH + k + tx];
      for (int j = 0; j < TX; j++) sB[ty + BY * i][tx + j * BX] = B[(k + ty + BY * i) * WIDTH + x + j * BX];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kb = 0; kb < BX; kb++)
      for (int i = 0; i < TY; i++)
        for (int j = 0; j < TX; j++) sum[i][j] += sA[ty + BY * i][kb] * sB[kb][tx + j * BX];
  }
  for (int i = 0; i < TY; i++)
    for (int j = 0; j < TX; j++) C[(y + i * BY) * WIDTH + x + j * BX] = sum[i][j];
}
"""
TILED_DEFINES = {"BX": 16, "BY": 2, "TX": 8, "TY": 8}


def _bundle(where, *entries, sources: dict[str, str]):
    for name, text in sources.items():
        (where / name).write_text(text)
    (where / "m.yaml").write_text(yaml.safe_dump({"bundle": "space", "kernels": list(entries)}, sort_keys=False))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_file(where / "m.yaml", where / "space.pkb")
    return where / "space.pkb", [str(w.message) for w in caught if issubclass(w.category, BuildWarning)]


@pytest.fixture(scope="module")
def scale_bundle(tmp_path_factory):
    return _bundle(tmp_path_factory.mktemp("space"), SCALE_ENTRY, sources={"scale.cl": SCALE})


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(CacheConfig(tmp_path / "cache", 1 << 30, False))


def test_every_valid_point_is_built_failures_dropped_identical_spirv_stored_once(scale_bundle):
    path, warned = scale_bundle
    (record,) = read_bundle(path).kernels
    launch = launch_of(record)
    points = [dict(v.params) for v in launch.variants]
    # n=16384: every (W, L) gives whole work-groups except W=4 with L=8192; (W=4, L=32) fails to compile
    assert points[0] == {"W": 1, "L": 16, "BAD": 0} and len(points) == 3 * 3 * 2 - 2 - 2
    assert not any(p["W"] == 4 and p["L"] in (32, 8192) for p in points)
    assert any("2 of 16 points" in w and "W=4,L=32,BAD=0" in w and "this point does not build" in w for w in warned)
    spirv = {record.stages[i].blob for v in launch.variants for i in v.stages if record.stages[i].format == "spirv"}
    assert len(spirv) == len({(p["W"], p["BAD"]) for p in points}) == 6  # L is only a launch size
    assert len(record.stages) == 2 * len(spirv)


def test_a_default_point_that_does_not_build_fails_the_build(tmp_path):
    entry = {**SCALE_ENTRY, "defines": {"W": 4, "L": 32, "BAD": 0}}
    with pytest.raises(portkern.base.errors.BuildError, match=r"the default point \(W=4,L=32,BAD=0\) does not build: .*this point does not build"):
        _bundle(tmp_path, entry, sources={"scale.cl": SCALE})


def test_spirv_that_fails_validation_at_O2_is_built_at_O0_with_a_warning(tmp_path):
    (tmp_path / "tiled.cl").write_text(TILED)
    defines = tuple((k, str(v)) for k, v in TILED_DEFINES.items())
    with pytest.warns(BuildWarning, match=r"built at -O0: llvm-spirv-15 made no valid SPIR-V from the -O2 build .*dominator"):
        code = cl_build.compile_opencl(tmp_path / "tiled.cl", defines)
    cl_build.validate(code, "tiled")  # what the bundle holds passes spirv-val


@needs_device
def test_the_O0_build_computes_the_right_product(tmp_path, store):
    entry = {
        "name": "tiled", "source": "tiled.cl",
        "args": [
            {"name": "C", "dtype": "float32", "role": "out", "shape": ["W", "W"]},
            {"name": "A", "dtype": "float32", "role": "in", "shape": ["W", "W"]},
            {"name": "B", "dtype": "float32", "role": "in", "shape": ["W", "W"]},
            {"name": "WIDTH", "dtype": "int32", "value": "W"},
        ],
        "global": ["W // 8", "W // 8"], "local": [16, 2], "requires": ["W % 128 == 0"], "defines": TILED_DEFINES,
    }  # fmt: skip
    path, warned = _bundle(tmp_path, entry, sources={"tiled.cl": TILED})
    assert any("built at -O0" in w for w in warned)
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((128, 128), np.float32), rng.standard_normal((128, 128), np.float32)
    c = portkern.load(path, store=store).kernel("tiled", device="opencl")(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


@needs_device
def test_tuning_never_chooses_a_wrong_or_unrunnable_point_and_reuses_the_winner(scale_bundle, store, monkeypatch):
    path, _ = scale_bundle
    x = np.random.default_rng(1).uniform(-1, 1, 16384).astype(np.float32)
    bundle = portkern.load(path, store=store)
    assert bundle.kernel("scale", device="opencl").config == "default"
    tuned = bundle.kernel("scale", device="opencl", tune="full")
    result = tuned.tuning
    assert result.source == "search" and "BAD=1" not in tuned.config
    by_status = {e.config: e.status for e in result.evaluations}
    assert len(by_status) == 13  # every point but the default
    bad = [s for c, s in by_status.items() if "BAD=1" in c and "L=8192" not in c]
    assert bad and all(s == "wrong" for s in bad)
    refused = [e for e in result.evaluations if "L=8192" in e.config]
    assert len(refused) == 4 and all(e.status == "error" and "work-group of 8192 items" in e.error for e in refused)
    good = [s for c, s in by_status.items() if "BAD=0" in c and "L=8192" not in c]
    assert good and all(s == "ok" for s in good)
    np.testing.assert_allclose(tuned(x), 2 * x, rtol=1e-6)

    # stored per device: later calls use the winner without timing anything
    def no_timing(*args, **kwargs):
        raise AssertionError("a stored winner was timed again")

    monkeypatch.setattr(evaluate.Evaluator, "evaluate", no_timing)
    again = portkern.load(path, store=store)
    plain = again.kernel("scale", device="opencl")
    assert plain.config == tuned.config and plain.origin == "cache"
    np.testing.assert_allclose(plain(x), 2 * x, rtol=1e-6)
    asked = again.kernel("scale", device="opencl", tune="full")
    assert asked.config == tuned.config and asked.tuning.source == "selection"


@needs_device
def test_portkern_tune_times_the_points_on_the_opencl_device(scale_bundle, tmp_path, capsys):
    path, _ = scale_bundle
    code, data = cli_json(capsys, "tune", path, "--device", "opencl", "--strategy", "quick", "--cache-dir", tmp_path / "c")
    assert code == 0 and data["ok"] and data["device"].startswith("opencl:")
    (kernel,) = data["kernels"]
    assert kernel["kernel"] == "scale" and kernel["source"] == "search" and "BAD=1" not in kernel["config"]
    assert kernel["dispatches"][0]["evaluated"] == 8  # quick: eight points spread over the space
    assert any(c["status"] == "wrong" for c in kernel["failed_candidates"])


@needs_device
def test_kernels_without_a_space_are_built_and_run_as_before(opencl_examples_bundle, tmp_path, capsys):
    for record in read_bundle(opencl_examples_bundle).kernels:
        assert "tune_at" not in record.launch and all("params" not in v for v in record.launch["variants"])
        assert not launch_of(record).tunable
    code, data = cli_json(capsys, "tune", opencl_examples_bundle, "--device", "opencl", "--kernel", "vadd", "--cache-dir", tmp_path / "c")
    (kernel,) = data["kernels"]
    assert code == 0 and kernel["config"] == "default" and "without a parameter space" in kernel["note"]
