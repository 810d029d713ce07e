"""Tuning the example kernels on this CPU: strategies compared, where the time goes, NumPy for scale.

    python bench/tuning.py [--kernel K ...] [--workers N] [--json]

In one run, per example kernel (each strategy in a fresh cache, so nothing is
served from an earlier result):

- `quick` and `full` tune the kernel; `guided` and `random` tune it with a
  budget of 10% of the candidates `full` evaluated on its largest dispatch;
- the configs they chose and the compiler's default are then compiled again
  and re-timed side by side (interleaved rounds on `local-task`, best round):
  default vs quick vs full time, and the fraction of full's speed each
  strategy reached (full's time / its time; 1.0 = as fast as full);
- every candidate `full` evaluated splits its cost into clone+stamp, compile
  (in the workers) and benchmark (here, including the output check);
- the stage-1 candidates of `gemm_bias_relu` are compiled with 1 and with 2
  workers: the parallel compile speedup;
- each kernel's `full` config against NumPy (float32, its BLAS threads) on the
  same inputs: the matmul alone, and the whole NumPy expression.

The machine is shared: timings are noisy (multi-threaded ones most), so read
ratios measured side by side, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.examples import MANIFEST
from portkern.examples.reference import EXAMPLES
from portkern.jit import devices
from portkern.jit.workers import Job, Pool, cores
from portkern.portable.builder import build_file
from portkern.tuner.kernel_config import KernelConfig
from portkern.tuner.measure import Bench, time_calls
from portkern.tuner.registry import dispatch_from_data, space_for
from portkern.tuner.session import Tuner

STRATEGIES = ("quick", "full", "guided", "random")
ROUNDS = 7


def numpy_times(name: str, inputs: list[np.ndarray]) -> dict[str, float]:
    """Median seconds of NumPy's float32 matmul alone and of the kernel's whole expression."""
    if len(inputs) < 2:
        return {}
    a, b = inputs[0], inputs[1]
    expressions = {
        "gemm_bias_relu": lambda: np.maximum(a @ b + inputs[2], 0),
        "gemm_glu": lambda: (lambda c: c[:, : c.shape[1] // 2] / (1 + np.exp(-c[:, c.shape[1] // 2 :])))(a @ b),
        "gemm_rowsum": lambda: (a @ b).sum(axis=1),
        "gemm_transpose_add": lambda: (a @ b).T + inputs[2],
    }
    if name not in expressions:
        return {}
    return {
        "numpy_matmul_s": time_calls(lambda: a @ b, warmup=5, runs=50, budget_s=2).median_s,
        "numpy_expression_s": time_calls(expressions[name], warmup=5, runs=50, budget_s=2).median_s,
    }


def tune(bundle_path: Path, name: str, strategy: str, workers: int | None, budget: int | None = None):
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(CacheConfig(Path(tmp), 1 << 32, False))
        bundle = portkern.load(bundle_path, store=store)
        target = devices.resolve("cpu", store)
        with Tuner(workers=workers) as tuner:
            start = time.perf_counter()
            result = tuner.tune(bundle.natives, bundle.record(name), target, strategy, budget=budget)
            result.wall_s = time.perf_counter() - start
            store.close()
            return result


def side_by_side(bundle, name: str, target, configs: dict[str, str], inputs) -> dict[str, float]:
    """Best-round seconds of each strategy's config, all timed interleaved on the deployed driver."""
    record = bundle.record(name)
    distinct = list(dict.fromkeys(configs.values()))
    bench = Bench(record.entry, target.driver, inputs, bundle.parameters_for(record))
    executables = [bench.load(bundle.native(record, target, c).data) for c in distinct]
    timings = dict(zip(distinct, bench.interleaved(executables, rounds=ROUNDS)))
    return {strategy: timings[config].min_s for strategy, config in configs.items()}


def compile_speedup(bundle, target) -> dict[str, float]:
    """Wall time to compile gemm_bias_relu's stage-1 candidates with 1 and with 2 workers."""
    record = bundle.record("gemm_bias_relu")
    plan = bundle.plan(record, target)
    (found,) = [dispatch_from_data(d) for d in bundle.natives.analyse(plan).dispatches]
    configs = [str(KernelConfig.of({0: c})) for c in space_for(found, cores()).stage_candidates(0, [])]
    source = bundle.natives.source(plan)
    walls = {}
    for workers in (1, 2):
        start = time.perf_counter()
        with Pool(workers=workers) as pool:
            results = pool.run([Job.compile(i, record.name, target, source, c) for i, c in enumerate(configs)])
        walls[workers] = time.perf_counter() - start
        assert all(r.ok for r in results.values())
    return {"candidates": len(configs), "one_worker_s": walls[1], "two_workers_s": walls[2], "speedup": walls[1] / walls[2]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", action="append", help="only this example (repeatable)")
    parser.add_argument("--workers", type=int, default=None, help="compile workers (default: one per core)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    started = time.perf_counter()
    tmp = tempfile.TemporaryDirectory()
    bundle_path = Path(tmp.name) / "examples.pkb"
    build_file(MANIFEST, bundle_path)
    store = Store(CacheConfig(Path(tmp.name) / "cache", 1 << 32, False))
    bundle = portkern.load(bundle_path, store=store)
    target = devices.resolve("cpu", store)
    rows, split = [], {"stamp_s": [], "compile_s": [], "bench_s": [], "setup_s": []}
    for name in args.kernel or [n for n in bundle.names() if n in EXAMPLES]:
        results = {s: tune(bundle_path, name, s, args.workers) for s in ("quick", "full")}
        largest = max((d.evaluated for d in results["full"].dispatches), default=0)
        budget = max(1, math.ceil(0.1 * largest))
        for strategy in ("guided", "random"):
            results[strategy] = tune(bundle_path, name, strategy, args.workers, budget)
        for evaluation in results["full"].evaluations:
            for key in split:
                split[key].append(getattr(evaluation, key))
        inputs = EXAMPLES[name].inputs(np.random.default_rng(0))
        times = side_by_side(bundle, name, target, {"default": "default", **{s: r.config for s, r in results.items()}}, inputs)
        row = {
            "kernel": name,
            "budget_10pct": budget,
            **{f"{s}_s": times[s] for s in ("default", *STRATEGIES)},
            **{f"{s}_evaluated": sum(d.evaluated for d in r.dispatches) for s, r in results.items()},
            **{f"{s}_tune_s": r.wall_s for s, r in results.items()},
            **{f"{s}_config": r.config for s, r in results.items()},
            **{f"{s}_fraction_of_full": times["full"] / times[s] for s in ("quick", "guided", "random")},
            **numpy_times(name, inputs),
            "notes": {s: r.note for s, r in results.items() if r.note},
        }
        rows.append(row)
        if not args.json:
            print(f"{name}: default {row['default_s'] * 1e3:.3f} ms, quick {row['quick_s'] * 1e3:.3f} ({row['quick_evaluated']} evals), "
                  f"full {row['full_s'] * 1e3:.3f} ({row['full_evaluated']} evals), guided@{budget} {row['guided_s'] * 1e3:.3f}, "
                  f"random@{budget} {row['random_s'] * 1e3:.3f} {row['notes'] or ''}", file=sys.stderr, flush=True)
    candidates = len(split["compile_s"])
    per_candidate = {k: (statistics.fmean(v) if v else 0.0) for k, v in split.items()}
    speedup = compile_speedup(bundle, target)
    report = {
        "device": target.label,
        "cores": cores(),
        "rows": rows,
        "per_candidate_mean_s": per_candidate,
        "candidates_in_split": candidates,
        "compile_workers": speedup,
        "wall_s": time.perf_counter() - started,
    }
    store.close()
    tmp.cleanup()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print_report(report)
    return 0


def print_report(report: dict) -> None:
    ms = lambda s: f"{s * 1e3:.3f}" if s else "-"  # noqa: E731
    print(f"\ntuning on {report['device']} ({report['cores']} cores); kernel times: best of {ROUNDS} interleaved rounds on local-task, ms")
    print(f"{'kernel':<20}{'default':>9}{'quick':>9}{'full':>9}{'speedup':>9}{'evals q/f':>11}{'quick/full':>11}"
          f"{'guided@10%':>12}{'random@10%':>12}{'numpy mm':>10}{'numpy all':>10}")
    for r in report["rows"]:
        print(f"{r['kernel']:<20}{ms(r['default_s']):>9}{ms(r['quick_s']):>9}{ms(r['full_s']):>9}"
              f"{r['default_s'] / r['full_s']:>8.2f}x{r['quick_evaluated']:>5}/{r['full_evaluated']:<5}"
              f"{r['quick_fraction_of_full']:>11.2f}{r['guided_fraction_of_full']:>8.2f} ({r['budget_10pct']:>1})"
              f"{r['random_fraction_of_full']:>8.2f} ({r['budget_10pct']:>1})"
              f"{ms(r.get('numpy_matmul_s')):>10}{ms(r.get('numpy_expression_s')):>10}")
    split = report["per_candidate_mean_s"]
    total = split["stamp_s"] + split["compile_s"] + split["bench_s"]
    print(f"\nper candidate of `full` (mean of {report['candidates_in_split']}): clone+stamp {split['stamp_s'] * 1e3:.2f} ms "
          f"({split['stamp_s'] / total:.1%}), compile {split['compile_s'] * 1e3:.1f} ms ({split['compile_s'] / total:.1%}), "
          f"benchmark+check {split['bench_s'] * 1e3:.1f} ms ({split['bench_s'] / total:.1%}); "
          f"kernel parse+configure per worker {split['setup_s'] * 1e3:.2f} ms amortised")
    w = report["compile_workers"]
    print(f"parallel compile of {w['candidates']} candidates: 1 worker {w['one_worker_s']:.1f} s, 2 workers {w['two_workers_s']:.1f} s, "
          f"speedup {w['speedup']:.2f}x")
    print(f"bench wall time {report['wall_s']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
