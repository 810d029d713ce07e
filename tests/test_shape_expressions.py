"""Shape contracts with expressions: sizes computed from other sizes (a convolution's output, a
slice sized by another argument, a position table sliced by the sequence length) are derived
as conditions and result expressions, checked before a call runs; a kernel whose contract
cannot be derived is refused at build time unless its manifest says `unchecked: true`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import portkern
from portkern.base.errors import ArgumentShapeError, BuildError
from portkern.portable.builder import build_file
from portkern.portable.bundle import read_bundle
from portkern.portable.contract import UncheckedShapesWarning

#: out[i] = sum_j x[i + j] * w[j], with len(out) = len(x) - len(w) + 1.
CONV1D = """
func.func @main(%x: tensor<?xf32>, %w: tensor<?xf32>) -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = tensor.dim %x, %c0 : tensor<?xf32>
  %k = tensor.dim %w, %c0 : tensor<?xf32>
  %d = arith.subi %n, %k : index
  %o = arith.addi %d, %c1 : index
  %e = tensor.empty(%o) : tensor<?xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<?xf32>) -> tensor<?xf32>
  %r = linalg.conv_1d ins(%x, %w : tensor<?xf32>, tensor<?xf32>) outs(%f : tensor<?xf32>) -> tensor<?xf32>
  return %r : tensor<?xf32>
}
"""

#: A window of len(w) moved by 2 (pooling's indexing, `2 * d0 + d1`): len(out) = (len(x) - len(w)) // 2 + 1.
STRIDED = """
func.func @main(%x: tensor<?xf32>, %w: tensor<?xf32>) -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %n = tensor.dim %x, %c0 : tensor<?xf32>
  %k = tensor.dim %w, %c0 : tensor<?xf32>
  %d = arith.subi %n, %k : index
  %h = arith.divsi %d, %c2 : index
  %o = arith.addi %h, %c1 : index
  %e = tensor.empty(%o) : tensor<?xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<?xf32>) -> tensor<?xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0 * 2 + d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0)>],
                       iterator_types = ["parallel", "reduction"]} ins(%x, %w : tensor<?xf32>, tensor<?xf32>) outs(%f : tensor<?xf32>) {
  ^bb0(%p: f32, %q: f32, %acc: f32):
    %t = arith.mulf %p, %q : f32
    %u = arith.addf %acc, %t : f32
    linalg.yield %u : f32
  } -> tensor<?xf32>
  return %r : tensor<?xf32>
}
"""

#: a[:len(b)] + b.
SLICE_BY_OTHER = """
func.func @main(%a: tensor<?xf32>, %b: tensor<?xf32>) -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %b, %c0 : tensor<?xf32>
  %s = tensor.extract_slice %a[0] [%n] [1] : tensor<?xf32> to tensor<?xf32>
  %e = tensor.empty(%n) : tensor<?xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]} ins(%s, %b : tensor<?xf32>, tensor<?xf32>) outs(%e : tensor<?xf32>) {
  ^bb0(%p: f32, %q: f32, %o: f32):
    %t = arith.addf %p, %q : f32
    linalg.yield %t : f32
  } -> tensor<?xf32>
  return %r : tensor<?xf32>
}
"""

#: v[:i] for i read from data: the result's size is data, which no contract can check.
TAKE = """
func.func @main(%v: tensor<?xf32>, %i: tensor<i32>) -> tensor<?xf32> {
  %iv = tensor.extract %i[] : tensor<i32>
  %ii = arith.index_cast %iv : i32 to index
  %x = tensor.extract_slice %v[0] [%ii] [1] : tensor<?xf32> to tensor<?xf32>
  return %x : tensor<?xf32>
}
"""

#: Elementwise integer division a / b (arithmetic on data inside a linalg.generic, no size's).
DIVIDE = """
func.func @main(%a: tensor<?xi32>, %b: tensor<?xi32>) -> tensor<?xi32> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %a, %c0 : tensor<?xi32>
  %e = tensor.empty(%n) : tensor<?xi32>
  %q = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]} ins(%a, %b : tensor<?xi32>, tensor<?xi32>) outs(%e : tensor<?xi32>) {
  ^bb0(%x: i32, %y: i32, %o: i32):
    %h = arith.divsi %x, %y : i32
    linalg.yield %h : i32
  } -> tensor<?xi32>
  return %q : tensor<?xi32>
}
"""

#: v[i] for a runtime index i (clamped into v): the kernel needs v not empty.
PICK = """
func.func @main(%v: tensor<?xf32>, %i: tensor<i32>) -> tensor<1xf32> {
  %iv = tensor.extract %i[] : tensor<i32>
  %ii = arith.index_cast %iv : i32 to index
  %x = tensor.extract %v[%ii] : tensor<?xf32>
  %r = tensor.from_elements %x : tensor<1xf32>
  return %r : tensor<1xf32>
}
"""


def build(where, source: str, extra: str = ""):
    (where / "k.mlir").write_text(source)
    (where / "manifest.yaml").write_text(f"bundle: exprs\nkernels:\n  - name: k\n    source: k.mlir\n{extra}")
    return build_file(where / "manifest.yaml", where / "k.pkb")


@pytest.fixture(scope="module")
def conv_bundle(tmp_path_factory):
    where = tmp_path_factory.mktemp("conv")
    build(where, CONV1D)
    return where / "k.pkb"


@pytest.fixture(scope="module")
def slice_bundle(tmp_path_factory):
    where = tmp_path_factory.mktemp("slice")
    build(where, SLICE_BY_OTHER)
    return where / "k.pkb"


def test_conv1d_contract_has_the_output_size_and_its_condition(conv_bundle, rng):
    bundle = read_bundle(conv_bundle)
    assert bundle.version == (1, 4)
    contract = bundle.kernels[0].signature.contract
    assert str(contract) == "(M, K) -> (M - K + 1) where M - K + 1 >= 0"
    kernel = portkern.load(conv_bundle).kernel("k")
    for n, k in ((10, 3), (7, 7), (5, 1)):
        x, w = rng.standard_normal(n).astype(np.float32), rng.standard_normal(k).astype(np.float32)
        np.testing.assert_allclose(kernel(x, w), np.correlate(x, w, mode="valid"), rtol=1e-5, atol=1e-5)


def test_conv1d_with_a_filter_longer_than_its_input_is_refused(conv_bundle):
    kernel = portkern.load(conv_bundle).kernel("k")
    with pytest.raises(ArgumentShapeError, match=r"k\(\) arguments break `M - K \+ 1 >= 0` \(K=9, M=4\)"):
        kernel(np.ones(4, np.float32), np.ones(9, np.float32))


def test_a_strided_window_needs_its_last_step_inside_the_input(tmp_path, rng):
    built = build(tmp_path, STRIDED)
    contract = built.kernels[0].signature.contract
    assert str(contract).startswith("(M, K) -> ((M - K) // 2 + 1) where M - K >= 0")
    kernel = portkern.load(tmp_path / "k.pkb").kernel("k")
    for n, k in ((11, 3), (10, 3), (4, 4)):
        x, w = rng.standard_normal(n).astype(np.float32), rng.standard_normal(k).astype(np.float32)
        want = np.array([x[2 * i : 2 * i + k] @ w for i in range((n - k) // 2 + 1)], np.float32)
        np.testing.assert_allclose(kernel(x, w), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ArgumentShapeError, match=r"break `M - K >= 0` \(K=6, M=5\)"):
        kernel(np.ones(5, np.float32), np.ones(6, np.float32))


def test_slice_sized_by_another_argument(slice_bundle, rng):
    assert str(read_bundle(slice_bundle).kernels[0].signature.contract) == "(M, K) -> K where K <= M"
    kernel = portkern.load(slice_bundle).kernel("k")
    a, b = rng.standard_normal(12).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose(kernel(a, b), a[:5] + b, rtol=1e-6, atol=0)
    np.testing.assert_allclose(kernel(a, a), a + a, rtol=1e-6, atol=0)
    with pytest.raises(ArgumentShapeError, match=r"arguments break `K <= M` \(K=6, M=5\)"):
        kernel(a[:5], np.ones(6, np.float32))


def test_ten_million_long_arguments_are_refused_in_a_process_that_survives(conv_bundle, slice_bundle, tmp_path):
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        import portkern
        from portkern.base.errors import ArgumentShapeError
        long, short = np.ones(10**7, np.float32), np.ones(5, np.float32)
        for path in sys.argv[1:]:
            try:
                portkern.load(path).kernel("k")(short, long)
            except ArgumentShapeError as exc:
                print("refused", str(exc)[:60])
            else:
                print("ran")
        """
    )
    env_python = sys.executable
    done = subprocess.run([env_python, "-c", script, str(conv_bundle), str(slice_bundle)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["refused", "refused"]


def test_a_kernel_without_a_derivable_contract_is_refused_with_the_shapes_hint(tmp_path):
    with pytest.raises(BuildError, match=r"kernel 'k': its shape contract cannot be derived \(.*tensor\.extract.*\).*`shapes: .*`unchecked: true`"):
        build(tmp_path, TAKE)


def test_a_runtime_index_needs_its_dimension_not_empty(tmp_path):
    """A runtime index is clamped into its tensor (docs/shapes.md), so all a kernel needs of the
    indexed dynamic dimension is that it is not empty."""
    built = build(tmp_path, PICK)
    assert str(built.kernels[0].signature.contract) == "(M, scalar) -> 1 where M >= 1"
    kernel = portkern.load(tmp_path / "k.pkb").kernel("k")
    v = np.arange(6, dtype=np.float32) - 2
    for i, want in ((3, v[3]), (-4, v[0]), (99, v[5])):
        assert kernel(v, np.array(i, np.int32)).tolist() == [want]
    assert kernel(v[:1], np.array(5, np.int32)).tolist() == [v[0]]
    with pytest.raises(ArgumentShapeError, match=r"k\(\) arguments break `M >= 1` \(M=0\)"):
        kernel(v[:0], np.array(0, np.int32))


def test_integer_division_on_data_is_no_size_arithmetic(tmp_path, rng):
    built = build(tmp_path, DIVIDE)
    assert str(built.kernels[0].signature.contract) == "(M, M) -> M"
    kernel = portkern.load(tmp_path / "k.pkb").kernel("k")
    a = rng.integers(-1000, 1000, 37).astype(np.int32)
    b = rng.integers(1, 50, 37).astype(np.int32) * rng.choice(np.array([-1, 1], np.int32), 37)
    np.testing.assert_array_equal(kernel(a, b), np.trunc(a / b).astype(np.int32))
    with pytest.raises(ArgumentShapeError, match="disagree on M"):
        kernel(a, b[:36])


def test_unchecked_true_builds_and_inspect_load_and_the_first_call_say_so(tmp_path, capsys):
    with pytest.warns(UncheckedShapesWarning, match="built unchecked"):
        built = build(tmp_path, PICK, "    unchecked: true\n")
    assert built.kernels[0].signature.contract_text == "unchecked (no shape contract)"
    from portkern.cli.main import main

    assert main(["inspect", str(tmp_path / "k.pkb")]) == 0
    assert "unchecked" in capsys.readouterr().out
    with pytest.warns(UncheckedShapesWarning, match="no shape contract"):
        kernel = portkern.load(tmp_path / "k.pkb").kernel("k")
    v = np.arange(6, dtype=np.float32)
    with pytest.warns(UncheckedShapesWarning, match=r"k\(\) has no shape contract"):
        assert kernel(v, np.array(2, np.int32))[0] == 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncheckedShapesWarning)
        assert kernel(v, np.array(3, np.int32))[0] == 3.0  # reported once


def test_stated_result_expression_and_constraints(tmp_path, rng):
    built = build(tmp_path, CONV1D, '    shapes: {x: [n], w: [k], result0: ["n - k + 1"]}\n    constraints: ["k >= 1"]\n')
    contract = built.kernels[0].signature.contract
    assert str(contract) == "(n, k) -> (n - k + 1) where n - k + 1 >= 0, k >= 1"
    kernel = portkern.load(tmp_path / "k.pkb").kernel("k")
    x = rng.standard_normal(9).astype(np.float32)
    np.testing.assert_allclose(kernel(x, x[:4]), np.correlate(x, x[:4], mode="valid"), rtol=1e-5, atol=1e-5)
    with pytest.raises(ArgumentShapeError, match=r"break `k >= 1` \(k=0\)"):
        kernel(x, x[:0])


def test_a_position_table_sliced_by_the_sequence_length(tmp_path, rng):
    onnx = pytest.importorskip("onnx", reason="ONNX models need the 'onnx' package")
    from onnx import TensorProto, helper, numpy_helper

    table = rng.standard_normal((16, 8)).astype(np.float32)
    consts = [numpy_helper.from_array(table, "pos"), numpy_helper.from_array(np.array(0, np.int64), "zero"),
              numpy_helper.from_array(np.array([0], np.int64), "axes"), numpy_helper.from_array(np.array([0], np.int64), "starts")]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["seq"], axis=0),
        helper.make_node("Unsqueeze", ["seq", "axes"], ["end"]),
        helper.make_node("Slice", ["pos", "starts", "end", "axes"], ["p"]),
        helper.make_node("Add", ["x", "p"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "positions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", 8])], consts)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    (tmp_path / "manifest.yaml").write_text("bundle: gpt\nkernels:\n  - name: k\n    source: m.onnx\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncheckedShapesWarning)
        built = build_file(tmp_path / "manifest.yaml", tmp_path / "k.pkb")
    assert str(built.kernels[0].signature.contract) == "(seqx8) -> seqx8 where seq <= 16"
    kernel = portkern.load(tmp_path / "k.pkb").kernel("k")
    x = rng.standard_normal((5, 8)).astype(np.float32)
    np.testing.assert_allclose(kernel(x), x + table[:5], rtol=1e-6, atol=0)
    with pytest.raises(ArgumentShapeError, match=r"break `seq <= 16` \(seq=17\)"):
        kernel(np.ones((17, 8), np.float32))


def test_a_stated_contract_stands_in_for_an_underivable_one(tmp_path):
    built = build(tmp_path, TAKE, "    shapes: {v: [n]}\n")
    assert str(built.kernels[0].signature.contract) == "(n, scalar) -> ?"


def gather_model(onnx):
    """data[indices] along axis 0, both inputs of the model, data with a dynamic length."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Gather", ["data", "indices"], ["out"], axis=0)],
        "pick",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["n"]), helper.make_tensor_value_info("indices", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def take_model(onnx):
    """data[starts:ends], all three inputs of the model: the result's length is data."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Slice", ["data", "starts", "ends"], ["out"])],
        "take",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["n"]), helper.make_tensor_value_info("starts", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("ends", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["m"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_onnx_prepare_takes_the_manifest_shape_choices(tmp_path, store):
    onnx = pytest.importorskip("onnx", reason="ONNX models need the 'onnx' package")
    import portkern.onnx

    model = take_model(onnx)
    with pytest.raises(BuildError, match=r"cannot be derived.*unchecked=True"):
        portkern.onnx.prepare(model, "CPU", store=store)
    data = np.arange(5, dtype=np.float32)
    with pytest.warns(UncheckedShapesWarning):  # at load and at the first call
        rep = portkern.onnx.prepare(model, "CPU", store=store, unchecked=True)
        np.testing.assert_array_equal(rep.run([data, np.array([1]), np.array([4])])[0], data[1:4])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncheckedShapesWarning)  # a Gather's indices are clamped: its contract is derived
        rep = portkern.onnx.prepare(gather_model(onnx), "CPU", store=store)
        np.testing.assert_array_equal(rep.run([data, np.array([4, 1])])[0], data[[4, 1]])
        with pytest.raises(ArgumentShapeError, match=r"`n >= 1` \(n=0\)"):
            rep.run([data[:0], np.array([0, 0])])


def test_conditions_need_format_1_4_and_must_name_symbols(conv_bundle):
    from test_bundle_format import repack

    from portkern.base.errors import MalformedBundleError
    from portkern.portable.bundle import decode

    bundle = decode(conv_bundle.read_bytes())
    with pytest.raises(MalformedBundleError, match=r"contract conditions and result expressions need format 1\.4; the header says 1\.3"):
        decode(repack(bundle.meta(), dict(bundle.blobs), minor=3))
    meta = bundle.meta()
    meta["kernels"][0]["signature"]["contract"]["requires"] = ["Z <= M"]
    with pytest.raises(MalformedBundleError, match="names Z, not a symbol"):
        decode(repack(meta, dict(bundle.blobs)))
    meta["kernels"][0]["signature"]["contract"]["requires"] = ["__import__('os') == 0"]
    with pytest.raises(MalformedBundleError, match="bundle schema"):
        decode(repack(meta, dict(bundle.blobs)))
