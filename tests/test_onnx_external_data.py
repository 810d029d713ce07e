"""ONNX models whose initializers all live in an external data file, as `torch.onnx.export` writes
them (`model.onnx` + `model.onnx.data`, small int64 shape tensors included): built through a
manifest and through `portkern.onnx.prepare`, the results match onnx's reference evaluator."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX models need the 'onnx' package")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import portkern  # noqa: E402
import portkern.onnx as backend  # noqa: E402
from portkern.base.errors import BuildError  # noqa: E402
from portkern.portable.builder import build_file  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5
#: Rows of the weight: 8 x 16 = 128 elements stay in the code, 128 x 16 become a parameter.
SIZES = {"small-weight": 8, "parameter-weight": 128}


def external_model(where: Path, rows: int, opset: int = 17) -> Path:
    """y = Relu(Reshape(x, shape) @ W + B), every initializer (the int64 `shape` too) saved in
    `model.onnx.data`, whatever its size."""
    rng = np.random.default_rng(rows)
    inits = [
        numpy_helper.from_array(np.array([-1, rows], dtype=np.int64), "shape"),
        numpy_helper.from_array(rng.standard_normal((rows, 16)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "B"),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("MatMul", ["r", "W"], ["m"]),
        helper.make_node("Add", ["m", "B"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "ext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2, rows // 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    where.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, where / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    (where / "manifest.yaml").write_text("bundle: ext\nkernels:\n  - name: ext\n    source: model.onnx\n")
    return where / "model.onnx"


def reference(path: Path, x: np.ndarray) -> np.ndarray:
    return ReferenceEvaluator(onnx.load(str(path))).run(None, {"x": x})[0]


@pytest.mark.parametrize("rows", SIZES.values(), ids=SIZES.keys())
def test_a_model_with_every_tensor_in_external_data_builds_through_a_manifest(tmp_path, store, rows):
    """The small int64 shape tensor in `.onnx.data` is read at build; results match the reference."""
    path = external_model(tmp_path / "m", rows)
    onnx_model = onnx.load(str(path), load_external_data=False)
    assert onnx_model.graph.initializer and all(t.data_location == TensorProto.EXTERNAL for t in onnx_model.graph.initializer)
    out = tmp_path / "ext.pkb"
    build_file(path.parent / "manifest.yaml", out)
    x = np.random.default_rng(7).standard_normal((4, 2, rows // 2)).astype(np.float32)
    got = portkern.load(out, store=store).kernel("ext")(x)
    np.testing.assert_allclose(got, reference(path, x), rtol=RTOL, atol=ATOL)
    assert (got > 0).any() and (got == 0).any()  # the Relu both passes and cuts: a wrong shape or bias shows


@pytest.mark.parametrize("rows", SIZES.values(), ids=SIZES.keys())
def test_a_model_loaded_with_its_external_data_runs_through_prepare(tmp_path, store, rows):
    path = external_model(tmp_path / "m", rows)
    rep = backend.prepare(onnx.load(str(path)), "CPU", store=store)
    x = np.random.default_rng(8).standard_normal((4, 2, rows // 2)).astype(np.float32)
    np.testing.assert_allclose(rep.run([x]).y, reference(path, x), rtol=RTOL, atol=ATOL)


def test_an_older_opset_model_with_small_external_tensors_builds(tmp_path, store):
    """No tensor is left for `--large-model` once the small ones are read: the model is upgraded
    to the importer's opset as an inline one is."""
    path = external_model(tmp_path / "m", SIZES["small-weight"], opset=13)
    out = tmp_path / "ext.pkb"
    build_file(path.parent / "manifest.yaml", out)
    x = np.random.default_rng(9).standard_normal((4, 2, 4)).astype(np.float32)
    np.testing.assert_allclose(portkern.load(out, store=store).kernel("ext")(x), reference(path, x), rtol=RTOL, atol=ATOL)


def test_a_short_external_data_file_is_a_build_error_naming_the_tensor(tmp_path):
    path = external_model(tmp_path / "m", SIZES["small-weight"])
    data = path.with_name("model.onnx.data")
    data.write_bytes(data.read_bytes()[:8])  # `shape` (16 bytes, first in the file) is cut short
    with pytest.raises(BuildError, match=r"external data of 'shape' has 8 bytes, its shape needs 16"):
        build_file(path.parent / "manifest.yaml", tmp_path / "ext.pkb")


def test_external_data_that_is_not_a_regular_file_is_a_build_error(tmp_path):
    """A named pipe in the model's folder is neither opened (that would wait for a writer) nor read."""
    path = external_model(tmp_path / "m", SIZES["small-weight"])
    data = path.with_name("model.onnx.data")
    data.unlink()
    os.mkfifo(data)
    with pytest.raises(BuildError, match=r"external data of 'shape' is not in a regular file \('model.onnx.data'\)"):
        build_file(path.parent / "manifest.yaml", tmp_path / "ext.pkb")
