"""MatMul weights as the ONNX model writes them (K, N) against stored transposed (N, K), side by side.

    python bench/matmul_layout.py [--width 16384] [--layers 2] [--batches 8] [--rounds 5] [--json]
    python bench/matmul_layout.py --width 4096 --batches 512

One MLP-style ONNX model (`portkern.examples.large_mlp`: `layers` square layers of `width`,
weights in an ONNX external data file) is built twice: as portkern builds it (every MatMul
weight stored transposed, `portable/onnx_layout.py`) and with that rewrite turned off. Both
bundles are loaded in this process and called in interleaved rounds on the same input (first
call of each left out); the best call of each is reported, with their ratio and the largest
difference from NumPy. Needs about 2x the weights of disk in a temp dir, which also holds the
run's cache (removed at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import portkern
from portkern.examples.large_mlp import reference, weight_bytes, write_mlp
from portkern.portable import onnx_parameters
from portkern.portable.builder import build_file

SEED = 0


def build(where: Path, widths: tuple[int, ...], batch: int, transposed: bool) -> Path:
    where.mkdir(parents=True)
    write_mlp(where / "m.onnx", widths, batch, SEED, external=True)
    (where / "manifest.yaml").write_text("bundle: layout\nkernels:\n  - name: mlp\n    source: m.onnx\n")
    rewrite = onnx_parameters.transpose_matmul_weights
    if not transposed:
        onnx_parameters.transpose_matmul_weights = lambda model, threshold: []
    try:
        build_file(where / "manifest.yaml", where / "m.pkb")
    finally:
        onnx_parameters.transpose_matmul_weights = rewrite
    for name in ("m.onnx", "m.onnx.data"):
        (where / name).unlink()
    return where / "m.pkb"


def measure(width: int, layers: int, batch: int, rounds: int, workdir: Path) -> dict:
    widths = (width,) * (layers + 1)
    kernels = {}
    for layout, transposed in (("as written (K, N)", False), ("transposed (N, K)", True)):
        path = build(workdir / f"b{batch}-{transposed}", widths, batch, transposed)
        kernels[layout] = portkern.load(path).kernel("mlp")
    x = np.random.default_rng(1).standard_normal((batch, width), dtype=np.float32)
    expected = reference(x, widths, SEED)
    best = {}
    errors = {}
    for layout, kernel in kernels.items():
        y = kernel(x)
        errors[layout] = float(np.max(np.abs(y - expected) / (1 + np.abs(expected))))
    for _ in range(rounds):
        for layout, kernel in kernels.items():
            start = time.perf_counter()
            kernel(x)
            best[layout] = min(best.get(layout, float("inf")), time.perf_counter() - start)
    written, stored = best["as written (K, N)"], best["transposed (N, K)"]
    return {"width": width, "layers": layers, "batch": batch, "weights_bytes": weight_bytes(widths), "best_call_s": best,
            "speedup": written / stored, "max_rel_error": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=16384)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batches", default="8", help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="portkern-layout-"))
    os.environ["PORTKERN_CACHE_DIR"] = str(workdir / "cache")  # the native code of this run only
    results = []
    try:
        for batch in (int(b) for b in args.batches.split(",")):
            results.append(measure(args.width, args.layers, batch, args.rounds, workdir))
            r = results[-1]
            if not args.json:
                calls = ", ".join(f"{layout}: {s * 1000:.1f} ms" for layout, s in r["best_call_s"].items())
                print(f"{r['layers']} layers of {r['width']}x{r['width']} f32 ({r['weights_bytes'] / 2**20:.0f} MiB), batch {r['batch']}: "
                      f"best call {calls}; transposed is {r['speedup']:.2f}x faster; max rel. error vs NumPy "
                      f"{max(r['max_rel_error'].values()):.1e}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
