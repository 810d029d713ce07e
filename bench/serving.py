"""Serving throughput: calls per second from 1, 2, 4 and 8 threads and from 2 and 4 forked
processes, for small kernels (the example `mlp`; a deployer's MNIST MLP and CNN, from
`examples/serving_models.py`, when `onnx` is installed) and a large one (`gemm_bias_relu`).

    python bench/serving.py [--seconds 1.0] [--rounds 3] [--kernels mlp,gemm_bias_relu] [--json]

One bundle is loaded and each kernel asked for once, in this process; threads call
that kernel object, and processes are forked from this one after it was called (as a
pre-fork server does). Each figure is the median over --rounds interleaved rounds of
--seconds of calls each (a load spike from elsewhere hits every row alike); one thread is
timed again just before each other figure, and a ratio is the median of those pairs. Columns:
  portkern          Kernel.__call__ as shipped (NumPy in, NumPy out)
  side by side      the same kernel with calls from several threads always side by side, as
                    before short calls could take turns at the gate
  executor only     the same kernel with every call run on IREE's local-task executor, as
                    portkern did before calls could run on the calling thread
Ratios are calls/s over the same column's one-thread figure. Each kernel's result is checked
against its NumPy reference before timing.
"""

from __future__ import annotations

import argparse
import importlib.util
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
from portkern.examples import MANIFEST, serving_models
from portkern.examples.reference import EXAMPLES
from portkern.jit.loader import Kernel
from portkern.jit.runtime import Executable
from portkern.jit.vmcall import distinct
from portkern.portable.builder import build_file

#: Kernel -> its size class, in the order of the table.
KERNELS = {"mlp": "small", "mnist_mlp": "small", "mnist_cnn": "small", "gemm_bias_relu": "large"}
COLUMNS = ("portkern", "side by side", "executor only")
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


class _SideBySide(Executable):
    """Native code whose short calls never take turns at the gate."""

    @property
    def _choice(self) -> None:
        return None

    @_choice.setter
    def _choice(self, value) -> None:
        pass


def side_by_side(kernel) -> Kernel:
    """The same kernel (same argument checks) with calls from several threads side by side."""
    return Kernel(kernel.record, kernel.target, kernel.native, _SideBySide(kernel.native.data, kernel.record.entry, kernel.target.driver, kernel.executable.parameters))


def rows(kernels: dict, seconds: float, rounds: int) -> list[dict]:
    """One row per kernel and concurrency: each column's median calls/s, and its median ratio
    to one thread timed just before it (this VM's speed drifts by up to 20 % within a minute:
    a ratio of neighbouring figures is steadier than a ratio of medians)."""
    modes = [("threads", n) for n in THREADS if n > 1] + [("processes", n) for n in PROCESSES]
    variants = {name: {"portkern": kernel, "side by side": side_by_side(kernel), "executor only": executor_only(kernel)}
                for name, (kernel, _) in kernels.items()}
    samples: dict[tuple, list[float]] = {}
    ratios: dict[tuple, list[float]] = {}
    for _ in range(rounds):
        for name, (_, inputs) in kernels.items():
            for column, kernel in variants[name].items():
                call = lambda k=kernel: k(*inputs)  # noqa: E731
                for _ in range(5):  # past the inline probes
                    call()
                for mode, n in modes:
                    one = threads_rate(call, 1, seconds)
                    rate = (threads_rate if mode == "threads" else processes_rate)(call, n, seconds)
                    samples.setdefault((name, "threads", 1, column), []).append(one)
                    samples.setdefault((name, mode, n, column), []).append(rate)
                    ratios.setdefault((name, mode, n, column), []).append(rate / one)
    table = []
    for name in kernels:
        for mode, n in [("threads", 1)] + modes:
            row = {"kernel": name, "size": KERNELS[name], "mode": mode, "n": n}
            for column in COLUMNS:
                key = (name, mode, n, column)
                row[column] = {"calls_per_s": statistics.median(samples[key]), "ratio": statistics.median(ratios[key]) if key in ratios else 1.0}
            table.append(row)
    return table


def checked_kernels(tmp: Path, names: list[str]) -> dict:
    """name -> (kernel, inputs) for the named kernels, each call checked against NumPy once."""
    store = Store(CacheConfig(tmp / "cache", 1 << 30, False))
    sources = {}
    if any(name in EXAMPLES for name in names):
        build_file(MANIFEST, tmp / "examples.pkb")
        loaded = portkern.load(tmp / "examples.pkb", store=store)
        sources.update({name: (loaded, EXAMPLES[name]) for name in names if name in EXAMPLES})
    deployer = [name for name in names if name not in EXAMPLES]
    if deployer:
        if importlib.util.find_spec("onnx") is None:
            print(f"skipping {', '.join(deployer)}: they need the onnx package", file=sys.stderr)
        else:
            build_file(serving_models.manifest(tmp / "deployer"), tmp / "deployer.pkb")
            loaded = portkern.load(tmp / "deployer.pkb", store=store)
            models = {m.name: m for m in (serving_models.mnist_mlp(), serving_models.mnist_cnn())}
            sources.update({name: (loaded, models[name]) for name in deployer})
    kernels = {}
    for name in names:
        if name not in sources:
            continue
        loaded, example = sources[name]
        kernel = loaded.kernel(name)
        inputs = example.inputs(np.random.default_rng(0))
        got = kernel(*inputs)
        got = got if isinstance(got, tuple) else (got,)
        for have, want in zip(got, example.reference(*inputs)):
            np.testing.assert_allclose(have, want, rtol=example.rtol, atol=example.atol, err_msg=name)
        kernels[name] = (kernel, inputs)
    return kernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="calling time per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the median is shown)")
    parser.add_argument("--kernels", default=",".join(KERNELS), help=f"comma-separated, of {', '.join(KERNELS)}")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = [name for name in args.kernels.split(",") if name]
    unknown = [name for name in names if name not in KERNELS]
    if unknown:
        parser.error(f"unknown kernels: {', '.join(unknown)}")
    with tempfile.TemporaryDirectory(prefix="portkern-bench-serving-") as tmp:
        table = rows(checked_kernels(Path(tmp), names), args.seconds, args.rounds)
    if args.json:
        json.dump({"cores": os.cpu_count(), "seconds": args.seconds, "rounds": args.rounds, "rows": table}, sys.stdout, indent=2)
        print()
        return
    print(f"serving throughput on {os.cpu_count()} cores, calls/s (ratio to 1 thread timed just before), median of {args.rounds} rounds of {args.seconds:g} s")
    print(f"{'kernel':<16} {'callers':<12} " + " ".join(f"{c:>18}" for c in COLUMNS))
    for row in table:
        cells = [f"{row[c]['calls_per_s']:>9.0f} ({row[c]['ratio']:4.2f}x)" for c in COLUMNS]
        print(f"{row['kernel']:<16} {row['n']} {row['mode']:<10} " + " ".join(f"{cell:>18}" for cell in cells))


if __name__ == "__main__":
    main()
