"""What index safety (portable/index_safety.py) costs: build time of the example kernels, call
time of kernels that index by runtime values, each with and without the rewrite.

    python bench/index_safety.py [--rounds 21] [--calls 200] [--json]

1. Build: each shipped MLIR/ONNX example lowered from source to the portable (flow) stage with
   the rewrite and without it, alternating, `--rounds` times (an ONNX model's import, the same
   both ways, is done once before); the flow stage bytes are compared (the examples index by
   no runtime value, so they are expected equal: their native code, cache keys and call times
   are then unchanged by construction).
2. Call: kernels that do index by runtime values (a row chosen by an index, an embedding-style
   gather in a `linalg.generic`, an ONNX Gather and ScatterElements) compiled for this CPU with
   and without the rewrite, results checked against NumPy for in-range indices, then called
   interleaved, `--calls` times each, `--rounds` rounds.

Figures are medians; the ratio is with / without. The machine may be shared: read the ratios,
measured side by side, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from portkern.examples import MANIFEST
from portkern.jit import cpu, devices
from portkern.jit.runtime import Executable
from portkern.portable.compiler import Compiler
from portkern.portable.lower import BUILD_FLAGS, PORTABLE_PHASE, bytecode, import_onnx
from portkern.portable.manifest import load_manifest

ROWS, WIDTH, LOOKUPS = 8192, 256, 4096

ROW = f"""
func.func @row(%t: tensor<{ROWS}x{WIDTH}xf32>, %i: tensor<i64>) -> tensor<{WIDTH}xf32> {{
  %iv = tensor.extract %i[] : tensor<i64>
  %ix = arith.index_cast %iv : i64 to index
  %r = tensor.extract_slice %t[%ix, 0] [1, {WIDTH}] [1, 1] : tensor<{ROWS}x{WIDTH}xf32> to tensor<{WIDTH}xf32>
  return %r : tensor<{WIDTH}xf32>
}}
"""

GATHER = f"""
func.func @gather(%t: tensor<{ROWS}x{WIDTH}xf32>, %idx: tensor<{LOOKUPS}xi64>) -> tensor<{LOOKUPS}x{WIDTH}xf32> {{
  %e = tensor.empty() : tensor<{LOOKUPS}x{WIDTH}xf32>
  %r = linalg.generic {{indexing_maps = [affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>],
                       iterator_types = ["parallel", "parallel"]}}
      ins(%idx : tensor<{LOOKUPS}xi64>) outs(%e : tensor<{LOOKUPS}x{WIDTH}xf32>) {{
  ^bb0(%k: i64, %o: f32):
    %j = linalg.index 1 : index
    %ki = arith.index_cast %k : i64 to index
    %v = tensor.extract %t[%ki, %j] : tensor<{ROWS}x{WIDTH}xf32>
    linalg.yield %v : f32
  }} -> tensor<{LOOKUPS}x{WIDTH}xf32>
  return %r : tensor<{LOOKUPS}x{WIDTH}xf32>
}}
"""


def onnx_models(where: Path) -> dict[str, bytes]:
    """MLIR of an ONNX Gather (embedding lookup) and ScatterElements, from IREE's importer."""
    import onnx
    from onnx import TensorProto, helper

    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    graphs = {
        "onnx_gather": ([helper.make_node("Gather", ["t", "i"], ["y"], axis=0)],
                        [("t", f, [ROWS, WIDTH]), ("i", i64, [LOOKUPS])], [LOOKUPS, WIDTH]),
        "onnx_scatter": ([helper.make_node("ScatterElements", ["t", "i", "u"], ["y"], axis=0)],
                         [("t", f, [ROWS, WIDTH]), ("i", i64, [LOOKUPS, WIDTH]), ("u", f, [LOOKUPS, WIDTH])], [ROWS, WIDTH]),
    }
    texts = {}
    for name, (nodes, inputs, output) in graphs.items():
        graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(*i) for i in inputs],
                                  [helper.make_tensor_value_info("y", f, output)])
        path = where / f"{name}.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
        texts[name] = import_onnx(path)
    return texts


def build_times(rounds: int) -> list[dict]:
    compiler = Compiler(BUILD_FLAGS)
    manifest = load_manifest(MANIFEST)
    rows = []
    for spec in manifest.kernels:
        if spec.kind not in ("mlir", "onnx"):
            continue
        text = import_onnx(spec.source) if spec.kind == "onnx" else spec.source.read_bytes()
        times: dict[bool, list[float]] = {True: [], False: []}
        stages = {}
        for r in range(rounds):
            for safe in ((True, False) if r % 2 else (False, True)):
                start = time.perf_counter()
                lowered = compiler.lower(compiler.parse(text, name=spec.name), from_phase="start", to_phase=PORTABLE_PHASE,
                                         name=spec.name, safe_indices=safe)
                times[safe].append(time.perf_counter() - start)
                stages[safe] = bytecode(lowered)
        with_s, without_s = statistics.median(times[True]), statistics.median(times[False])
        rows.append({"kernel": spec.name, "without_s": without_s, "with_s": with_s, "ratio": with_s / without_s,
                     "same_stage": stages[True] == stages[False]})
    return rows


def call_times(rounds: int, calls: int) -> list[dict]:
    target = devices.resolve("cpu")
    compiler = Compiler(cpu.flags(target.fingerprint))
    rng = np.random.default_rng(7)
    table = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    lookups = rng.integers(0, ROWS, LOOKUPS).astype(np.int64)
    scatter_at = rng.integers(0, ROWS, (LOOKUPS, WIDTH)).astype(np.int64)
    updates = rng.standard_normal((LOOKUPS, WIDTH)).astype(np.float32)
    scattered = table.copy()
    scattered[scatter_at, np.arange(WIDTH)] = updates  # ScatterElements along axis 0 (last write wins)
    with tempfile.TemporaryDirectory(prefix="portkern-bench-index-") as tmp:
        sources: dict[str, bytes | str] = {"row": ROW, "gather": GATHER, **onnx_models(Path(tmp))}
    cases = {
        "row": ((table, np.array(1234, np.int64)), table[1234], "row"),
        "gather": ((table, lookups), table[lookups], "gather"),
        "onnx_gather": ((table, lookups), table[lookups], "onnx_gather"),
        "onnx_scatter": ((table, scatter_at, updates), None, "onnx_scatter"),
    }
    rows = []
    for name, (args, expected, entry) in cases.items():
        code = {safe: Executable(compiler.to_vmfb(compiler.parse(sources[name], name=name), from_phase="start", name=name,
                                                  safe_indices=safe), entry) for safe in (True, False)}
        for safe, executable in code.items():
            out = executable(*args)[0]
            if expected is not None:
                assert np.array_equal(out, expected), (name, safe)
            else:  # duplicate targets: any one of the colliding updates may land
                assert out.shape == scattered.shape and np.isin(out, np.concatenate([table.ravel(), updates.ravel()])).all(), (name, safe)
        medians: dict[bool, list[float]] = {True: [], False: []}
        for r in range(rounds):
            for safe in ((True, False) if r % 2 else (False, True)):
                times = []
                for _ in range(calls):
                    start = time.perf_counter()
                    code[safe](*args)
                    times.append(time.perf_counter() - start)
                medians[safe].append(statistics.median(times))
        with_s, without_s = statistics.median(medians[True]), statistics.median(medians[False])
        rows.append({"kernel": name, "without_s": without_s, "with_s": with_s, "ratio": with_s / without_s})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = {"build": build_times(args.rounds), "call": call_times(args.rounds, args.calls)}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"build (lowering to the flow stage, median of {args.rounds}):")
    for row in report["build"]:
        print(f"  {row['kernel']:20s} without {row['without_s'] * 1e3:8.1f} ms  with {row['with_s'] * 1e3:8.1f} ms  "
              f"ratio {row['ratio']:.3f}  same stage: {row['same_stage']}")
    print(f"call (median of {args.rounds} rounds of {args.calls} calls):")
    for row in report["call"]:
        print(f"  {row['kernel']:20s} without {row['without_s'] * 1e6:8.1f} us  with {row['with_s'] * 1e6:8.1f} us  ratio {row['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
