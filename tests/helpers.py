"""Assertions and bundles shared by the kernel tests."""

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


def reseal(path: Path, out: Path, version: str, sources: dict[str, bytes] | None = None) -> Path:
    """`path` with every stage's producer set to IREE `version` (a bundle of another release,
    as far as the loader can tell), and the named kernels' source stage bytes replaced by
    `sources[name]`, sealed again as a valid bundle (with the same parameters)."""
    import dataclasses

    from portkern.portable.bundle import Bundle, read_bundle, sha256, write_bundle
    from portkern.portable.parameters import ParameterData, file_pieces

    bundle = read_bundle(path)
    blobs = dict(bundle.blobs)
    kernels = []
    section = bundle.parameters
    parameters = tuple(
        ParameterData(record.name, p.scope, p.name, p.size, file_pieces(path, section.offset + p.offset, p.size))
        for record in bundle.kernels for p in record.parameters
    )
    for record in bundle.kernels:
        stages = []
        for stage in record.stages:
            stage = dataclasses.replace(stage, producer=dataclasses.replace(stage.producer, version=version))
            if stage.is_source and record.name in (sources or {}):
                data = sources[record.name]
                blobs.pop(stage.blob, None)
                stage = dataclasses.replace(stage, blob=sha256(data), size=len(data))
                blobs[stage.blob] = data
            stages.append(stage)
        kernels.append(dataclasses.replace(record, stages=tuple(stages), parameters=()))
    write_bundle(Bundle(bundle.name, tuple(kernels), blobs, parameter_data=parameters), out)
    return out


def dense_onnx(opset: int = 17) -> bytes:
    """A tiny ONNX model of `opset`, relu(x @ W + b) with x 4x16, W 16x16 (a parameter once built), b 16;
    seeded values."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    weight = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [weight, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


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
