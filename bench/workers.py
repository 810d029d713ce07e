"""The worker pool's costs and gains, side by side in one run, on the example bundle.

    python bench/workers.py [--repeat 3] [--json]

- parallel warm-up: `LoadedBundle.prepare("cpu")` of every example kernel into an empty
  cache with a fresh pool of 1 and of 2 workers (worker start-up included); ratio 1/2.
- warm time per further kernel: in one process whose cache holds every kernel, the time of
  `bundle.kernel(name)` for each kernel after the first (the first pays one-time costs).
- cold finalisation through a worker vs in this process: per kernel, a worker that is
  already up (warmed on another kernel) finalising it into an empty cache, against
  `jit.finalize.finalize` in this process; ratio worker/in-process.
- the compile-time bound: a module whose compile takes tens of seconds, with
  PORTKERN_COMPILE_TIMEOUT=2 and a worker up: seconds until `kernel()` raises FinalizeError.

Figures are medians over --repeat rounds; the rounds interleave the compared sides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.examples import MANIFEST
from portkern.jit import devices, finalize
from portkern.jit.workers import Pool
from portkern.errors import FinalizeError
from portkern.portable.builder import build_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fuzzing import slow_module  # noqa: E402


def fresh_store(root: Path) -> Store:
    return Store(CacheConfig(Path(tempfile.mkdtemp(dir=root)), 1 << 32, False))


def warm_up(path: Path, root: Path, workers: int) -> float:
    """Seconds to prepare every kernel into an empty cache with a fresh pool of `workers`."""
    with Pool(workers=workers) as pool:
        bundle = portkern.load(path, store=fresh_store(root))
        bundle._pool = pool
        start = time.perf_counter()
        prepared = bundle.prepare("cpu", workers=workers)
        elapsed = time.perf_counter() - start
    assert all(n.origin == "finalized" for n in prepared.values()), prepared
    return elapsed


def warm_kernel_times(path: Path, root: Path) -> dict[str, float]:
    """Seconds of `kernel(name)` per kernel after the first, the cache holding them all."""
    store = fresh_store(root)
    portkern.load(path, store=store).prepare("cpu")
    bundle = portkern.load(path, store=store)
    names = bundle.names()
    bundle.kernel(names[0])
    times = {}
    for name in names[1:]:
        start = time.perf_counter()
        kernel = bundle.kernel(name)
        times[name] = time.perf_counter() - start
        assert kernel.origin == "cache"
    return times


def cold_pair(path: Path, root: Path, name: str, other: str) -> tuple[float, float]:
    """(through a worker that is up, in this process) seconds to finalise `name`."""
    target = devices.resolve("cpu")
    with Pool(workers=1) as pool:
        bundle = portkern.load(path, store=fresh_store(root))
        bundle._pool = pool
        bundle.kernel(other)  # the worker is up, with its compiler session for this target
        plan = bundle.plan(bundle.record(name), target)
        start = time.perf_counter()
        native = bundle.obtain(plan)
        worker_s = time.perf_counter() - start
    assert native.origin == "finalized"
    record = bundle.record(name)
    finalize.compiler_for(target)  # the in-process side also has its session already
    start = time.perf_counter()
    finalize.finalize(bundle.bundle, record, target)
    return worker_s, time.perf_counter() - start


def past_the_bound(path: Path, root: Path, bound_s: float = 2.0) -> float:
    """Seconds from `kernel()` of a too-slow module to its FinalizeError, a worker being up."""
    where = Path(tempfile.mkdtemp(dir=root))
    (where / "slow.mlir").write_text(slow_module())
    (where / "manifest.yaml").write_text("bundle: slow\nkernels:\n  - name: slow\n    source: slow.mlir\n")
    build_file(where / "manifest.yaml", where / "slow.pkb")
    store = fresh_store(root)
    with Pool(workers=1) as pool:
        warm = portkern.load(path, store=store)
        warm._pool = pool
        warm.kernel(warm.names()[0])
        slow = portkern.load(where / "slow.pkb", store=store)
        slow._pool = pool
        previous = os.environ.get("PORTKERN_COMPILE_TIMEOUT")
        os.environ["PORTKERN_COMPILE_TIMEOUT"] = str(bound_s)
        start = time.perf_counter()
        try:
            slow.kernel("slow")
        except FinalizeError:
            return time.perf_counter() - start
        finally:
            if previous is None:
                del os.environ["PORTKERN_COMPILE_TIMEOUT"]
            else:
                os.environ["PORTKERN_COMPILE_TIMEOUT"] = previous
    raise AssertionError("the slow module compiled within the bound")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="portkern-bench-workers-"))
    path = root / "examples.pkb"
    build_file(MANIFEST, path)
    names = portkern.load(path, store=fresh_store(root)).names()

    warm = {1: [], 2: []}
    further: dict[str, list[float]] = {}
    cold: dict[str, dict[str, list[float]]] = {n: {"worker": [], "in_process": []} for n in names}
    for _ in range(args.repeat):
        for workers in (1, 2):
            warm[workers].append(warm_up(path, root, workers))
        for name, seconds in warm_kernel_times(path, root).items():
            further.setdefault(name, []).append(seconds)
        for i, name in enumerate(names):
            worker_s, local_s = cold_pair(path, root, name, names[i - 1])
            cold[name]["worker"].append(worker_s)
            cold[name]["in_process"].append(local_s)

    med = statistics.median
    result = {
        "kernels": len(names),
        "warm_up_1_worker_s": med(warm[1]),
        "warm_up_2_workers_s": med(warm[2]),
        "warm_up_speedup": med(warm[1]) / med(warm[2]),
        "warm_kernel_ms": {n: med(v) * 1e3 for n, v in further.items()},
        "warm_kernel_median_ms": med([med(v) for v in further.values()]) * 1e3,
        "cold_worker_s": {n: med(v["worker"]) for n, v in cold.items()},
        "cold_in_process_s": {n: med(v["in_process"]) for n, v in cold.items()},
    }
    result["bound_s"] = 2.0
    result["bound_to_error_s"] = med([past_the_bound(path, root) for _ in range(args.repeat)])
    total_worker = sum(result["cold_worker_s"].values())
    total_local = sum(result["cold_in_process_s"].values())
    result["cold_worker_over_in_process"] = total_worker / total_local
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"parallel warm-up of {len(names)} example kernels (fresh pool, start-up included):")
    print(f"  1 worker {result['warm_up_1_worker_s']:.2f} s, 2 workers {result['warm_up_2_workers_s']:.2f} s: {result['warm_up_speedup']:.2f}x")
    print(f"warm kernel() per further kernel: median {result['warm_kernel_median_ms']:.2f} ms "
          f"({', '.join(f'{n} {v:.2f}' for n, v in result['warm_kernel_ms'].items())})")
    print("cold finalisation, worker (already up) vs in-process:")
    for name in names:
        print(f"  {name:20s} {result['cold_worker_s'][name]:.3f} s vs {result['cold_in_process_s'][name]:.3f} s")
    print(f"  all kernels: {total_worker:.2f} s vs {total_local:.2f} s: worker/in-process {result['cold_worker_over_in_process']:.3f}")
    print(f"compile past PORTKERN_COMPILE_TIMEOUT={result['bound_s']:g}: FinalizeError after {result['bound_to_error_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
