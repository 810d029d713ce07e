"""Gathers of one constant index become slices (`portable.onnx_model.gathers_as_slices`, part of the
one ONNX preparation): the prepared model computes what the model does (onnx's reference, exactly),
and both intake routes build it and match NumPy at rtol 1e-6; what the rewrite must leave alone
is left alone."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from helpers import assert_matches  # noqa: E402

import portkern  # noqa: E402
from portkern import onnx as backend  # noqa: E402
from portkern.cli.main import main  # noqa: E402
from portkern.portable.onnx_model import gathers_as_slices, prepare  # noqa: E402

SHAPE = (3, 4, 8, 16)


def split_model(opset: int = 17, batch: int | str = 3):
    """`nn.MultiheadAttention`'s split of a packed projection, as torch's exporter writes it (scalar
    initializer indices on axis 0), plus a negative index from a Constant node and an int32 index
    on a negative axis."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Gather", ["packed", "zero"], ["q"], axis=0),
        helper.make_node("Constant", [], ["last"], value=numpy_helper.from_array(np.array(-1, np.int64), "last")),
        helper.make_node("Gather", ["packed", "last"], ["v"], axis=0),
        helper.make_node("Gather", ["packed", "five"], ["column"], axis=-2),
        helper.make_node("Add", ["q", "v"], ["qv"]),
    ]
    graph = helper.make_graph(
        nodes, "split", [helper.make_tensor_value_info("packed", TensorProto.FLOAT, [batch, *SHAPE[1:]])],
        [helper.make_tensor_value_info("qv", TensorProto.FLOAT, list(SHAPE[1:])),
         helper.make_tensor_value_info("column", TensorProto.FLOAT, [batch, SHAPE[1], SHAPE[3]])],
        initializer=[numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(5, np.int32), "five")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def expected(x: np.ndarray) -> list[np.ndarray]:
    return [x[0] + x[-1], x[:, :, 5, :]]


def copy(model):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def test_the_prepared_model_slices_and_computes_what_the_gathers_did():
    from onnx.reference import ReferenceEvaluator

    model = split_model()
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    prepared = copy(model)
    assert prepare(prepared)
    ops = [n.op_type for n in prepared.graph.node]
    assert "Gather" not in ops and ops.count("Slice") == 3 and ops.count("Squeeze") == 3
    onnx.checker.check_model(prepared)
    got = ReferenceEvaluator(prepared).run(None, {"packed": x})
    assert_matches(tuple(got), ReferenceEvaluator(model).run(None, {"packed": x}), 0, 0)
    assert_matches(tuple(got), expected(x), 0, 0)


def test_both_intake_routes_build_the_sliced_model_and_match_numpy(tmp_path, store):
    model = split_model()
    x = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)
    assert_matches(tuple(backend.run_model(model, [x])), expected(x), 1e-6, 0)
    onnx.save(model, tmp_path / "split.onnx")
    (tmp_path / "m.yaml").write_text("bundle: split\nkernels:\n  - name: split\n    source: split.onnx\n")
    assert main(["build", str(tmp_path / "m.yaml"), "-o", str(tmp_path / "m.pkb"), "--json"]) == 0
    kernel = portkern.load(tmp_path / "m.pkb", store=store).kernel("split")
    assert_matches(kernel(x), expected(x), 1e-6, 0)


def test_gathers_the_rewrite_cannot_prove_the_same_are_left_alone():
    from onnx import TensorProto, helper, numpy_helper

    assert gathers_as_slices(split_model(opset=12)) == 0  # Squeeze takes its axes as an input from opset 13
    assert gathers_as_slices(split_model(batch="B")) == 1  # the batch axis's size unknown: only the column is sliced
    shape_index = helper.make_node("Gather", ["dims", "zero"], ["first"], axis=0)  # shape arithmetic (rank 1)
    out_of_range = helper.make_node("Gather", ["x", "three"], ["y"], axis=0)
    fed = helper.make_node("Gather", ["x", "fed"], ["z"], axis=0)  # an index a caller may feed
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["dims"]), shape_index, out_of_range, fed], "alone",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE)), helper.make_tensor_value_info("fed", TensorProto.INT64, [])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("first", "y", "z")],
        initializer=[numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("zero", 0), ("three", 3), ("fed", 1))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert gathers_as_slices(model) == 0
    assert [n.op_type for n in model.graph.node] == ["Shape", "Gather", "Gather", "Gather"]
