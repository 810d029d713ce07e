"""The worker pool's costs and gains, side by side in one run, on the example bundle.

    python bench/workers.py [--repeat 3] [--json]

- parallel warm-up: `LoadedBundle.prepare("cpu")` of a bundle of --warm-kernels kernels (the
  five examples plus GEMM+bias+ReLU kernels of seeded, varied sizes; 7 by default, of unequal
  cost) into an empty cache with a fresh pool of 1 and of 2 workers, ratio 1/2: once with the
  workers' start-up included (a fresh process that finalises at once), once with the workers
  started before the clock (`Pool.start`: a process that starts its pool while it does other
  work). The pool hands out the largest kernels first; two workers that fill two cores compile
  on one thread each (`jit.workers.compiler_threads`), one worker alone on the compiler's threads.
  Printed with each round's ratio and the workers' CPU seconds (CPU well under the wall time:
  other processes held the cores, and the ratios are not the pool's).
- the workers' start: seconds until a fresh pool's workers are ready (`Pool.start`, compiler
  imported), one worker alone and two at once (until both are ready), and the ratio the
  start-up-included warm-up could reach with those starts and the started-first runs:
  (start alone + 1 worker started first) / (two at once + 2 workers started first).
- warm time per further kernel: in one process whose cache holds every kernel, the time of
  `bundle.kernel(name)` for each kernel after the first (the first pays one-time costs).
- cold finalisation through a worker vs in this process: per kernel, `obtain` (cache miss,
  lock, a job on the pool's worker, check, store) into an empty cache, against
  `jit.finalize.finalize` in this process. Both sides are warmed alike first (the worker and
  this process each finalise every kernel once), so the ratio measures the route through a
  worker, not which process compiled more before; ratio worker/in-process.
- the compile-time bound: a module whose compile takes tens of seconds, with
  PORTKERN_COMPILE_TIMEOUT=2 and a worker up: seconds until `kernel()` raises FinalizeError.

Figures are medians over --repeat rounds; the rounds interleave the compared sides.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import portkern
from portkern.base.errors import FinalizeError
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.examples import MANIFEST
from portkern.jit import devices, finalize
from portkern.jit.workers import Pool
from portkern.portable.builder import build_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fuzzing import slow_module  # noqa: E402
from gemms import manifest_lines, write_gemms  # noqa: E402

#: The example kernels' sources (the warm-up bundle starts with them).
EXAMPLE_SOURCES = {"gemm_bias_relu": "gemm_bias_relu.mlir", "gemm_glu": "gemm_glu.mlir", "gemm_rowsum": "gemm_rowsum.mlir",
                   "gemm_transpose_add": "gemm_transpose_add.mlir", "mlp": "mlp.onnx"}


def fresh_store(root: Path) -> Store:
    return Store(CacheConfig(Path(tempfile.mkdtemp(dir=root)), 1 << 32, False))


def warm_up(path: Path, root: Path, workers: int, started: bool = False) -> tuple[float, float]:
    """Seconds to prepare every kernel into an empty cache with a fresh pool of `workers`
    (`started`: the workers started and ready before the clock), and the CPU seconds its workers
    used in all (their start included)."""
    with Pool(workers=workers) as pool:
        bundle = portkern.load(path, store=fresh_store(root), pool=pool)
        if started:
            pool.start(wait_ready=True)
        start = time.perf_counter()
        prepared = bundle.prepare("cpu", workers=workers)
        elapsed = time.perf_counter() - start
        cpu = sum(cpu_seconds(pid) for pid in pool.pids)
    assert all(n.origin == "finalized" for n in prepared.values()), prepared
    return elapsed, cpu


def worker_start(workers: int) -> float:
    """Seconds until a fresh pool's `workers` workers are all ready."""
    with Pool(workers=workers) as pool:
        start = time.perf_counter()
        pool.start(wait_ready=True)
        return time.perf_counter() - start


def warm_up_bundle(root: Path, kernels: int, seed: int = 0) -> Path:
    """A bundle of the example kernels plus GEMM+bias+ReLU kernels of varied sizes, `kernels` in all."""
    where = root / "warm-up"
    where.mkdir()
    lines = ["bundle: warm-up", "kernels:"]
    for name, source in ((n, MANIFEST.parent / s) for n, s in EXAMPLE_SOURCES.items()):
        shutil.copy(source, where / source.name)
        lines += [f"  - name: {name}", f"    source: {source.name}"]
    lines += manifest_lines(write_gemms(where, max(0, kernels - len(EXAMPLE_SOURCES)), seed))
    (where / "manifest.yaml").write_text("\n".join(lines) + "\n")
    build_file(where / "manifest.yaml", root / "warm-up.pkb")
    return root / "warm-up.pkb"


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cold_pair(path: Path, root: Path, pool: Pool, name: str) -> tuple[float, float, float, float]:
    """(through the pool's worker, in this process) seconds to finalise `name` into an empty
    cache: wall time, then CPU time (worker and this process together for the first)."""
    target = devices.resolve("cpu")
    bundle = portkern.load(path, store=fresh_store(root), pool=pool)
    plan = bundle.plan(bundle.record(name), target)
    pids = pool.pids
    worker_cpu = sum(cpu_seconds(pid) for pid in pids) + time.process_time()
    start = time.perf_counter()
    native = bundle.natives.obtain(plan)
    worker_s = time.perf_counter() - start
    worker_cpu = sum(cpu_seconds(pid) for pid in pids) + time.process_time() - worker_cpu
    assert native.origin == "finalized" and (not pids or pool.pids == pids)  # no worker replaced mid-measure
    local_cpu = time.process_time()
    start = time.perf_counter()
    finalize.finalize(bundle.bundle, bundle.record(name), target)
    return worker_s, time.perf_counter() - start, worker_cpu, time.process_time() - local_cpu


def past_the_bound(path: Path, root: Path, bound_s: float = 2.0) -> float:
    """Seconds from `kernel()` of a too-slow module to its FinalizeError, a worker being up."""
    where = Path(tempfile.mkdtemp(dir=root))
    (where / "slow.mlir").write_text(slow_module())
    (where / "manifest.yaml").write_text("bundle: slow\nkernels:\n  - name: slow\n    source: slow.mlir\n")
    build_file(where / "manifest.yaml", where / "slow.pkb")
    store = fresh_store(root)
    with Pool(workers=1) as pool:
        warm = portkern.load(path, store=store, pool=pool)
        warm.kernel(warm.names()[0])
        slow = portkern.load(where / "slow.pkb", store=store, pool=pool)
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
    parser.add_argument("--warm-kernels", type=int, default=7, help="kernels in the warm-up bundle (at least the 5 examples)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="portkern-bench-workers-"))
    atexit.register(shutil.rmtree, root, True)
    path = root / "examples.pkb"
    build_file(MANIFEST, path)
    names = portkern.load(path, store=fresh_store(root)).names()
    warm_path = warm_up_bundle(root, args.warm_kernels)
    warm_count = len(portkern.load(warm_path, store=fresh_store(root)).names())
    cold_pool = Pool(workers=1)
    for name in names:  # both sides warmed alike: each finalises every kernel once
        cold_pair(path, root, cold_pool, name)

    warm: dict[tuple[int, bool], list[float]] = {(w, up): [] for w in (1, 2) for up in (False, True)}
    warm_cpu: dict[tuple[int, bool], list[float]] = {side: [] for side in warm}
    starts: dict[int, list[float]] = {1: [], 2: []}
    further: dict[str, list[float]] = {}
    cold: dict[str, dict[str, list[float]]] = {n: {"worker": [], "in_process": [], "worker_cpu": [], "in_process_cpu": []} for n in names}
    for round_ in range(args.repeat):
        for workers, up in (list(warm) if round_ % 2 == 0 else list(warm)[::-1]):
            seconds, cpu = warm_up(warm_path, root, workers, up)
            warm[workers, up].append(seconds)
            warm_cpu[workers, up].append(cpu)
        for workers in starts:
            starts[workers].append(worker_start(workers))
        for name, seconds in warm_kernel_times(path, root).items():
            further.setdefault(name, []).append(seconds)
        for name in names:
            for column, value in zip(("worker", "in_process", "worker_cpu", "in_process_cpu"), cold_pair(path, root, cold_pool, name)):
                cold[name][column].append(value)

    cold_pool.close()
    med = statistics.median
    result = {
        "kernels": len(names),
        "warm_up_kernels": warm_count,
        "warm_up_1_worker_s": med(warm[1, False]),
        "warm_up_2_workers_s": med(warm[2, False]),
        "warm_up_speedup": med(warm[1, False]) / med(warm[2, False]),
        "warm_up_started_1_worker_s": med(warm[1, True]),
        "warm_up_started_2_workers_s": med(warm[2, True]),
        "warm_up_started_speedup": med(warm[1, True]) / med(warm[2, True]),
        "warm_up_ratios": [one / two for one, two in zip(warm[1, False], warm[2, False])],
        "warm_up_started_ratios": [one / two for one, two in zip(warm[1, True], warm[2, True])],
        "warm_up_1_worker_cpu_s": med(warm_cpu[1, False]),
        "warm_up_2_workers_cpu_s": med(warm_cpu[2, False]),
        "worker_start_alone_s": med(starts[1]),
        "worker_start_two_s": med(starts[2]),
        "warm_kernel_ms": {n: med(v) * 1e3 for n, v in further.items()},
        "warm_kernel_median_ms": med([med(v) for v in further.values()]) * 1e3,
        "cold_worker_s": {n: med(v["worker"]) for n, v in cold.items()},
        "cold_in_process_s": {n: med(v["in_process"]) for n, v in cold.items()},
        "cold_worker_cpu_s": {n: med(v["worker_cpu"]) for n, v in cold.items()},
        "cold_in_process_cpu_s": {n: med(v["in_process_cpu"]) for n, v in cold.items()},
    }
    result["warm_up_start_bound"] = (result["worker_start_alone_s"] + result["warm_up_started_1_worker_s"]) / (
        result["worker_start_two_s"] + result["warm_up_started_2_workers_s"])
    result["bound_s"] = 2.0
    result["bound_to_error_s"] = med([past_the_bound(path, root) for _ in range(args.repeat)])
    total_worker = sum(result["cold_worker_s"].values())
    total_local = sum(result["cold_in_process_s"].values())
    result["cold_worker_over_in_process"] = total_worker / total_local
    cpu_worker, cpu_local = sum(result["cold_worker_cpu_s"].values()), sum(result["cold_in_process_cpu_s"].values())
    result["cold_worker_over_in_process_cpu"] = cpu_worker / cpu_local if cpu_local else None
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"parallel warm-up of {warm_count} kernels (5 examples + GEMMs of varied sizes), fresh pool:")
    print(f"  start-up included: 1 worker {result['warm_up_1_worker_s']:.2f} s, 2 workers {result['warm_up_2_workers_s']:.2f} s: "
          f"{result['warm_up_speedup']:.2f}x (goal >= 1.6); rounds {', '.join(f'{r:.2f}' for r in result['warm_up_ratios'])}")
    print(f"    the workers' CPU: 1 worker {result['warm_up_1_worker_cpu_s']:.2f} s, 2 workers {result['warm_up_2_workers_cpu_s']:.2f} s")
    print(f"  workers started first: 1 worker {result['warm_up_started_1_worker_s']:.2f} s, 2 workers "
          f"{result['warm_up_started_2_workers_s']:.2f} s: {result['warm_up_started_speedup']:.2f}x; "
          f"rounds {', '.join(f'{r:.2f}' for r in result['warm_up_started_ratios'])}")
    print(f"  workers' start until ready: one alone {result['worker_start_alone_s']:.2f} s, two at once "
          f"{result['worker_start_two_s']:.2f} s; start-up-included ratio those starts allow: {result['warm_up_start_bound']:.2f}x")
    print(f"warm kernel() per further kernel: median {result['warm_kernel_median_ms']:.2f} ms "
          f"({', '.join(f'{n} {v:.2f}' for n, v in result['warm_kernel_ms'].items())})")
    print("cold finalisation, worker (already up) vs in-process:")
    for name in names:
        print(f"  {name:20s} {result['cold_worker_s'][name]:.3f} s vs {result['cold_in_process_s'][name]:.3f} s")
    print(f"  all kernels: {total_worker:.2f} s vs {total_local:.2f} s: worker/in-process {result['cold_worker_over_in_process']:.3f}")
    if result["cold_worker_over_in_process_cpu"] is not None:
        print(f"  CPU time (worker + this process vs this process): {cpu_worker:.2f} s vs {cpu_local:.2f} s: "
              f"{result['cold_worker_over_in_process_cpu']:.3f}")
    print(f"compile past PORTKERN_COMPILE_TIMEOUT={result['bound_s']:g}: FinalizeError after {result['bound_to_error_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
