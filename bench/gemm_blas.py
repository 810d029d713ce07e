"""The tuned 768x384x640 GEMM+ReLU against NumPy's OpenBLAS, and both against a large GEMM's rate.

    python bench/gemm_blas.py [--processes 5] [--rounds 15] [--tune quick] [--json]

`examples/gemm_relu_768.mlir` (relu(A[768,640] @ B[640,384]), f32) is built and tuned with `--tune`
in a fresh cache, in a child process with the default settings (so tuning also decides whether its
calls run on the task executor). Then, with `OPENBLAS_CORETYPE` and `OPENBLAS_L2_SIZE` unset and
the default threads on both sides (OpenBLAS: one per core; IREE: its task executor's workers):

- own processes: alternating fresh processes, each timing one side alone (the tuned kernel from
  the cache, or `np.maximum(a @ b, 0)`), --processes of each; a side's figure is the median over
  its processes of each process's median over --rounds rounds of the fastest of 10 calls;
- one process: both sides in one process, taken in turn each round (either side first in half
  of the processes); the same figure per side;
- a 2048x2048x2048 f32 matmul through NumPy in processes of its own: the rate the issue's
  "measured peak" is read against here.

Every side's result is checked against a float64 reference (largest absolute error printed),
computed first in each process: freeing its temporaries raises glibc's mmap threshold, which puts
NumPy in its faster state (docs/tuning.md). GFLOP/s count 2*M*N*K multiply-adds of the matmul.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

from children import environment, python_report

from portkern.portable.builder import build_file

ROOT = Path(__file__).resolve().parent.parent
M, K, N = 768, 640, 384
FLOP = 2 * M * K * N
NAME = "gemm_relu_768"

#: One process: argv[1] the sides to time in turn each round ("numpy", "portkern", or both,
#: comma-separated), argv[2] rounds, argv[3] the bundle. Prints {side: seconds, "error": {...}}.
CHILD = textwrap.dedent(
    """
    import json, sys, time, statistics
    import numpy as np
    rng = np.random.default_rng(0)
    a = rng.standard_normal((768, 640), dtype=np.float32)
    b = rng.standard_normal((640, 384), dtype=np.float32)
    # (freeing this reference's float64 temporaries raises glibc's mmap threshold above them, so
    # NumPy's 1.2 MB results come from the heap, not fresh pages each call: its faster state)
    expected = np.maximum(a.astype(np.float64) @ b, 0)
    sides = {"numpy": lambda: np.maximum(a @ b, 0)}
    order = sys.argv[1].split(",")
    if "portkern" in order:
        import portkern
        kernel = portkern.load(sys.argv[3]).kernel("gemm_relu_768")
        sides["portkern"] = lambda: kernel(a, b)
    errors = {side: float(np.max(np.abs(sides[side]() - expected))) for side in order}
    best = {side: [] for side in order}
    for _ in range(int(sys.argv[2])):
        for side in order:
            call = sides[side]
            for _ in range(3):
                call()
            times = []
            for _ in range(10):
                began = time.perf_counter()
                call()
                times.append(time.perf_counter() - began)
            best[side].append(min(times))
    print(json.dumps({**{side: statistics.median(t) for side, t in best.items()}, "error": errors}))
    """
)

#: A large f32 matmul through NumPy alone: argv[1] rounds. Prints its seconds per call.
LARGE = textwrap.dedent(
    """
    import json, sys, time, statistics
    import numpy as np
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((2048, 2048), dtype=np.float32) for _ in range(2))
    a @ b
    times = []
    for _ in range(int(sys.argv[1])):
        began = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - began)
    print(json.dumps({"seconds": min(times)}))
    """
)
LARGE_FLOP = 2 * 2048**3


def tune(bundle: Path, strategy: str, env: dict[str, str]) -> dict:
    """The kernel tuned into the cache in a child process: its config, where its calls run, the tuning time."""
    code = (
        "import json, sys, time, portkern\n"
        "began = time.perf_counter()\n"
        "k = portkern.load(sys.argv[1]).kernel('gemm_relu_768', tune=sys.argv[2])\n"
        "k.wait()\n"
        "seconds = time.perf_counter() - began\n"
        "tuning = k.tuning\n"
        "print(json.dumps({'config': k.config, 'seconds': seconds, 'note': tuning.note if tuning else ''}))\n"
    )
    return python_report(code, str(bundle), strategy, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=5, help="fresh processes per side (and shared processes)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tune", default="quick")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="portkern-bench-blas-") as tmp:
        work = Path(tmp)
        (work / f"{NAME}.mlir").write_text((ROOT / "examples" / f"{NAME}.mlir").read_text())
        (work / "manifest.yaml").write_text(f"bundle: gemm\nkernels:\n  - name: {NAME}\n    source: {NAME}.mlir\n")
        env = environment(work / "cache", unset=("PORTKERN_EXECUTOR_MIN_BYTES",))
        build_file(work / "manifest.yaml", work / "g.pkb")
        tuned = tune(work / "g.pkb", args.tune, env)
        own: dict[str, list[float]] = {"numpy": [], "portkern": []}
        shared: dict[str, list[float]] = {"numpy": [], "portkern": []}
        errors: dict[str, float] = {}
        large = []
        for i in range(args.processes):
            for side in ("numpy", "portkern"):
                found = python_report(CHILD, side, str(args.rounds), str(work / "g.pkb"), env=env)
                own[side].append(found[side])
                errors[side] = max(errors.get(side, 0.0), found["error"][side])
            order = "numpy,portkern" if i % 2 == 0 else "portkern,numpy"
            found = python_report(CHILD, order, str(args.rounds), str(work / "g.pkb"), env=env)
            for side in shared:
                shared[side].append(found[side])
            large.append(python_report(LARGE, "5", env=env)["seconds"])
    figures = {
        "shape": [M, K, N],
        "tuned": tuned,
        "own_ms": {side: statistics.median(t) * 1e3 for side, t in own.items()},
        "shared_ms": {side: statistics.median(t) * 1e3 for side, t in shared.items()},
        "large_gflops": LARGE_FLOP / statistics.median(large) / 1e9,
        "largest_error": errors,
        "processes": args.processes,
    }
    for where in ("own", "shared"):
        ms = figures[f"{where}_ms"]
        figures[f"{where}_ratio"] = ms["numpy"] / ms["portkern"]
        figures[f"{where}_gflops"] = {side: FLOP / (t * 1e-3) / 1e9 for side, t in ms.items()}
    if args.json:
        json.dump(figures, sys.stdout, indent=2)
        print()
        return 0
    print(f"relu(A @ B), {M}x{K} @ {K}x{N} f32; tuned with {args.tune!r} in {tuned['seconds']:.1f} s: {tuned['config']}"
          + (f" ({tuned['note']})" if tuned["note"] else ""))
    print(f"{'':<36}{'NumPy (OpenBLAS)':>18}{'portkern tuned':>16}{'tuned / NumPy':>15}")
    for where, label in (("own", f"own processes ({args.processes} each)"), ("shared", f"one process ({args.processes})")):
        ms, rate = figures[f"{where}_ms"], figures[f"{where}_gflops"]
        print(f"{label:<36}{ms['numpy']:>8.3f} ms{rate['numpy']:>6.0f} GF{ms['portkern']:>7.3f} ms{rate['portkern']:>5.0f} GF"
              f"{figures[f'{where}_ratio']:>14.2f}x")
    print(f"NumPy 2048^3 matmul alone: {figures['large_gflops']:.0f} GFLOP/s; the tuned GEMM in its own processes reaches "
          f"{figures['own_gflops']['portkern'] / figures['large_gflops']:.0%} of it")
    print(f"largest error against float64: NumPy {errors['numpy']:.2g}, portkern {errors['portkern']:.2g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
