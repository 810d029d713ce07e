"""The tuning sweep's CI subset: every strategy on every dispatch of a seeded, representative set of
models ends in a measured result or a stated reason (`bench/tuning_sweep.py` runs all of them)."""

from __future__ import annotations

import pytest
from helpers import attention_mlir, build_mlir

import portkern
from portkern.jit import devices
from portkern.portable.builder import build_file
from portkern.tuner import strategies
from portkern.tuner.session import Tuner
from portkern.tuner.sweep import ERROR, REASON, RESULT, UNTYPED, Tally, sweep_bundle, sweep_spaces

pytest.importorskip("onnx", reason="the sweep's models come from the onnx package (portkern[onnx])")

from portkern.examples import onnx_models  # noqa: E402 - needs onnx

#: Convolution, pooling (max, average) and softmax as PyTorch exported them, always in the subset.
CORE = ("Conv2d", "MaxPool2d", "AvgPool2d", "Softmax")
SEED, EXTRA = 24, 1

#: Root ops without linalg indexing maps: IREE's attention and linalg.softmax.
ROOTS_MLIR = {
    "attention": attention_mlir(2, 128, 64),
    "softmax": """
func.func @softmax(%x: tensor<256x1024xf32>) -> tensor<256x1024xf32> {
  %empty = tensor.empty() : tensor<256x1024xf32>
  %r = linalg.softmax dimension(1) ins(%x : tensor<256x1024xf32>) outs(%empty : tensor<256x1024xf32>) -> tensor<256x1024xf32>
  return %r : tensor<256x1024xf32>
}
""",
}


def subset() -> list:
    converted = onnx_models.pytorch_converted_models()
    core = [m for m in converted if m.name in CORE]
    assert len(core) == len(CORE)
    return core + onnx_models.seeded_subset([m for m in converted if m.name not in CORE], EXTRA, SEED)


@pytest.fixture(scope="module")
def sweep_bundles(tmp_path_factory):
    where = tmp_path_factory.mktemp("sweep")
    manifest = onnx_models.manifest(subset(), where / "onnx", "sweep")
    build_file(manifest, where / "onnx.pkb")
    return [where / "onnx.pkb", build_mlir(where, "roots", **ROOTS_MLIR)]


def test_every_strategy_on_every_dispatch_ends_in_a_result_or_a_reason(sweep_bundles, store):
    target = devices.resolve("cpu", store)
    spaces, tunes = [], []
    with Tuner(workers=2) as tuner:
        for path in sweep_bundles:
            loaded = portkern.load(path, store=store)
            spaces += sweep_spaces(loaded, target, threads=2)
            tunes += sweep_bundle(tuner, loaded, target, strategies.names(), budget=1)
    for tally in (Tally.of(spaces), Tally.of(tunes)):
        assert tally.untyped == [] and not tally.errors, tally.to_dict()
        assert tally.results > 0 and tally.reasons
    kernels = {o.kernel for o in tunes}
    assert {*CORE, "attention", "softmax"} <= kernels
    assert {o.strategy for o in tunes} == set(strategies.names())
    # convolutions and pooling: analysed, each dispatch a space or a stated reason (these are tiny:
    # test_tuning_real_models.py searches a real-sized convolution); `full` searched some dispatch
    for kernel in ("Conv2d", "MaxPool2d", "AvgPool2d"):
        found = [o for o in spaces if o.kernel == kernel]
        assert found and all(o.kind in (RESULT, REASON) and o.dispatch for o in found)
    assert any(o.kind == RESULT and o.strategy == "full" for o in tunes)
    # attention's root has its maps as an attribute: analysed, and stated when there is nothing to search
    attention = [o for o in spaces if o.kernel == "attention"]
    assert attention and all(o.kind in (RESULT, REASON) for o in attention)
    # every reason is stated
    assert all(o.detail and o.detail != "(no reason given)" for o in tunes if o.kind == REASON)
    assert not [o for o in tunes if o.kind in (ERROR, UNTYPED)]
