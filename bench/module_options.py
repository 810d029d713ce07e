"""Module options (an optimisation level, data tiling, attention decomposed) on the example kernels.

    python bench/module_options.py [--suites examples,torch,attention,gemm768] [--rounds 12] [--json]

Per kernel, the compiler's default and each module-option variant
(`portkern.jit.finalize.MODULE_OPTIONS`, combinations included) are compiled
from the kernel's source stage, checked against the default's outputs and
timed interleaved: on `local-sync`, the CPU time of the calling thread (other
processes' load does not count), and on `local-task`, wall time; best call of
--rounds rounds of 3. Variants compiling to the same code as another are
named, not timed. Prints each variant's speed over the default (the docs'
table, docs/tuning.md "Module options"). `torch` needs torch and iree-turbine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = [
    "default", "O2", "data-tiling", "O2;data-tiling",
    "attention-decomposed", "data-tiling;attention-decomposed", "O2;attention-decomposed",
]
ROOT = Path(__file__).resolve().parent.parent
ATTENTION = """
func.func @attention(%q: tensor<8x128x32xf32>, %k: tensor<8x128x32xf32>, %v: tensor<8x128x32xf32>) -> tensor<8x128x32xf32> {
  %scale = arith.constant 0.125 : f32
  %empty = tensor.empty() : tensor<8x128x32xf32>
  %r = iree_linalg_ext.attention <{indexing_maps = [affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3)>,
      affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d3)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2)>,
      affine_map<(d0, d1, d2, d3, d4) -> ()>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2)>]}>
      ins(%q, %k, %v, %scale : tensor<8x128x32xf32>, tensor<8x128x32xf32>, tensor<8x128x32xf32>, f32)
      outs(%empty : tensor<8x128x32xf32>) {
    ^bb0(%score: f32):
      iree_linalg_ext.yield %score : f32
  } -> tensor<8x128x32xf32>
  return %r : tensor<8x128x32xf32>
}
"""


def bundles(suites: list[str], where: Path) -> list[Path]:
    from portkern.portable.builder import build_file

    made = []
    for suite in suites:
        if suite == "examples":
            manifest = ROOT / "examples" / "manifest.yaml"
        elif suite == "torch":
            from portkern.examples.torch_models import export_all

            manifest = export_all(where / "torch")
        else:
            name, text = {"attention": ("attention", ATTENTION), "gemm768": ("gemm_relu_768", (ROOT / "examples" / "gemm_relu_768.mlir").read_text())}[suite]
            (where / f"{name}.mlir").write_text(text)
            manifest = where / f"{suite}.yaml"
            manifest.write_text(f"bundle: {suite}\nkernels:\n  - name: {name}\n    source: {name}.mlir\n")
        build_file(manifest, where / f"{suite}.pkb")
        made.append(where / f"{suite}.pkb")
    return made


def measure(path: Path, rounds: int) -> list[dict]:
    import portkern
    from portkern.base.errors import PortkernError
    from portkern.jit import devices
    from portkern.jit.runtime import Executable
    from portkern.tuner.measure import make_inputs, mismatch

    loaded = portkern.load(path)
    target = devices.resolve("cpu", loaded.store)
    rows = []
    for record in loaded.bundle.kernels:
        code: dict[str, bytes] = {}
        failed: dict[str, str] = {}
        for variant in VARIANTS:
            try:
                code[variant] = loaded.native(record, target, variant).data
            except PortkernError as exc:
                failed[variant] = f"{type(exc).__name__}: {str(exc)[:160]}"
        digest = {v: hashlib.sha256(c).hexdigest() for v, c in code.items()}
        same = {v: next(w for w in code if digest[w] == digest[v]) for v in code}
        distinct = [v for v in code if same[v] == v]
        row: dict = {"kernel": record.name, "failed": failed, "same_as": {v: w for v, w in same.items() if v != w}}
        inputs = make_inputs(record.signature)
        for driver, clock in (("local-sync", time.thread_time), ("local-task", time.perf_counter)):
            executables = [Executable(code[v], record.entry, driver, loaded.natives.parameters_for(record)) for v in distinct]
            arguments = executables[0].upload(inputs)
            reference = executables[0](*arguments)
            wrong = {v: problem for v, e in zip(distinct, executables) if (problem := mismatch(e(*arguments), reference))}
            best = [float("inf")] * len(executables)
            for r in range(rounds):
                order = range(len(executables)) if r % 2 == 0 else reversed(range(len(executables)))
                for i in order:
                    executables[i].invoke(*arguments)
                    for _ in range(3):
                        start = clock()
                        executables[i].invoke(*arguments)
                        best[i] = min(best[i], clock() - start)
            row[driver] = {"default_ms": best[0] * 1e3, "speedup": {v: best[0] / best[distinct.index(same[v])] for v in code}, "wrong": wrong}
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suites", default="examples,torch,attention,gemm768")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as where:
        rows = [row for path in bundles(args.suites.split(","), Path(where)) for row in measure(path, args.rounds)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for row in rows:
        for driver, clock in (("local-sync", "thread CPU"), ("local-task", "wall")):
            data = row[driver]
            cells = "  ".join(f"{v}={s:.2f}x" + (f"(={row['same_as'][v]})" if v in row["same_as"] else "") for v, s in data["speedup"].items())
            print(f"{row['kernel']} [{driver}, {clock}; default {data['default_ms']:.3f} ms] {cells}")
            for v, problem in data["wrong"].items():
                print(f"  {v}: WRONG {problem}")
        for v, why in row["failed"].items():
            print(f"  {v}: failed {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
