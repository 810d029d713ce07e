"""Root ops without linalg indexing maps (linalg.softmax; IREE's attention) tune with `quick`:
each dispatch ends in a searched config or a stated reason, and the tuned kernel matches NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import portkern

from helpers import attention_mlir, build_mlir

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


@pytest.mark.parametrize("name", sorted(CASES))
def test_roots_without_indexing_maps_tune_to_a_result_or_a_reason(name, tmp_path, store):
    bundle = build_mlir(tmp_path, "roots", **{name: {"softmax": SOFTMAX, "attention": ATTENTION}[name]})
    kernel = portkern.load(bundle, store=store).kernel(name, tune="quick")
    assert kernel.wait(600)
    tuning = kernel.tuning
    assert tuning is not None and tuning.dispatches
    for d in tuning.dispatches:
        assert d.source == "search" or d.note, d  # searched, or a stated reason
    inputs, reference = CASES[name]
    arrays = inputs(np.random.default_rng(0))
    np.testing.assert_allclose(kernel(*arrays), reference(*arrays), rtol=1e-5, atol=1e-6)
