"""NumPy reference implementations and input generators for the example kernels.

Each entry of EXAMPLES describes one kernel of manifest.yaml,
manifest_opencl.yaml (the OpenCL C kernels) or manifest_opencl_tuning.yaml
(OpenCL C kernels with a parameter space): how to build its
inputs from a numpy Generator, a NumPy reference returning the list of outputs,
and the rtol/atol a compiled (f32) kernel must meet against that reference.

GEMM operands are uniform, A scaled by sqrt(3/K) and B by sqrt(3) so the GEMM
output has unit standard deviation: activations are never saturated and a
wrong kernel shows up as a large error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from portkern.base.records import frozen_record

HERE = Path(__file__).resolve().parent

M, K, N = 256, 512, 384


@frozen_record
class Example:
    name: str  # kernel name in the manifest
    inputs: Callable[[np.random.Generator], list[np.ndarray]]
    reference: Callable[..., list[np.ndarray]]  # numpy reference, returns list of outputs
    rtol: float
    atol: float


def _uniform(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    return (rng.uniform(-1.0, 1.0, shape) * scale).astype(np.float32)


def _gemm_operands(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    # A has variance 1/K and B variance 1, so every entry of A @ B has std ~1:
    # relu is half active and sigmoid inputs span roughly [-3, 3], neither
    # saturated nor in the near-linear region around 0.
    a = _uniform(rng, (M, K), np.sqrt(3.0 / K))
    b = _uniform(rng, (K, n), np.sqrt(3.0))
    return [a, b]


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # Accumulate in float64, then round once: the "exact" f32 answer.
    return a.astype(np.float64) @ b.astype(np.float64)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


# --- gemm_bias_relu ---------------------------------------------------------

def _gemm_bias_relu_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    return [*_gemm_operands(rng, N), _uniform(rng, (N,), 0.5)]


def _gemm_bias_relu(a: np.ndarray, b: np.ndarray, bias: np.ndarray) -> list[np.ndarray]:
    out = np.maximum(_matmul(a, b) + bias, 0.0)
    return [out.astype(np.float32)]


# --- gemm_glu ---------------------------------------------------------------

def _gemm_glu_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    return _gemm_operands(rng, 2 * N)


def _gemm_glu(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    c = _matmul(a, b)
    return [(c[:, :N] * _sigmoid(c[:, N:])).astype(np.float32)]


# --- gemm_rowsum ------------------------------------------------------------

def _gemm_rowsum_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    return _gemm_operands(rng, N)


def _gemm_rowsum(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    return [_matmul(a, b).sum(axis=1).astype(np.float32)]


# --- gemm_transpose_add -----------------------------------------------------

def _gemm_transpose_add_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    return [*_gemm_operands(rng, N), _uniform(rng, (N, M))]


def _gemm_transpose_add(a: np.ndarray, b: np.ndarray, d: np.ndarray) -> list[np.ndarray]:
    return [(_matmul(a, b).T + d).astype(np.float32)]


# --- mlp (mlp.onnx) ---------------------------------------------------------

def _mlp_weights() -> dict[str, np.ndarray]:
    import onnx  # lazy: only this example needs it
    from onnx import numpy_helper

    model = onnx.load(str(HERE / "mlp.onnx"))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _mlp_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    return [_uniform(rng, (32, 64))]


def _mlp(x: np.ndarray) -> list[np.ndarray]:
    w = {k: v.astype(np.float64) for k, v in _mlp_weights().items()}
    h = np.maximum(x.astype(np.float64) @ w["W1"] + w["b1"], 0.0)
    logits = h @ w["W2"] + w["b2"]
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return [(e / e.sum(axis=-1, keepdims=True)).astype(np.float32)]


# --- OpenCL C kernels (manifest_opencl.yaml) ---------------------------------
# Sizes that are not multiples of the work-group sizes exercise the bounds checks.

VADD_N = 100_003
MM_M, MM_K, MM_N = 200, 300, 136
SOFTMAX_ROWS, SOFTMAX_COLS = 300, 1000


def _vadd_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    return [_uniform(rng, (VADD_N,)), _uniform(rng, (VADD_N,))]


def _vadd(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    return [a + b]  # one float32 addition per element: the kernel must match exactly


def _matmul_tiled_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    return [_uniform(rng, (MM_M, MM_K), np.sqrt(3.0 / MM_K)), _uniform(rng, (MM_K, MM_N), np.sqrt(3.0))]


def _matmul_tiled(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    return [_matmul(a, b).astype(np.float32)]


def _softmax_rows_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    return [_uniform(rng, (SOFTMAX_ROWS, SOFTMAX_COLS), 8.0)]


def _softmax_rows(x: np.ndarray) -> list[np.ndarray]:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return [(e / e.sum(axis=1, keepdims=True)).astype(np.float32)]


# --- OpenCL C kernels with a parameter space (manifest_opencl_tuning.yaml) ------
# Sizes are multiples of the largest tiles, as the kernels' `requires:` say.

SPACE_M, SPACE_K, SPACE_N = 192, 320, 256
TRANSPOSE_M, TRANSPOSE_N = 96, 160


def _matmul_space_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    return [_uniform(rng, (SPACE_M, SPACE_K), np.sqrt(3.0 / SPACE_K)), _uniform(rng, (SPACE_K, SPACE_N), np.sqrt(3.0))]


def _transpose_space_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    return [_uniform(rng, (TRANSPOSE_M, TRANSPOSE_N))]


def _transpose(x: np.ndarray) -> list[np.ndarray]:
    return [np.ascontiguousarray(x.T)]  # a copy of every element: the kernel must match exactly


EXAMPLES: dict[str, Example] = {
    ex.name: ex
    for ex in [
        Example("gemm_bias_relu", _gemm_bias_relu_inputs, _gemm_bias_relu, rtol=1e-4, atol=1e-5),
        Example("gemm_glu", _gemm_glu_inputs, _gemm_glu, rtol=1e-4, atol=1e-5),
        # Row sums are ~N(0, sqrt(384) ~ 20) and accumulate 512*384 products,
        # so absolute error near zero-valued sums needs a larger atol.
        Example("gemm_rowsum", _gemm_rowsum_inputs, _gemm_rowsum, rtol=1e-4, atol=1e-4),
        Example("gemm_transpose_add", _gemm_transpose_add_inputs, _gemm_transpose_add,
                rtol=1e-4, atol=1e-5),
        Example("mlp", _mlp_inputs, _mlp, rtol=1e-5, atol=1e-6),
        Example("vadd", _vadd_inputs, _vadd, rtol=0.0, atol=0.0),
        Example("matmul_tiled", _matmul_tiled_inputs, _matmul_tiled, rtol=1e-4, atol=1e-5),
        # Probabilities are ~1e-3 on average and up to ~0.5; exp in f32 is good to a few ulp.
        Example("softmax_rows", _softmax_rows_inputs, _softmax_rows, rtol=1e-5, atol=1e-8),
        Example("matmul_space", _matmul_space_inputs, _matmul_tiled, rtol=1e-4, atol=1e-5),
        Example("transpose_space", _transpose_space_inputs, _transpose, rtol=0.0, atol=0.0),
    ]
}
