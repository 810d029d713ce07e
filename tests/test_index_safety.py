"""Index safety (portable/index_safety.py; docs/shapes.md "Indices chosen at run time"): a kernel
that indexes a tensor by a runtime value (`tensor.extract`, a gather in a `linalg.generic`,
`tensor.insert`, a slice at a runtime offset, ONNX Gather) reads and writes inside its tensors
for every index: in-range indices give NumPy's result, out-of-range ones the clamped index's,
and the process survives (each case runs in a child process), also where a device compiles the
kernel from its source stage. Integer division by a runtime zero gives 0 instead of SIGFPE."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from portkern.portable import index_safety
from portkern.portable.compiler import Compiler, bytecode
from portkern.portable.contract import UncheckedShapesWarning
from portkern.portable.lower import BUILD_FLAGS, PORTABLE_PHASE

ROW = """
func.func @row(%t: tensor<?x4xf32>, %i: tensor<i64>) -> tensor<4xf32> {
  %iv = tensor.extract %i[] : tensor<i64>
  %ix = arith.index_cast %iv : i64 to index
  %r = tensor.extract_slice %t[%ix, 0] [1, 4] [1, 1] : tensor<?x4xf32> to tensor<4xf32>
  return %r : tensor<4xf32>
}
"""

ELEMENT = """
func.func @element(%t: tensor<?xf32>, %i: tensor<i64>) -> tensor<f32> {
  %iv = tensor.extract %i[] : tensor<i64>
  %ix = arith.index_cast %iv : i64 to index
  %v = tensor.extract %t[%ix] : tensor<?xf32>
  %r = tensor.from_elements %v : tensor<f32>
  return %r : tensor<f32>
}
"""

GATHER = """
func.func @gather(%t: tensor<?x4xf32>, %idx: tensor<?xi64>) -> tensor<?x4xf32> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %idx, %c0 : tensor<?xi64>
  %e = tensor.empty(%n) : tensor<?x4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%idx : tensor<?xi64>) outs(%e : tensor<?x4xf32>) {
  ^bb0(%k: i64, %o: f32):
    %j = linalg.index 1 : index
    %ki = arith.index_cast %k : i64 to index
    %v = tensor.extract %t[%ki, %j] : tensor<?x4xf32>
    linalg.yield %v : f32
  } -> tensor<?x4xf32>
  return %r : tensor<?x4xf32>
}
"""

WINDOW = """
func.func @window(%t: tensor<?xf32>, %i: tensor<i64>) -> tensor<3xf32> {
  %iv = tensor.extract %i[] : tensor<i64>
  %ix = arith.index_cast %iv : i64 to index
  %r = tensor.extract_slice %t[%ix] [3] [2] : tensor<?xf32> to tensor<3xf32>
  return %r : tensor<3xf32>
}
"""

PUT = """
func.func @put(%t: tensor<?xf32>, %i: tensor<i64>) -> tensor<?xf32> {
  %iv = tensor.extract %i[] : tensor<i64>
  %ix = arith.index_cast %iv : i64 to index
  %one = arith.constant -1.0 : f32
  %r = tensor.insert %one into %t[%ix] : tensor<?xf32>
  return %r : tensor<?xf32>
}
"""

DIVIDE = """
func.func @divide(%a: tensor<6xi32>, %b: tensor<6xi32>) -> (tensor<6xi32>, tensor<6xi32>, tensor<6xi32>) {
  %e = tensor.empty() : tensor<6xi32>
  %q, %r, %u = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>,
                                              affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]}
      ins(%a, %b : tensor<6xi32>, tensor<6xi32>) outs(%e, %e, %e : tensor<6xi32>, tensor<6xi32>, tensor<6xi32>) {
  ^bb0(%x: i32, %y: i32, %o: i32, %p: i32, %s: i32):
    %d = arith.divsi %x, %y : i32
    %m = arith.remsi %x, %y : i32
    %v = arith.divui %x, %y : i32
    linalg.yield %d, %m, %v : i32, i32, i32
  } -> (tensor<6xi32>, tensor<6xi32>, tensor<6xi32>)
  return %q, %r, %u : tensor<6xi32>, tensor<6xi32>, tensor<6xi32>
}
"""

#: Indices tried: in range, negative, one past the end, far past it (2^40) and far below.
INDICES = (0, 5, -3, 8, 1 << 40, -(1 << 40))
TABLE = np.arange(32, dtype=np.float32).reshape(8, 4) * 1.5 - 7

CHILD = r"""
import json, sys
import numpy as np
import portkern

bundle = portkern.load(sys.argv[1])
table = np.arange(32, dtype=np.float32).reshape(8, 4) * 1.5 - 7
flat = table.reshape(-1)[:8].copy()
out = {}
for i in json.loads(sys.argv[2]):
    index = np.array(i, np.int64)
    out[str(i)] = {
        "row": bundle.kernel("row")(table, index).tolist(),
        "element": bundle.kernel("element")(flat, index).tolist(),
        "gather": bundle.kernel("gather")(table, np.array([i, 2, i], np.int64)).tolist(),
        "window": bundle.kernel("window")(flat, index).tolist(),
        "put": bundle.kernel("put")(flat, index).tolist(),
    }
    print(json.dumps({"done": i}), flush=True)
a = np.array([7, -7, 9, -(1 << 31), -(1 << 31), 5], np.int32)
b = np.array([2, 2, 0, -1, 0, -5], np.int32)
out["divide"] = [r.tolist() for r in bundle.kernel("divide")(a, b)]
print(json.dumps(out))
"""


def clamped(i: int, n: int) -> int:
    return min(max(i, 0), n - 1)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    where = tmp_path_factory.mktemp("index_safety")
    sources = {"row": ROW, "element": ELEMENT, "gather": GATHER, "window": WINDOW, "put": PUT, "divide": DIVIDE}
    lines = ["bundle: index_safety", "kernels:"]
    for kernel, text in sources.items():
        (where / f"{kernel}.mlir").write_text(text)
        lines += [f"  - name: {kernel}", f"    source: {kernel}.mlir"]
    (where / "index_safety.yaml").write_text("\n".join(lines) + "\n")
    from portkern.portable.builder import build_file

    with warnings.catch_warnings():
        warnings.simplefilter("error", UncheckedShapesWarning)  # every kernel gets a contract
        build_file(where / "index_safety.yaml", where / "index_safety.pkb")
    return where / "index_safety.pkb"


#: The contracts derived: a runtime index into a dynamic dimension needs it not empty (a strided
#: window of three elements at a runtime offset: five elements); the index itself is clamped.
CONTRACTS = {
    "row": "(Mx4, scalar) -> 4 where M >= 1",
    "element": "(M, scalar) -> scalar where M >= 1",
    "gather": "(Mx4, K) -> Kx4 where M >= 1",
    "window": "(M, scalar) -> 3 where M >= 5",
    "put": "(M, scalar) -> M where M >= 1",
    "divide": "(6, 6) -> (6, 6, 6)",
}

EMPTY_CHILD = r"""
import json, sys
import numpy as np
import portkern
from portkern.base.errors import ArgumentShapeError

bundle = portkern.load(sys.argv[1])
calls = {
    "row": (np.zeros((0, 4), np.float32), np.array(0, np.int64)),
    "element": (np.zeros(0, np.float32), np.array(0, np.int64)),
    "gather": (np.zeros((0, 4), np.float32), np.array([0, 1], np.int64)),
    "window": (np.zeros(4, np.float32), np.array(0, np.int64)),
    "put": (np.zeros(0, np.float32), np.array(-5, np.int64)),
}
out = {}
for name, args in calls.items():
    try:
        bundle.kernel(name)(*args)
    except ArgumentShapeError as exc:
        out[name] = str(exc)
    else:
        out[name] = "ran"
out["window5"] = bundle.kernel("window")(np.arange(5, dtype=np.float32), np.array(1 << 40, np.int64)).tolist()
print(json.dumps(out))
"""


def run_child(script: str, *argv: str, cache_dir) -> dict:
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-4000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_runtime_indices_read_and_write_inside_their_tensors(bundle, tmp_path):
    """In range: NumPy's result. Out of range (-3, one past the end, 2^40, -2^40): the result at the
    index clamped into [0, n - 1] (a slice's offset: into [0, n - span]), and the process lives."""
    found = run_child(CHILD, str(bundle), json.dumps(INDICES), cache_dir=tmp_path / "cache")
    flat = TABLE.reshape(-1)[:8]
    for i in INDICES:
        got = found[str(i)]
        row = clamped(i, 8)
        np.testing.assert_array_equal(got["row"], TABLE[row], err_msg=str(i))
        np.testing.assert_array_equal(got["element"], flat[row], err_msg=str(i))
        np.testing.assert_array_equal(got["gather"], TABLE[[row, 2, row]], err_msg=str(i))
        start = min(max(i, 0), 8 - 5)  # three elements at stride 2 span five
        np.testing.assert_array_equal(got["window"], flat[start : start + 5 : 2], err_msg=str(i))
        put = flat.copy()
        put[row] = -1
        np.testing.assert_array_equal(got["put"], put, err_msg=str(i))
    quotient, remainder, unsigned = found["divide"]
    assert quotient == [3, -3, 0, -(1 << 31), 0, -1]  # truncating; x / 0 -> 0; INT_MIN / -1 wraps to INT_MIN
    assert remainder == [1, -1, 0, 0, 0, 0]
    a = np.array([7, -7, 9, -(1 << 31), -(1 << 31), 5], np.int32).view(np.uint32).astype(np.int64)
    b = np.array([2, 2, 0, -1, 0, -5], np.int32).view(np.uint32).astype(np.int64)
    want = np.where(b == 0, 0, a // np.where(b == 0, 1, b)).astype(np.uint32).view(np.int32)
    assert unsigned == want.tolist()


def test_a_runtime_index_into_a_dynamic_dimension_needs_it_not_empty(bundle, tmp_path):
    """The contract of a kernel indexing a dynamic dimension at run time says the dimension is not
    empty (a slice's: holds the slice); a call with an empty one raises ArgumentShapeError before it
    runs, and the process lives."""
    from portkern.portable.bundle import read_bundle

    assert {k.name: str(k.signature.contract) for k in read_bundle(bundle).kernels} == CONTRACTS
    found = run_child(EMPTY_CHILD, str(bundle), cache_dir=tmp_path / "cache")
    for name in ("row", "element", "gather", "put"):
        assert "break `M >= 1` (M=0)" in found[name], found[name]
    assert "break `M >= 5` (M=4)" in found["window"], found["window"]
    assert found["window5"] == [0.0, 2.0, 4.0]


def test_only_runtime_indices_are_rewritten():
    """Constant indices and divisors are left as they are; each runtime index, offset and divisor is
    rewritten once."""
    compiler = Compiler(BUILD_FLAGS)
    constant = """
    func.func @k(%t: tensor<8xf32>, %a: tensor<4xi32>) -> (tensor<f32>, tensor<2xf32>, tensor<4xi32>) {
      %c3 = arith.constant 3 : index
      %c7 = arith.constant 7 : i32
      %v = tensor.extract %t[%c3] : tensor<8xf32>
      %r = tensor.from_elements %v : tensor<f32>
      %s = tensor.extract_slice %t[%c3] [2] [1] : tensor<8xf32> to tensor<2xf32>
      %e = tensor.empty() : tensor<4xi32>
      %d = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]}
          ins(%a : tensor<4xi32>) outs(%e : tensor<4xi32>) {
      ^bb0(%x: i32, %o: i32):
        %q = arith.divsi %x, %c7 : i32
        linalg.yield %q : i32
      } -> tensor<4xi32>
      return %r, %s, %d : tensor<f32>, tensor<2xf32>, tensor<4xi32>
    }
    """
    for source, expected in ((constant, index_safety.Rewritten(0, 0)), (ROW, index_safety.Rewritten(1, 0)),
                             (GATHER, index_safety.Rewritten(2, 0)), (DIVIDE, index_safety.Rewritten(0, 3))):
        module = compiler.lower(compiler.parse(source), from_phase="start", to_phase="input")
        assert index_safety.clamp(module) == expected


ONNX_CHILD = r"""
import json, sys
import numpy as np
import onnx
from portkern import onnx as backend

table = np.arange(32, dtype=np.float32).reshape(8, 4) * 1.5 - 7
zeros, ones = np.zeros((8, 4), np.float32), np.ones((2, 4), np.float32)
reps = {name: backend.prepare(onnx.load(f"{sys.argv[1]}/{name}.onnx"), "CPU") for name in ("gather", "gather_elements", "gather_nd", "scatter_elements", "scatter_nd")}
out = {}
for i in json.loads(sys.argv[2]):
    out[str(i)] = {
        "gather": reps["gather"].run([table, np.array([i, 1, i], np.int64)])[0].tolist(),
        "gather_elements": reps["gather_elements"].run([table, np.array([[i, 1, 2, 3], [0, 0, 0, 0]], np.int64)])[0].tolist(),
        "gather_nd": reps["gather_nd"].run([table, np.array([[i], [1]], np.int64)])[0].tolist(),
        "scatter_elements": reps["scatter_elements"].run([zeros, np.array([[i, 1, 2, 3], [0, 0, 0, 0]], np.int64), ones])[0].tolist(),
        "scatter_nd": reps["scatter_nd"].run([zeros, np.array([[i], [0]], np.int64), ones * 5])[0].tolist(),
    }
print(json.dumps(out))
"""


def onnx_models(where) -> None:
    """Gather, GatherElements, GatherND (from an 8x4 table), ScatterElements and ScatterND (into
    an 8x4 tensor) along axis 0, saved as `<where>/<name>.onnx`."""
    import onnx
    from onnx import TensorProto, helper

    def save(name, op, inputs, output):
        node = helper.make_node(op, [n for n, _, _ in inputs], ["y"], **({"axis": 0} if op in ("Gather", "GatherElements", "ScatterElements") else {}))
        graph = helper.make_graph([node], name, [helper.make_tensor_value_info(*i) for i in inputs],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, output)])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), where / f"{name}.onnx")

    table, f, i64 = [8, 4], TensorProto.FLOAT, TensorProto.INT64
    save("gather", "Gather", [("t", f, table), ("i", i64, [3])], [3, 4])
    save("gather_elements", "GatherElements", [("t", f, table), ("i", i64, [2, 4])], [2, 4])
    save("gather_nd", "GatherND", [("t", f, table), ("i", i64, [2, 1])], [2, 4])
    save("scatter_elements", "ScatterElements", [("t", f, table), ("i", i64, [2, 4]), ("u", f, [2, 4])], table)
    save("scatter_nd", "ScatterND", [("t", f, table), ("i", i64, [2, 1]), ("u", f, [2, 4])], table)


def test_onnx_gathers_and_scatters_out_of_range_use_the_clamped_index(tmp_path):
    """ONNX Gather, GatherElements, GatherND, ScatterElements, ScatterND: indices in [-n, n) as onnx
    defines them (negative counts from the end); others, which onnx makes an error, read or write
    at the index clamped into the tensor, and the process lives."""
    pytest.importorskip("onnx", reason="needs the onnx package (portkern[onnx])")
    onnx_models(tmp_path)
    indices = (0, 7, -3, -8, 8, -9, 1 << 40, -(1 << 40))
    found = run_child(ONNX_CHILD, str(tmp_path), json.dumps(indices), cache_dir=tmp_path / "cache")
    for i in indices:
        got, row = found[str(i)], clamped(i + 8 if i < 0 else i, 8)  # onnx's negative indices first, then the clamp
        np.testing.assert_array_equal(got["gather"], TABLE[[row, 1, row]], err_msg=str(i))
        np.testing.assert_array_equal(got["gather_elements"], [[TABLE[row, 0], TABLE[1, 1], TABLE[2, 2], TABLE[3, 3]], TABLE[0]], err_msg=str(i))
        np.testing.assert_array_equal(got["gather_nd"], TABLE[[row, 1]], err_msg=str(i))
        scattered = np.zeros((8, 4), np.float32)
        scattered[[row, 1, 2, 3], [0, 1, 2, 3]] = 1
        scattered[0] = 1
        np.testing.assert_array_equal(got["scatter_elements"], scattered, err_msg=str(i))
        scattered = np.zeros((8, 4), np.float32)
        scattered[[row, 0]] = 5
        np.testing.assert_array_equal(got["scatter_nd"], scattered, err_msg=str(i))


def test_kernels_without_runtime_indices_build_to_the_same_stage():
    """The shipped MLIR examples have no runtime index: nothing is rewritten, and their flow stage
    is byte for byte the one lowered without the rewrite (same native code, same cache keys)."""
    from portkern.examples import MANIFEST

    compiler = Compiler(BUILD_FLAGS)
    for name in ("gemm_bias_relu", "gemm_glu", "gemm_rowsum", "gemm_transpose_add"):
        module = compiler.parse((MANIFEST.parent / f"{name}.mlir").read_text())
        assert index_safety.clamp(compiler.lower(module, from_phase="start", to_phase="input")) == index_safety.Rewritten(0, 0), name
        stages = [bytecode(compiler.lower(module, from_phase="start", to_phase=PORTABLE_PHASE, safe_indices=safe)) for safe in (True, False)]
        assert stages[0] == stages[1], name


FOREIGN_CHILD = r"""
import json, sys, warnings
import numpy as np
import portkern
from portkern.jit import devices

warnings.simplefilter("ignore")  # the bundle is another IREE release's (CompatibilityWarning)
bundle = portkern.load(sys.argv[1])
record = bundle.record("row")
plan = bundle.plan(record, devices.resolve("cpu"))
table = np.arange(32, dtype=np.float32).reshape(8, 4) * 1.5 - 7
rows = {str(i): bundle.kernel("row")(table, np.array(i, np.int64)).tolist() for i in json.loads(sys.argv[2])}
print(json.dumps({"source": plan.stage.is_source, "identity": list(plan.identity), "rows": rows}))
"""


def test_code_compiled_from_a_source_stage_is_clamped_and_keyed_so(bundle, tmp_path):
    """A bundle of another IREE release is compiled from its source stage on the device: its
    runtime indices are clamped there too, and the code's cache key names the rewrite (code an
    older portkern compiled from the same source stage, unclamped, is not used)."""
    from helpers import reseal

    foreign = reseal(bundle, tmp_path / "foreign.pkb", "3.12.0")
    found = run_child(FOREIGN_CHILD, str(foreign), json.dumps(INDICES), cache_dir=tmp_path / "cache")
    assert found["source"] and index_safety.REWRITE in found["identity"]
    for i in INDICES:
        np.testing.assert_array_equal(found["rows"][str(i)], TABLE[clamped(i, 8)], err_msg=str(i))
