"""GEMM+bias+ReLU kernels of seeded, varied sizes, for benches that need more (or held-out-like) kernels."""

from __future__ import annotations

import random
from pathlib import Path

#: Sizes drawn for M, K and N.
SIZES = (64, 128, 192, 256, 384, 512)

GEMM = """func.func @{name}(%A: tensor<{m}x{k}xf32>, %B: tensor<{k}x{n}xf32>, %bias: tensor<{n}xf32>) -> tensor<{m}x{n}xf32> {{
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<{m}x{n}xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  %C = linalg.matmul ins(%A, %B : tensor<{m}x{k}xf32>, tensor<{k}x{n}xf32>) outs(%acc : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  %out = linalg.generic {{indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>, affine_map<(i, j) -> (i, j)>],
                         iterator_types = ["parallel", "parallel"]}}
      ins(%C, %bias : tensor<{m}x{n}xf32>, tensor<{n}xf32>) outs(%empty : tensor<{m}x{n}xf32>) {{
  ^bb0(%c: f32, %b: f32, %unused: f32):
    %sum = arith.addf %c, %b : f32
    %relu = arith.maximumf %sum, %zero : f32
    linalg.yield %relu : f32
  }} -> tensor<{m}x{n}xf32>
  return %out : tensor<{m}x{n}xf32>
}}
"""


def write_gemms(where: Path, count: int, seed: int = 0) -> dict[str, tuple[int, int, int]]:
    """`count` kernels `gemm_0`... as `.mlir` files in `where`; each name's (M, K, N)."""
    rng = random.Random(seed)
    shapes = {}
    for i in range(count):
        m, k, n = (rng.choice(SIZES) for _ in range(3))
        (where / f"gemm_{i}.mlir").write_text(GEMM.format(name=f"gemm_{i}", m=m, k=k, n=n))
        shapes[f"gemm_{i}"] = (m, k, n)
    return shapes


def manifest_lines(names) -> list[str]:
    """Manifest entries for kernels whose source is `NAME.mlir`."""
    return [line for name in names for line in (f"  - name: {name}", f"    source: {name}.mlir")]
