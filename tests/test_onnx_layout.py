"""MatMul and Gemm weights stored transposed, boolean parameters stored as bytes
(`portable.onnx_layout`): the same results as the model as written (NumPy reference), the
bundle's parameter holding the transpose (the bytes), and weights with any other use left as
they are."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX models need the 'onnx' package")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import portkern  # noqa: E402
from portkern.jit import devices  # noqa: E402
from portkern.jit.runtime import Executable  # noqa: E402
from portkern.portable import bundle as fmt  # noqa: E402
from portkern.portable.builder import build_file  # noqa: E402
from portkern.portable.onnx_layout import BYTES_PREFIX, NODE_PREFIX, TRANSPOSED_KEY, bool_parameters_as_bytes, transpose_matmul_weights  # noqa: E402
from portkern.portable.parameters import transposed_file_pieces  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5
THRESHOLD = 256


def weights(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


def save(model, where: Path, external: bool = False) -> Path:
    """The model and its manifest in `where` (its large initializers in `m.onnx.data` if `external`)."""
    import onnx

    where.mkdir(parents=True, exist_ok=True)
    if external:
        onnx.save_model(model, where / "m.onnx", save_as_external_data=True, location="m.onnx.data", size_threshold=1024)
    else:
        onnx.save_model(model, where / "m.onnx")
    (where / "manifest.yaml").write_text("bundle: layout\nkernels:\n  - name: net\n    source: m.onnx\n")
    return where / "manifest.yaml"


def model_of(nodes, inputs, outputs, initializers):
    graph = helper.make_graph(nodes, "net", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def value(name: str, shape) -> object:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


W = weights(1, (96, 40))
G = weights(2, (40, 300))
C = weights(3, (300,))


def matmul_gemm_model():
    """y = Gemm(MatMul(x, W), G, C) with x of rank 3 (MatMul broadcasts; Gemm takes 2-D)."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Reshape", ["h", "shape"], ["h2"]),
        helper.make_node("Gemm", ["h2", "G", "C"], ["y"], alpha=0.5),
    ]
    shape = numpy_helper.from_array(np.array([-1, 40], dtype=np.int64), "shape")
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(G, "G"), numpy_helper.from_array(C, "C"), shape]
    return model_of(nodes, [value("x", [2, 3, 96])], [value("y", [6, 300])], inits)


def expected(x: np.ndarray) -> np.ndarray:
    return 0.5 * ((x @ W).reshape(-1, 40) @ G) + C


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external-data"])
def test_matmul_and_gemm_weights_are_stored_transposed_and_results_match_numpy(tmp_path, store, external):
    out = tmp_path / "m.pkb"
    build_file(save(matmul_gemm_model(), tmp_path / "model", external), out)
    loaded = portkern.load(out, store=store)
    section, record = loaded.bundle.parameters, loaded.record("net")
    stored = {p.name: p for p in record.parameters}
    with open(out, "rb") as f:
        for name, original in (("W", W), ("G", G)):
            f.seek(section.offset + stored[name].offset)
            held = np.frombuffer(f.read(stored[name].size), dtype=np.float32)
            np.testing.assert_array_equal(held, original.T.ravel())  # the transpose, exactly
        f.seek(section.offset + stored["C"].offset)
        np.testing.assert_array_equal(np.frombuffer(f.read(stored["C"].size), dtype=np.float32), C)  # a bias: as it is
    x = np.random.default_rng(7).standard_normal((2, 3, 96), dtype=np.float32)
    np.testing.assert_allclose(loaded.kernel("net")(x), expected(x), rtol=RTOL, atol=ATOL)


def test_inline_and_external_data_models_give_the_same_parameters(tmp_path):
    a, b = tmp_path / "a.pkb", tmp_path / "b.pkb"
    build_file(save(matmul_gemm_model(), tmp_path / "a"), a)
    build_file(save(matmul_gemm_model(), tmp_path / "b", external=True), b)
    assert fmt.read_bundle(a).parameters.root == fmt.read_bundle(b).parameters.root


def test_a_weight_with_another_use_keeps_its_layout(tmp_path, store):
    """W is MatMul's right side and also added to an output: it stays (K, N), and so do a
    right side with transB=1 already and a weight that is a graph output."""
    sq = weights(4, (40, 40))
    nodes = [
        helper.make_node("MatMul", ["x", "S"], ["h"]),
        helper.make_node("Add", ["h", "S"], ["a"]),
        helper.make_node("Gemm", ["a", "T"], ["y"], transB=1),
        helper.make_node("Identity", ["S"], ["s_out"]),
    ]
    model = model_of(nodes, [value("x", [40, 40])], [value("y", [40, 40]), value("s_out", [40, 40])],
                     [numpy_helper.from_array(sq, "S"), numpy_helper.from_array(sq * 2, "T")])
    assert transpose_matmul_weights(model_of(nodes[:3], [], [], [numpy_helper.from_array(sq, "S"), numpy_helper.from_array(sq * 2, "T")]), THRESHOLD) == []
    out = tmp_path / "m.pkb"
    build_file(save(model, tmp_path / "model"), out)
    x = np.random.default_rng(8).standard_normal((40, 40), dtype=np.float32)
    y, s_out = portkern.load(out, store=store).kernel("net")(x)
    np.testing.assert_allclose(y, (x @ sq + sq) @ (sq * 2).T, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(s_out, sq)


def test_the_rewrite_marks_external_weights_and_shares_one_transpose_per_weight():
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"]), helper.make_node("MatMul", ["a2", "W"], ["b"]),
             helper.make_node("MatMul", ["x", "small"], ["c"])]
    small = numpy_helper.from_array(np.ones((4, 4), np.float32), "small")  # under the threshold: left alone
    external = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[96, 40], data_location=TensorProto.EXTERNAL)
    for key, text in (("location", "w.bin"), ("offset", "0"), ("length", str(W.nbytes))):
        entry = external.external_data.add()
        entry.key, entry.value = key, text
    model = model_of(nodes, [], [], [external, small])
    assert transpose_matmul_weights(model, THRESHOLD) == ["W"]
    tensor = model.graph.initializer[0]
    assert list(tensor.dims) == [40, 96] and any(e.key == TRANSPOSED_KEY for e in tensor.external_data)
    transposes = [n for n in model.graph.node if n.op_type == "Transpose"]
    assert len(transposes) == 1 and model.graph.node[0].op_type == "Transpose"
    assert [n.input[1] for n in model.graph.node if n.op_type == "MatMul"] == [NODE_PREFIX + "W", NODE_PREFIX + "W", "small"]
    assert transpose_matmul_weights(model, THRESHOLD) == []  # once only


@pytest.mark.parametrize("rows, cols, itemsize, offset", [(97, 61, 4, 13), (3, 70000, 2, 4096), (300, 5, 8, 0), (1, 1, 4, 1)])
def test_transposed_file_pieces_stream_the_exact_transpose(tmp_path, rows, cols, itemsize, offset, monkeypatch):
    from portkern.portable import parameters

    monkeypatch.setattr(parameters, "TRANSPOSE_BYTES", 4096)  # many blocks, and tiles within them
    monkeypatch.setattr(parameters, "COPY_BYTES", 1024)
    monkeypatch.setattr(parameters, "TRANSPOSE_TILE_ROWS", 7)
    data = np.random.default_rng(rows).integers(0, 255, rows * cols * itemsize, dtype=np.uint8)
    path = tmp_path / "w.bin"
    path.write_bytes(b"\x01" * offset + data.tobytes() + b"\x02" * 5)
    pieces = [bytes(p) for p in transposed_file_pieces(path, offset, rows, cols, itemsize)()]
    matrix = data.reshape(rows, cols, itemsize)
    assert hashlib.sha256(b"".join(pieces)).digest() == hashlib.sha256(matrix.transpose(1, 0, 2).tobytes()).digest()
    assert max(len(p) for p in pieces) <= max(4096, rows * itemsize)


MASK = np.tril(np.ones((1, 1, 128, 128), dtype=bool))


def masked_attention_model(as_constant: bool):
    """softmax(q @ k + where(mask, 0, -1e9)) with a boolean 128x128 causal mask, an initializer or
    (`as_constant`) a Constant node's value: the pattern of transformers' attention exports."""
    mask = numpy_helper.from_array(MASK, "mask")
    nodes = [
        helper.make_node("MatMul", ["q", "k"], ["s"]),
        helper.make_node("Where", ["mask", "zero", "neg"], ["bias"]),
        helper.make_node("Add", ["s", "bias"], ["t"]),
        helper.make_node("Softmax", ["t"], ["y"], axis=-1),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.float32), "zero"), numpy_helper.from_array(np.array(-1e9, np.float32), "neg")]
    if as_constant:
        nodes.insert(0, helper.make_node("Constant", [], ["mask"], value=mask))
    else:
        inits.append(mask)
    return model_of(nodes, [value("q", [1, 2, 128, 32]), value("k", [1, 2, 32, 128])], [value("y", [1, 2, 128, 128])], inits)


def masked_attention(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    s = q.astype(np.float64) @ k + np.where(MASK, 0.0, -1e9)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("as_constant, external", [(False, False), (False, True), (True, False)],
                         ids=["initializer", "initializer-external-data", "constant-node"])
def test_a_boolean_mask_is_stored_as_bytes_and_builds_with_data_tiling(tmp_path, store, as_constant, external):
    """IREE 3.13 cannot build an `i1` parameter with data tiling ("buffer and tensor shapes must be
    compatible"): the mask is a UINT8 parameter of the same bytes, cast back in the code, and the
    default and data-tiled code both match NumPy."""
    out = tmp_path / "m.pkb"
    build_file(save(masked_attention_model(as_constant), tmp_path / "model", external), out)
    loaded = portkern.load(out, store=store)
    section, record = loaded.bundle.parameters, loaded.record("net")
    (stored,) = record.parameters
    assert stored.name == BYTES_PREFIX + "mask"
    with open(out, "rb") as f:
        f.seek(section.offset + stored.offset)
        np.testing.assert_array_equal(np.frombuffer(f.read(stored.size), dtype=np.uint8), MASK.astype(np.uint8).ravel())
    rng = np.random.default_rng(9)
    q, k = rng.standard_normal((1, 2, 128, 32), dtype=np.float32), rng.standard_normal((1, 2, 32, 128), dtype=np.float32)
    target = devices.resolve("cpu", store)
    for config in ("default", "data-tiling"):
        code = loaded.native(record, target, config).data
        (got,) = Executable(code, record.entry, target.driver, loaded.parameters_for(record))(q, k)
        np.testing.assert_allclose(got, masked_attention(q, k), rtol=RTOL, atol=ATOL, err_msg=config)


def test_the_bytes_rewrite_leaves_small_and_input_tensors_and_keeps_the_names_consumers_read():
    small = numpy_helper.from_array(np.ones((4, 4), dtype=bool), "small")  # under the threshold: left alone
    given = numpy_helper.from_array(np.ones((32, 32), dtype=bool), "given")  # a graph input's default: left alone
    nodes = [helper.make_node("And", ["mask", "small"], ["a"]), helper.make_node("And", ["a", "given"], ["b"])]
    model = model_of(nodes, [helper.make_tensor_value_info("given", TensorProto.BOOL, [32, 32])], [],
                     [numpy_helper.from_array(MASK[0, 0, :32, :32].copy(), "mask"), small, given])
    assert bool_parameters_as_bytes(model, THRESHOLD) == ["mask"]
    types = {t.name: t.data_type for t in model.graph.initializer}
    assert types == {BYTES_PREFIX + "mask": TensorProto.UINT8, "small": TensorProto.BOOL, "given": TensorProto.BOOL}
    cast = model.graph.node[0]
    assert (cast.op_type, list(cast.input), list(cast.output)) == ("Cast", [BYTES_PREFIX + "mask"], ["mask"])
    assert [list(n.input) for n in model.graph.node[1:]] == [["mask", "small"], ["a", "given"]]
    assert bool_parameters_as_bytes(model, THRESHOLD) == []  # once only
