"""Serving throughput: calls per second from 1, 2, 4 and 8 threads and from 2 and 4 forked
processes, for a small kernel (the example `mlp`) and a large one (`gemm_bias_relu`).

    python bench/serving.py [--seconds 1.0] [--rounds 3] [--json]

One bundle is loaded and each kernel asked for once, in this process; threads call
that kernel object, and processes are forked from this one after it was called (as a
pre-fork server does). Each figure is the median over --rounds interleaved rounds of
--seconds of calls each (a load spike from elsewhere hits every row alike). Columns:
  portkern          Kernel.__call__ as shipped (NumPy in, NumPy out)
  executor only     the same kernel with every call run on IREE's local-task executor, as
                    portkern did before calls could run on the calling thread
Ratios are calls/s over the same column's one-thread figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.examples import MANIFEST
from portkern.examples.reference import EXAMPLES
from portkern.jit.loader import Kernel
from portkern.jit.runtime import Executable, distinct
from portkern.portable.builder import build_file

KERNELS = {"small": "mlp", "large": "gemm_bias_relu"}
THREADS = (1, 2, 4, 8)
PROCESSES = (2, 4)


def threads_rate(call: Callable[[], object], threads: int, seconds: float) -> float:
    """Calls per second of `threads` threads calling for `seconds`."""
    counts = [0] * threads
    start = threading.Barrier(threads + 1)
    deadline = [0.0]

    def work(i: int) -> None:
        start.wait()
        n = 0
        while time.perf_counter() < deadline[0]:
            call()
            n += 1
        counts[i] = n

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    began = time.perf_counter()
    deadline[0] = began + seconds
    start.wait()
    for worker in workers:
        worker.join()
    return sum(counts) / (time.perf_counter() - began)


def processes_rate(call: Callable[[], object], processes: int, seconds: float) -> float:
    """Calls per second of `processes` children forked from this process, each calling for `seconds`."""
    pipes, pids = [], []
    for _ in range(processes):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one untimed call (it loads the code again), then timed calls
            os.close(read)
            rate = 0.0
            try:
                call()
                n, began = 0, time.perf_counter()
                while time.perf_counter() - began < seconds:
                    call()
                    n += 1
                rate = n / (time.perf_counter() - began)
            finally:
                os.write(write, repr(rate).encode())
                os._exit(0)
        os.close(write)
        pipes.append(read)
        pids.append(pid)
    total = 0.0
    for read, pid in zip(pipes, pids):
        with os.fdopen(read) as reply:
            total += float(reply.read() or 0.0)
        os.waitpid(pid, 0)
    return total


class _OnExecutor:
    """Native code always run on the task executor, results copied to NumPy (the call before inline runs)."""

    def __init__(self, kernel) -> None:
        self._executable = Executable(kernel.native.data, kernel.record.entry, kernel.target.driver, kernel.executable.parameters)

    def __call__(self, *arrays):
        results = self._executable.invoke(*arrays)
        results = results if isinstance(results, (tuple, list)) else (results,)
        return distinct([np.asarray(r.to_host()) for r in results])


def executor_only(kernel) -> Kernel:
    """The same kernel (same argument checks) with every call on the task executor."""
    return Kernel(kernel.record, kernel.target, kernel.native, _OnExecutor(kernel))


def rows(kernels: dict, seconds: float, rounds: int) -> list[dict]:
    """One row per kernel and concurrency, with the median calls/s of each column."""
    modes = [("threads", n) for n in THREADS] + [("processes", n) for n in PROCESSES]
    samples: dict[tuple, list[float]] = {}
    for _ in range(rounds):
        for size, (kernel, inputs) in kernels.items():
            columns = {"portkern": lambda k=kernel: k(*inputs), "executor only": lambda k=executor_only(kernel): k(*inputs)}
            for column, call in columns.items():
                for mode, n in modes:
                    rate = (threads_rate if mode == "threads" else processes_rate)(call, n, seconds)
                    samples.setdefault((size, mode, n, column), []).append(rate)
    table = []
    for size in kernels:
        for mode, n in modes:
            row = {"kernel": KERNELS[size], "size": size, "mode": mode, "n": n}
            for column in ("portkern", "executor only"):
                rate = statistics.median(samples[(size, mode, n, column)])
                one = statistics.median(samples[(size, "threads", 1, column)])
                row[column] = {"calls_per_s": rate, "ratio": rate / one}
            table.append(row)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="calling time per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the median is shown)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="portkern-bench-serving-") as tmp:
        bundle = Path(tmp) / "examples.pkb"
        build_file(MANIFEST, bundle)
        loaded = portkern.load(bundle, store=Store(CacheConfig(Path(tmp) / "cache", 1 << 30, False)))
        kernels = {}
        for size, name in KERNELS.items():
            kernel = loaded.kernel(name)
            inputs = EXAMPLES[name].inputs(np.random.default_rng(0))
            for _ in range(5):
                kernel(*inputs)
            kernels[size] = (kernel, inputs)
        table = rows(kernels, args.seconds, args.rounds)
    if args.json:
        json.dump({"cores": os.cpu_count(), "seconds": args.seconds, "rounds": args.rounds, "rows": table}, sys.stdout, indent=2)
        print()
        return
    print(f"serving throughput on {os.cpu_count()} cores, calls/s (ratio to 1 thread), median of {args.rounds} rounds of {args.seconds:g} s")
    print(f"{'kernel':<16} {'callers':<12} {'portkern':>18} {'executor only':>18}")
    for row in table:
        cells = [f"{row[c]['calls_per_s']:>9.0f} ({row[c]['ratio']:4.2f}x)" for c in ("portkern", "executor only")]
        print(f"{row['kernel']:<16} {row['n']} {row['mode']:<10} {cells[0]:>18} {cells[1]:>18}")


if __name__ == "__main__":
    main()
