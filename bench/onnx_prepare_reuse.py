"""A second `portkern.onnx.prepare` of the same model against the first, in fresh processes.

    python bench/onnx_prepare_reuse.py [--model examples/mlp.onnx] [--json]

One empty cache directory; two fresh processes, one after the other, each `onnx.load` the model,
`portkern.onnx.prepare(model, "CPU")` it and run it once on zeros: the first builds the bundle
(`rep.bundle_origin == "built"`), the second loads the one the first kept (`"cache"`). Printed:
each process's `prepare` time (from the call to its return, in the process) and the second's
as a fraction of the first (the goal: <= 0.10). One run, no repeats: on a busy machine only the
ratio's order means anything.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from children import environment, python_report

from portkern.examples import MANIFEST

#: Prepares the model at argv[1] and runs it once; prints the prepare time and the bundle's origin.
CHILD = """
import json, sys, time
import numpy as np, onnx
import portkern.onnx as backend
model = onnx.load(sys.argv[1])
start = time.perf_counter()
rep = backend.prepare(model, "CPU")
seconds = time.perf_counter() - start
inputs = [np.zeros([d.dim_value or 1 for d in i.type.tensor_type.shape.dim], np.float32) for i in model.graph.input
          if i.name not in {t.name for t in model.graph.initializer}]
rep.run(inputs)
print(json.dumps({"seconds": seconds, "origin": rep.bundle_origin}))
"""


def prepare_in_fresh_process(model: Path, cache: Path) -> dict:
    return python_report(CHILD, str(model), env=environment(cache), what="prepare")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MANIFEST.parent / "mlp.onnx", help="an ONNX model (default: examples/mlp.onnx)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="portkern-prepare-reuse-") as tmp:
        first = prepare_in_fresh_process(args.model, Path(tmp) / "cache")
        second = prepare_in_fresh_process(args.model, Path(tmp) / "cache")
    result = {"model": str(args.model), "first_s": first["seconds"], "first_origin": first["origin"],
              "second_s": second["seconds"], "second_origin": second["origin"], "ratio": second["seconds"] / first["seconds"]}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.model}: first prepare {first['seconds']:.2f} s ({first['origin']}), "
          f"second {second['seconds']:.2f} s ({second['origin']}): {result['ratio']:.3f} of the first (goal <= 0.10)")


if __name__ == "__main__":
    main()
