"""A dynamic GEMM+ReLU on this CPU: per-M call time, dynamic default vs the bucket's tuned code.

    python bench/dynamic_shapes.py [--m 1 8 64 512 2048] [--strategy quick] [--budget N] [--json]

The kernel is `relu(a @ b)` on `tensor<?xKxf32>` x `tensor<KxNxf32>` (K=512,
N=256 by default): its shape contract is `(MxK, KxN) -> MxN`. In one run, in a
fresh cache:

1. it is tuned per bucket for each M (`tune_kernel_shapes`: the flow stage
   specialised to M, searched, then kept only if it beats the dynamic default
   timed side by side);
2. per M, and per another size of the same bucket (3/4 M, for M >= 4), whole
   calls (`kernel(a, b)`: argument and contract checks, bucket choice, the run,
   results to NumPy) are timed interleaved, round by round: the dynamic
   default (a kernel loaded before tuning) against the kernel loaded after it,
   which runs the bucket's code (specialised code at M itself, the dynamic
   module with the bucket's tuned config at other sizes, or the dynamic
   default where tuning kept it); the ratio is default / bucket;
3. every result is compared with NumPy (float64 reference, rtol 1e-4);
4. the bucket choice alone (`jit.buckets.pick`) is timed, to show what choosing
   costs per call.

The machine is shared: read the ratios, measured side by side, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.jit import buckets, devices
from portkern.portable.builder import build_file
from portkern.tuner.measure import Timing, time_calls
from portkern.tuner.session import Tuner, tune_kernel_shapes

SOURCE = """
func.func @main(%a: tensor<?x{k}xf32>, %b: tensor<{k}x{n}xf32>) -> tensor<?x{n}xf32> {{
  %c0 = arith.constant 0 : index
  %m = tensor.dim %a, %c0 : tensor<?x{k}xf32>
  %e = tensor.empty(%m) : tensor<?x{n}xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<?x{n}xf32>) -> tensor<?x{n}xf32>
  %r = linalg.matmul ins(%a, %b : tensor<?x{k}xf32>, tensor<{k}x{n}xf32>) outs(%f : tensor<?x{n}xf32>) -> tensor<?x{n}xf32>
  %y = linalg.generic {{indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}}
      ins(%r : tensor<?x{n}xf32>) outs(%e : tensor<?x{n}xf32>) {{
  ^bb0(%x: f32, %o: f32):
    %s = arith.maximumf %x, %z : f32
    linalg.yield %s : f32
  }} -> tensor<?x{n}xf32>
  return %y : tensor<?x{n}xf32>
}}
"""


def interleaved(calls: list, rounds: int, runs: int) -> list[Timing]:
    """Per call, the timing over rounds of its per-round median, all timed round-robin."""
    per_round: list[list[float]] = [[] for _ in calls]
    for index in range(rounds):
        order = range(len(calls)) if index % 2 == 0 else reversed(range(len(calls)))
        for i in order:
            per_round[i].append(time_calls(calls[i], warmup=1, runs=runs, budget_s=1.0).median_s)
    return [Timing.of(samples) for samples in per_round]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 8, 64, 512, 2048], help="row counts to tune for and call with")
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--strategy", default="quick")
    parser.add_argument("--budget", type=int, help="candidates per dispatch (default: the strategy's)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        (where / "gemm.mlir").write_text(SOURCE.format(k=args.k, n=args.n))
        (where / "manifest.yaml").write_text("bundle: dynamic\nkernels:\n  - name: gemm_relu\n    source: gemm.mlir\n")
        build_file(where / "manifest.yaml", where / "b.pkb")
        store = Store(CacheConfig(where / "cache", 1 << 32, False))
        loaded = portkern.load(where / "b.pkb", store=store)
        record, target = loaded.record("gemm_relu"), devices.resolve("cpu", store)
        dynamic = loaded.kernel("gemm_relu")
        shapes = [{"a": (m, args.k)} for m in args.m]
        with Tuner() as tuner:
            found = {r.values["M"]: r for r in tune_kernel_shapes(loaded.natives, record, target, args.strategy, shapes, tuner=tuner, budget=args.budget)}
        tuned = portkern.load(where / "b.pkb", store=store).kernel("gemm_relu")
        rng = np.random.default_rng(0)
        b = rng.standard_normal((args.k, args.n)).astype(np.float32)
        sizes = []
        for m in args.m:
            sizes.append((m, m))
            if m >= 4:
                sizes.append(((3 * m) // 4, m))
        for m, tuned_for in sizes:
            a = rng.standard_normal((m, args.k)).astype(np.float32)
            want = np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0)
            outputs = {"dynamic": dynamic(a, b), "bucket": tuned(a, b)}
            errors = {k: float(np.max(np.abs(v - want) / (np.abs(want) + 1e-3))) for k, v in outputs.items()}
            ok = all(np.allclose(v, want, rtol=1e-4, atol=1e-3) for v in outputs.values())
            default_t, bucket_t = interleaved([lambda: dynamic(a, b), lambda: tuned(a, b)], args.rounds, args.runs)
            shapes_now = [a.shape, b.shape]
            pick_t = time_calls(lambda: buckets.pick(record.signature.contract, tuned.buckets, "gemm_relu", shapes_now), runs=200, budget_s=0.5)
            chosen = tuned.code_for(a, b)
            rows.append(
                {
                    "M": m,
                    "tuned_for": tuned_for,
                    "bucket": chosen["bucket"],
                    "code": chosen["code"],
                    "config": chosen["config"],
                    "dynamic_default_s": default_t.min_s,
                    "bucket_s": bucket_t.min_s,
                    "ratio": default_t.min_s / bucket_t.min_s,
                    "choice_s": pick_t.median_s,
                    "tuning": {k: found[tuned_for].to_dict()[k] for k in ("default_s", "best_s", "bucket_s", "specialised_compile_s", "bucket_compile_s")},
                    "max_rel_error": errors,
                    "ok": ok,
                }
            )
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
    else:
        print(f"dynamic GEMM+ReLU (Mx{args.k}, {args.k}x{args.n}) -> Mx{args.n}, strategy {args.strategy}, whole calls, best of {args.rounds} interleaved rounds")
        print(f"{'M':>6} {'bucket':>9} {'runs':>12} {'default ms':>11} {'bucket ms':>10} {'ratio':>6} {'choice us':>10}  ok")
        for r in rows:
            print(
                f"{r['M']:>6} {r['bucket']:>9} {r['code']:>12} {r['dynamic_default_s'] * 1e3:>11.3f} {r['bucket_s'] * 1e3:>10.3f} "
                f"{r['ratio']:>6.2f} {r['choice_s'] * 1e6:>10.1f}  {'yes' if r['ok'] else 'NO'}"
            )
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
