"""Root ops without linalg indexing maps (linalg.softmax; IREE's attention) tune with `quick` for named
x86-64 ISA levels: each dispatch ends in a searched config or a stated reason, and the tuned kernel
matches NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_matches, attention_mlir, build_mlir, expected_skip

import portkern

SOFTMAX = """
func.func @softmax(%x: tensor<64x256xf32>) -> tensor<64x256xf32> {
  %empty = tensor.empty() : tensor<64x256xf32>
  %r = linalg.softmax dimension(1) ins(%x : tensor<64x256xf32>) outs(%empty : tensor<64x256xf32>) -> tensor<64x256xf32>
  return %r : tensor<64x256xf32>
}
"""

ATTENTION = attention_mlir(2, 64, 32)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


CASES = {
    "softmax": (lambda rng: [rng.standard_normal((64, 256), dtype=np.float32)], softmax),
    "attention": (
        lambda rng: [rng.standard_normal((2, 64, 32), dtype=np.float32) for _ in range(3)],
        lambda q, k, v: softmax(q.astype(np.float64) @ k.transpose(0, 2, 1) * 0.125) @ v,
    ),
}


#: The x86-64 ISA levels these tests tune for (never the host's own CPU), with each level's vector
#: register width in bytes: AVX2 (every x86-64 host these tests run on runs v3 code) and AVX-512.
ISA = {"cpu:x86-64-v3": 32, "cpu:x86-64-v4": 64}


def target_or_skip(spec: str, store, run: bool):
    """The target of `spec`; skips (naming why) where `run` asks to run its code and this host cannot."""
    from portkern.jit import devices

    target = devices.resolve(spec, store)
    if run and not target.runnable:
        pytest.skip(expected_skip("cpu", f"running {spec} code needs a host with its features: {target.reason}"))
    return target


@pytest.mark.parametrize("spec", sorted(ISA))
@pytest.mark.parametrize("name", sorted(CASES))
def test_roots_without_indexing_maps_tune_to_a_result_or_a_reason(name, spec, tmp_path, store):
    target_or_skip(spec, store, run=True)
    bundle = build_mlir(tmp_path, "roots", **{name: {"softmax": SOFTMAX, "attention": ATTENTION}[name]})
    kernel = portkern.load(bundle, store=store).kernel(name, device=spec, tune="quick")
    assert kernel.wait(600)
    tuning = kernel.tuning
    assert tuning is not None and tuning.dispatches
    for d in tuning.dispatches:
        assert d.source == "search" or d.note, d  # searched, or a stated reason
    inputs, reference = CASES[name]
    arrays = inputs(np.random.default_rng(0))
    np.testing.assert_allclose(kernel(*arrays), reference(*arrays), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec", sorted(ISA))
def test_attention_space_keeps_what_compiles_and_prunes_what_does_not(spec, tmp_path, store):
    """P6: the quick attention tiles (the value head dim whole) compile and match NumPy within
    1e-5; tiles whose larger contraction reaches IREE's vector limit are pruned, and do fail.
    Cross-compiled for a level this host cannot run (its results are then not compared)."""
    from portkern.base.errors import FinalizeError
    from portkern.jit import finalize
    from portkern.jit.runtime import Executable
    from portkern.tuner import analysis
    from portkern.tuner.cpu_config import CpuConfig
    from portkern.tuner.registry import space_for

    loaded = portkern.load(build_mlir(tmp_path, "roots", attention=ATTENTION), store=store)
    record, target = loaded.record("attention"), target_or_skip(spec, store, run=False)
    (dispatch,) = analysis.dispatches(finalize.configure(loaded.bundle, record, target))
    assert dispatch.root == "iree_linalg_ext.online_attention" and dispatch.sizes == (2, 64, 32, 32, 64)
    assert dispatch.native_vector_bytes == ISA[spec]
    space = space_for(dispatch, threads=2)
    assert space.attention and space.lane == 2
    quick = space.quick_candidates(0, [])
    assert quick and all(c.vector_parallel[2] == 32 for c in quick)  # the head dim whole
    # rows: 8, 4 or 16, or 1 where IREE's default leaves them at 1 (P5: AVX2)
    rows = 1 if dispatch.default.vector_parallel[1] == 1 else None
    assert all(c.vector_parallel[1] == rows if rows else c.vector_parallel[1] in (4, 8, 16) for c in quick)
    inputs, reference = CASES["attention"]
    arrays = inputs(np.random.default_rng(0))
    for config in quick[:2]:
        code = loaded.native(record, target, f"0={config}").data
        if target.runnable:
            out = Executable(code, record.entry, target.driver)(*arrays)[0]
            np.testing.assert_allclose(out, reference(*arrays), rtol=1e-5, atol=1e-6)
    # rows x keys x head dim at exactly the limit (native vector bytes x 512)
    rows = 16
    keys = dispatch.native_vector_bytes * 512 // dispatch.element_bytes // (rows * 32)
    pruned = CpuConfig((1, 64, 32, 0, 0), (1, rows, 16, 0, 0), (0, 0, 0, 0, keys))
    assert space.prune_reason(pruned).startswith("P6")
    with pytest.raises(FinalizeError, match="large vector sizes"):
        loaded.native(record, target, f"0={pruned}")


@pytest.mark.parametrize("spec", sorted(ISA))
def test_data_tiled_matmul_space_varies_distributions_that_compile(spec, examples_bundle, store, rng):
    """P7: a data-tiled matmul (`linalg.mmt4d`) keeps its encoding's vector tiles and varies its
    distribution in output elements; `quick`'s distributions compile and match NumPy within the
    example's tolerance (cross-compiled for a level this host cannot run: results then not compared)."""
    from portkern.examples.reference import EXAMPLES
    from portkern.jit.runtime import Executable
    from portkern.tuner import registry
    from portkern.tuner.cpu_space import MMT4D_TILE_POINTS

    loaded = portkern.load(examples_bundle, store=store)
    record, target = loaded.record("gemm_bias_relu"), target_or_skip(spec, store, run=False)
    analysed = loaded.natives.analyse(loaded.plan(record, target, "data-tiling"))
    (dispatch,) = [d for d in map(registry.dispatch_from_data, analysed.dispatches) if d.root == "linalg.mmt4d"]
    m1, n1, k1, m0, n0, k0 = dispatch.sizes
    assert (m1 * m0, n1 * n0, k1 * k0) == (256, 384, 512)  # the example's 256x384x512 GEMM, packed
    space = registry.space_for(dispatch, threads=2)
    assert space.mmt4d and space.stage_candidates(0, []) == []  # the encoding's vector tiles stay
    quick = space.quick_candidates(1, [space.default])
    assert quick and all(space.prune_reason(c) is None for c in quick)
    for config in quick:
        assert config.vector_parallel == space.default.vector_parallel
        m, n = config.distribution[0] * m0, config.distribution[1] * n0
        assert MMT4D_TILE_POINTS[0] <= m * n <= MMT4D_TILE_POINTS[1], str(config)
    example = EXAMPLES["gemm_bias_relu"]
    inputs = example.inputs(rng)
    for config in quick[:2]:
        code = loaded.native(record, target, f"data-tiling;{dispatch.index}={config}").data
        if target.runnable:
            outputs = Executable(code, record.entry, target.driver)(*inputs)
            assert_matches(tuple(outputs), example.reference(*inputs), example.rtol, example.atol)
