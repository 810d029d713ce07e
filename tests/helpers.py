"""Assertions shared by the kernel tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def assert_matches(outputs, references, rtol: float, atol: float) -> None:
    """Every output equals its NumPy reference within rtol/atol."""
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    assert len(outputs) == len(references)
    for got, want in zip(outputs, references):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def opencl_toolchain_missing() -> str:
    """Why OpenCL C cannot be built here ("" when it can)."""
    from portkern.portable.opencl import APT_HINT, missing_tools

    missing = missing_tools("opencl")
    return f"needs {', '.join(missing)} ({APT_HINT})" if missing else ""


def opencl_device_missing() -> str:
    """Why no OpenCL device can run kernels here ("" when one can)."""
    from portkern.jit import opencl

    probe = opencl.probe()
    return "" if probe.devices else f"needs an OpenCL device: {probe.reason}"


def build_mlir(where: Path, name: str = "k", **sources: str) -> Path:
    """A bundle `<where>/<name>.pkb` of MLIR kernels, one per keyword (kernel name=source text)."""
    from portkern.portable.builder import build_file

    lines = [f"bundle: {name}", "kernels:"]
    for kernel, text in sources.items():
        (where / f"{kernel}.mlir").write_text(text)
        lines += [f"  - name: {kernel}", f"    source: {kernel}.mlir"]
    (where / f"{name}.yaml").write_text("\n".join(lines) + "\n")
    build_file(where / f"{name}.yaml", where / f"{name}.pkb")
    return where / f"{name}.pkb"


def attention_mlir(batch: int, length: int, dim: int) -> str:
    """An MLIR kernel `@attention(q, k, v)` of IREE's attention op (scale 0.125), all BxLxD f32."""
    t = f"tensor<{batch}x{length}x{dim}xf32>"
    return f"""
func.func @attention(%q: {t}, %k: {t}, %v: {t}) -> {t} {{
  %scale = arith.constant 0.125 : f32
  %empty = tensor.empty() : {t}
  %r = iree_linalg_ext.attention <{{indexing_maps = [affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3)>,
      affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d3)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2)>,
      affine_map<(d0, d1, d2, d3, d4) -> ()>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2)>]}}>
      ins(%q, %k, %v, %scale : {t}, {t}, {t}, f32)
      outs(%empty : {t}) {{
    ^bb0(%score: f32):
      iree_linalg_ext.yield %score : f32
  }} -> {t}
  return %r : {t}
}}
"""
