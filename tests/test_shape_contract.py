"""Shape contracts: derived from the IR at build time, stated in the manifest and checked
against the IR, recorded in the bundle, shown by `inspect`, enforced before every call."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from helpers import one_kernel_bundle
from test_bundle_format import repack

import portkern
from portkern.base.errors import ArgumentShapeError, BuildError, MalformedBundleError
from portkern.cli.main import main
from portkern.portable.builder import build_file
from portkern.portable.bundle import Signature, decode
from portkern.portable.contract import ShapeContract, UncheckedShapesWarning

MATMUL = """
func.func @main(%a: tensor<?x?xf32>, %b: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = tensor.dim %a, %c0 : tensor<?x?xf32>
  %n = tensor.dim %b, %c1 : tensor<?x?xf32>
  %e = tensor.empty(%m, %n) : tensor<?x?xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<?x?xf32>) -> tensor<?x?xf32>
  %r = linalg.matmul ins(%a, %b : tensor<?x?xf32>, tensor<?x?xf32>) outs(%f : tensor<?x?xf32>) -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
"""

#: x (?x?) + y (?x?), then reshaped to 1-d: a collapse puts no condition on its source; its result is the product.
ADD_FLAT = """
func.func @main(%x: tensor<?x?xf32>, %y: tensor<?x?xf32>) -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %x, %c0 : tensor<?x?xf32>
  %d1 = tensor.dim %x, %c1 : tensor<?x?xf32>
  %e = tensor.empty(%d0, %d1) : tensor<?x?xf32>
  %s = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]} ins(%x, %y : tensor<?x?xf32>, tensor<?x?xf32>) outs(%e : tensor<?x?xf32>) {
  ^bb0(%p: f32, %q: f32, %o: f32):
    %t = arith.addf %p, %q : f32
    linalg.yield %t : f32
  } -> tensor<?x?xf32>
  %flat = tensor.collapse_shape %s [[0, 1]] : tensor<?x?xf32> into tensor<?xf32>
  return %flat : tensor<?xf32>
}
"""

#: Reads the first four elements of a dynamic vector: no equality of sizes says what it needs.
SLICE = """
func.func @main(%v: tensor<?xf32>, %w: tensor<4xf32>) -> tensor<4xf32> {
  %s = tensor.extract_slice %v[0] [4] [1] : tensor<?xf32> to tensor<4xf32>
  %e = tensor.empty() : tensor<4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]} ins(%s, %w : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) {
  ^bb0(%p: f32, %q: f32, %o: f32):
    %t = arith.addf %p, %q : f32
    linalg.yield %t : f32
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}
"""


def build(tmp_path, source: str, extra: str = "", name: str = "k"):
    (tmp_path / f"{name}.mlir").write_text(source)
    (tmp_path / "manifest.yaml").write_text(f"bundle: contracts\nkernels:\n  - name: {name}\n    source: {name}.mlir\n{extra}")
    return build_file(tmp_path / "manifest.yaml", tmp_path / "k.pkb")


@pytest.fixture(scope="module")
def matmul_bundle(tmp_path_factory):
    where = tmp_path_factory.mktemp("matmul")
    build(where, MATMUL, name="matmul")
    return where / "k.pkb"


def test_matmul_contract_is_derived_and_shown(matmul_bundle, capsys):
    contract = portkern.load(matmul_bundle).record("matmul").signature.contract
    assert contract == ShapeContract((("M", "K"), ("K", "N")), (("M", "N"),), "ir", names=("a", "b"))
    assert main(["inspect", str(matmul_bundle), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["kernels"][0]
    assert shown["contract_text"] == "(MxK, KxN) -> MxN"
    assert shown["signature"]["contract"] == {"inputs": [["M", "K"], ["K", "N"]], "results": [["M", "N"]], "origin": "ir", "names": ["a", "b"]}
    assert main(["inspect", str(matmul_bundle)]) == 0
    assert "(MxK, KxN) -> MxN" in capsys.readouterr().out


@pytest.mark.parametrize("a, b, got", [((4, 5), (6, 7), "5 in dimension 1, argument 1 has 6"), ((4, 100000), (8, 7), "100000 in dimension 1, argument 1 has 8")])
def test_matmul_refuses_inner_dimensions_that_disagree(matmul_bundle, a, b, got):
    kernel = portkern.load(matmul_bundle).kernel("matmul")
    with pytest.raises(ArgumentShapeError, match=rf"matmul\(\) arguments 0 and 1 disagree on K: argument 0 has {got} in dimension 0"):
        kernel(np.ones(a, np.float32), np.ones(b, np.float32))


def test_matmul_runs_when_the_contract_holds(matmul_bundle, rng):
    kernel = portkern.load(matmul_bundle).kernel("matmul")
    for m, k, n in ((4, 5, 7), (1, 33, 2), (17, 1, 9)):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_elementwise_ties_both_dimensions_and_collapse_gives_the_product(tmp_path, rng):
    built = build(tmp_path, ADD_FLAT, name="add_flat")
    assert str(built.kernel("add_flat").signature.contract) == "(MxK, MxK) -> (M * K)"
    kernel = portkern.load(tmp_path / "k.pkb").kernel("add_flat")
    x, y = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(kernel(x, y), (x + y).ravel(), rtol=1e-6, atol=0)
    with pytest.raises(ArgumentShapeError, match=r"arguments 0 and 1 disagree on K: argument 0 has 5 in dimension 1, argument 1 has 6"):
        kernel(x, np.ones((3, 6), np.float32))


def test_stated_shapes_name_the_symbols(tmp_path):
    built = build(tmp_path, MATMUL, "    shapes: {a: [rows, inner], b: [inner, cols]}\n")
    contract = built.kernels[0].signature.contract
    assert str(contract) == "(rowsxinner, innerxcols) -> rowsxcols" and contract.origin == "stated"


def test_stated_shapes_may_tie_more_than_the_ir(tmp_path):
    built = build(tmp_path, MATMUL, "    shapes: {a: [N, N], b: [N, N]}\n")
    assert str(built.kernels[0].signature.contract) == "(NxN, NxN) -> NxN"
    kernel = portkern.load(tmp_path / "k.pkb").kernel("k")
    with pytest.raises(ArgumentShapeError, match="disagree on N"):
        kernel(np.ones((2, 3), np.float32), np.ones((3, 2), np.float32))


@pytest.mark.parametrize(
    "shapes, message",
    [
        ("{a: [M, K], b: [J, N]}", r"a dimension 1 and .*b dimension 0 different sizes \(K and J\), but the IR makes them equal"),
        ("{a: [M, 3], b: [4, N]}", r"different sizes \(3 and 4\), but the IR makes them equal"),
        ("{a: [M, K, L]}", r"`shapes: a` has 3 dimensions, the IR's type has 2"),
        ("{c: [M, K]}", r"`shapes:` names 'c', which is not an argument or result \(arguments: a, b; results: result0\)"),
        ("{a: [M, K], b: [K, N], result0: [M, K]}", r"b dimension 1 and .*result0 dimension 1 different sizes \(N and K\)"),
    ],
)
def test_stated_shapes_that_contradict_the_ir_are_refused_at_build_time(tmp_path, shapes, message):
    with pytest.raises(BuildError, match=message):
        build(tmp_path, MATMUL, f"    shapes: {shapes}\n")
    assert not (tmp_path / "k.pkb").exists()


def test_stated_size_that_contradicts_a_static_dimension(tmp_path):
    static = MATMUL.replace("tensor<?x?xf32>, %b", "tensor<?x8xf32>, %b").replace("tensor.dim %a, %c0 : tensor<?x?xf32>", "tensor.dim %a, %c0 : tensor<?x8xf32>")
    static = static.replace("ins(%a, %b : tensor<?x?xf32>", "ins(%a, %b : tensor<?x8xf32>")
    with pytest.raises(BuildError, match=r"`shapes: a` dimension 1 is 9, the IR's type says 8"):
        build(tmp_path, static, "    shapes: {a: [M, 9]}\n")
    built = build(tmp_path, static)
    assert str(built.kernels[0].signature.contract) == "(Mx8, 8xK) -> MxK"
    with pytest.raises(ArgumentShapeError, match=r"argument 1 has 9 in dimension 0; the shape contract \(Mx8, 8xK\) -> MxK needs 8"):
        portkern.load(tmp_path / "k.pkb").kernel("k")(np.ones((2, 8), np.float32), np.ones((9, 3), np.float32))


def test_a_static_slice_of_a_dynamic_vector_needs_the_vector_long_enough(tmp_path, rng):
    built = build(tmp_path, SLICE)
    assert built.kernels[0].signature.contract_text == "(M, 4) -> 4 where M >= 4"
    kernel = portkern.load(tmp_path / "k.pkb").kernel("k")
    v, w = rng.standard_normal(10).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(kernel(v, w), v[:4] + w, rtol=1e-6, atol=0)
    with pytest.raises(ArgumentShapeError, match=r"arguments break `M >= 4` \(M=3\)"):
        kernel(v[:3], w)


def test_a_stated_contract_stands_in_for_an_underivable_one(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncheckedShapesWarning)
        built = build(tmp_path, SLICE, "    shapes: {v: [4]}\n")
    assert str(built.kernels[0].signature.contract) == "(4, 4) -> 4"
    with pytest.raises(ArgumentShapeError, match="needs 4"):
        portkern.load(tmp_path / "k.pkb").kernel("k")(np.ones(10, np.float32), np.ones(4, np.float32))


def test_onnx_dim_params_feed_the_contract(tmp_path, rng):
    onnx = pytest.importorskip("onnx", reason="ONNX models need the 'onnx' package")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("MatMul", ["s", "w"], ["z"])],
        "g",
        inputs=[
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "d"]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "d"]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, ["d", "out"]),
        ],
        outputs=[helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", "out"])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(tmp_path / "g.onnx"))
    loaded = portkern.load(one_kernel_bundle(tmp_path, "g.onnx", "g", bundle="onnx"))
    assert str(loaded.record("g").signature.contract) == "(batchxd, batchxd, dxout) -> batchxout"
    kernel = loaded.kernel("g")
    x, y, w = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (3, 4), (4, 2)))
    np.testing.assert_allclose(kernel(x, y, w), (x + y) @ w, rtol=1e-5, atol=1e-5)
    with pytest.raises(ArgumentShapeError, match="arguments 0 and 1 disagree on batch"):
        kernel(x, np.ones((2, 4), np.float32), w)


def test_a_contract_that_does_not_fit_the_signature_is_a_malformed_bundle(matmul_bundle):
    bundle = decode(matmul_bundle.read_bytes())
    for inputs, message in (([["M", "K"]], "has 1 arguments"), ([["M", "K"], ["K", "N", "L"]], "rank 3"), ([["M", 3], ["K", "N"]], None)):
        meta = bundle.meta()
        meta["kernels"][0]["signature"]["contract"]["inputs"] = inputs
        if message is None:
            Signature.from_dict(meta["kernels"][0]["signature"])  # a size where the type is dynamic is a stricter contract
            continue
        with pytest.raises(MalformedBundleError, match=message):
            decode(repack(meta, dict(bundle.blobs)))
    meta = bundle.meta()
    meta["kernels"][0]["signature"]["contract"]["inputs"][0][0] = "../x"
    with pytest.raises(MalformedBundleError, match="bundle schema"):
        decode(repack(meta, dict(bundle.blobs)))
    meta = bundle.meta()
    meta["kernels"][0]["signature"]["contract"]["results"] = [["Z", "N"]]
    with pytest.raises(MalformedBundleError, match="result symbols Z are not bound"):
        decode(repack(meta, dict(bundle.blobs)))


@pytest.mark.parametrize(
    "entry, message",
    [
        ("    shapes: {a: [M, 'x y']}\n", r"kernels\[0\]\.shapes\.a\[1\]: 'x y' is not valid"),
        ("    shapes: {a: [M, -1]}\n", r"kernels\[0\]\.shapes\.a\[1\]: -1 is not valid"),
    ],
)
def test_manifest_shapes_are_validated(tmp_path, entry, message):
    from portkern.base.errors import ManifestError
    from portkern.portable.manifest import load_manifest

    (tmp_path / "k.mlir").write_text(MATMUL)
    (tmp_path / "manifest.yaml").write_text(f"bundle: b\nkernels:\n  - name: k\n    source: k.mlir\n{entry}")
    with pytest.raises(ManifestError, match=message):
        load_manifest(tmp_path / "manifest.yaml")


def test_opencl_kernels_state_shapes_in_their_args(tmp_path):
    from portkern.base.errors import ManifestError
    from portkern.portable.manifest import load_manifest

    (tmp_path / "k.cl").write_text("__kernel void k(__global float* x) {}\n")
    (tmp_path / "manifest.yaml").write_text(
        "bundle: b\nkernels:\n  - name: k\n    source: k.cl\n    shapes: {x: [N]}\n"
        "    args: [{name: x, dtype: float32, role: inout, shape: [N]}]\n    global: [N]\n"
    )
    with pytest.raises(ManifestError, match=r"kernels\[0\]\.shapes: opencl kernels state their shapes in `args:`"):
        load_manifest(tmp_path / "manifest.yaml")


def test_onnx_dim_params_on_dimensions_the_model_fixes_are_only_labels(tmp_path, rng):
    """Exporters name fixed dimensions too, sometimes two of different sizes alike (torch's
    TorchScript exporter on MobileNetV2): the model builds, checked, and computes right."""
    onnx = pytest.importorskip("onnx", reason="ONNX models need the 'onnx' package")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "n"])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(tmp_path / "g.onnx"))
    loaded = portkern.load(one_kernel_bundle(tmp_path, "g.onnx", "g", bundle="onnx"))
    x = rng.standard_normal((1, 7)).astype(np.float32)
    np.testing.assert_allclose(loaded.kernel("g")(x), np.maximum(x, 0), rtol=0, atol=0)
