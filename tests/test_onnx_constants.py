"""ONNX Constant nodes whose value tensor has no name, as `torch.onnx.export(..., dynamo=False)`
writes them (BERT's position ids): a large one becomes a parameter, read under its node's output
name, through a manifest and through `portkern.onnx.prepare`; results match onnx's reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX models need the 'onnx' package")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import portkern  # noqa: E402
import portkern.onnx as backend  # noqa: E402
from portkern.portable.builder import build_file  # noqa: E402

#: 2 x 512 elements: above the importer's threshold, so each constant becomes a parameter.
SHAPE = (2, 512)


def constants_model(where: Path) -> Path:
    """y = (x + A) * B, A and B Constant nodes whose value tensors are unnamed."""
    rng = np.random.default_rng(3)
    nodes = []
    for output in ("/embeddings/Constant_output_0", "/embeddings/Constant_1_output_0"):
        value = numpy_helper.from_array(rng.standard_normal(SHAPE).astype(np.float32))
        value.name = ""
        nodes.append(helper.make_node("Constant", [], [output], value=value))
    nodes += [
        helper.make_node("Add", ["x", "/embeddings/Constant_output_0"], ["s"]),
        helper.make_node("Mul", ["s", "/embeddings/Constant_1_output_0"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "consts", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SHAPE))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    where.mkdir(parents=True, exist_ok=True)
    onnx.save(model, where / "model.onnx")
    (where / "manifest.yaml").write_text("bundle: consts\nkernels:\n  - name: consts\n    source: model.onnx\n")
    return where / "model.onnx"


def test_unnamed_large_constants_build_through_a_manifest(tmp_path, store):
    path = constants_model(tmp_path / "m")
    assert all(not a.t.name for n in onnx.load(str(path)).graph.node for a in n.attribute)
    build_file(path.parent / "manifest.yaml", tmp_path / "c.pkb")
    x = np.random.default_rng(4).standard_normal(SHAPE).astype(np.float32)
    got = portkern.load(tmp_path / "c.pkb", store=store).kernel("consts")(x)
    np.testing.assert_allclose(got, ReferenceEvaluator(onnx.load(str(path))).run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)


def test_unnamed_large_constants_run_through_prepare(tmp_path, store):
    path = constants_model(tmp_path / "m")
    x = np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)
    got = backend.prepare(onnx.load(str(path)), "CPU", store=store).run([x])[0]
    np.testing.assert_allclose(got, ReferenceEvaluator(onnx.load(str(path))).run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)


def test_shape_arithmetic_on_constants_as_torchscript_writes_an_expand(tmp_path, store):
    """`x.expand(3, -1)` as torch's TorchScript exporter writes it: the target shape is
    `Where(Equal(shape, ConstantOfShape * -1), ConstantOfShape, shape)` over constants, which onnx's
    shape inference leaves unknown; the model builds, and its result has the shape and values of
    onnx's reference."""
    shape = numpy_helper.from_array(np.array([3, -1], dtype=np.int64))
    shape.name = ""
    nodes = [
        helper.make_node("Constant", [], ["shape"], value=shape),
        helper.make_node("Constant", [], ["rank"], value=numpy_helper.from_array(np.array([2], dtype=np.int64), "rank")),
        helper.make_node("ConstantOfShape", ["rank"], ["ones"], value=numpy_helper.from_array(np.array([1], dtype=np.int64), "one")),
        helper.make_node("Constant", [], ["minus"], value=numpy_helper.from_array(np.array(-1, dtype=np.int64), "minus")),
        helper.make_node("Mul", ["ones", "minus"], ["minus_ones"]),
        helper.make_node("Equal", ["shape", "minus_ones"], ["unknown"]),
        helper.make_node("Where", ["unknown", "ones", "shape"], ["target"]),
        helper.make_node("Expand", ["x", "target"], ["wide"]),
        helper.make_node("Reshape", ["wide", "flat"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "expand", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [12])], [numpy_helper.from_array(np.array([12], dtype=np.int64), "flat")],
    )
    path = tmp_path / "expand.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    (tmp_path / "e.yaml").write_text("bundle: e\nkernels:\n  - name: expand\n    source: expand.onnx\n")
    build_file(tmp_path / "e.yaml", tmp_path / "e.pkb")
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    got = portkern.load(tmp_path / "e.pkb", store=store).kernel("expand")(x)
    np.testing.assert_array_equal(got, ReferenceEvaluator(onnx.load(str(path))).run(None, {"x": x})[0])
    np.testing.assert_array_equal(got, np.tile(x[0], 3))
