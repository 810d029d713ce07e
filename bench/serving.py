"""Serving throughput: calls per second of a small and a large kernel from 1 and 2 threads of
one process, and from 1 and 2 processes forked from it (a pre-fork server's workers).

    python bench/serving.py [--seconds 1.0] [--rounds 5] [--kernels mlp,gemm_bias_relu] [--json]

Kernels: the example `mlp` (small: most of a call is Python work), `gemm_bias_relu` (large:
most of a call is native work), and, with `onnx` installed, a deployer's MNIST MLP and CNN
(`mnist_mlp`, `mnist_cnn`, from `examples/serving_models.py`). One bundle is loaded and each
kernel asked for once, in this process, and run on its final code (`Kernel.wait`); threads call
that kernel object, and processes are forked from this one after it was called (each child
makes one untimed call, which loads the code again there, then all start together). Calls run
as `portkern` chooses for them (docs/serving.md; `PORTKERN_EXECUTOR_MIN_BYTES` applies).

Each round times, per kernel, 1 thread, 2 threads, 1 process and 2 processes back to back;
a figure is the median over --rounds rounds, and a ratio (2 threads over 1, 2 processes over
1) the median of each round's ratio of neighbouring figures, which a load spike from elsewhere
moves less than the figures themselves. Each kernel's result is checked against its NumPy
reference before timing.
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
from portkern.portable.builder import build_file

#: Kernel -> its size class.
KERNELS = {"mlp": "small", "mnist_mlp": "small", "mnist_cnn": "small", "gemm_bias_relu": "large"}
DEFAULT_KERNELS = ("mlp", "gemm_bias_relu")
#: (how, how many) -> its column, in the table's order.
MODES = {("threads", 1): "1 thread", ("threads", 2): "2 threads", ("processes", 1): "1 process", ("processes", 2): "2 processes"}


def threads_rate(call: Callable[[], object], threads: int, seconds: float) -> float:
    """Calls per second of `threads` threads of this process calling for `seconds`, started together."""
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
    """Calls per second of `processes` children forked from this process, each calling for
    `seconds` on its one thread once all have made their first (untimed) call."""
    ready_read, ready_write = os.pipe()
    go_read, go_write = os.pipe()
    replies, pids = [], []
    for _ in range(processes):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one untimed call (it loads the code again), then timed calls
            rate = 0.0
            try:
                call()
                os.write(ready_write, b".")
                os.read(go_read, 1)
                n, began = 0, time.perf_counter()
                while time.perf_counter() - began < seconds:
                    call()
                    n += 1
                rate = n / (time.perf_counter() - began)
            finally:
                os.write(write, repr(rate).encode())
                os._exit(0)
        os.close(write)
        replies.append(read)
        pids.append(pid)
    for _ in range(processes):
        os.read(ready_read, 1)
    os.write(go_write, b"." * processes)
    total = 0.0
    for read, pid in zip(replies, pids):
        with os.fdopen(read) as reply:
            total += float(reply.read() or 0.0)
        os.waitpid(pid, 0)
    for fd in (ready_read, ready_write, go_read, go_write):
        os.close(fd)
    return total


def rows(kernels: dict, seconds: float, rounds: int) -> list[dict]:
    """One row per kernel: per mode, the median calls/s over the rounds, and for 2 threads and
    2 processes the median ratio to 1 thread and 1 process of the same round."""
    samples: dict[tuple, list[float]] = {}
    for _ in range(rounds):
        for name, (kernel, inputs) in kernels.items():
            call = lambda k=kernel, i=inputs: k(*i)  # noqa: E731
            for mode, n in MODES:
                rate = (threads_rate if mode == "threads" else processes_rate)(call, n, seconds)
                samples.setdefault((name, mode, n), []).append(rate)
    table = []
    for name in kernels:
        row: dict = {"kernel": name, "size": KERNELS[name]}
        for (mode, n), key in MODES.items():
            row[key] = {"calls_per_s": statistics.median(samples[(name, mode, n)])}
            if n > 1:
                pairs = zip(samples[(name, mode, n)], samples[(name, mode, 1)])
                row[key]["ratio"] = statistics.median(many / one for many, one in pairs)
        table.append(row)
    return table


def checked_kernels(tmp: Path, names: list[str]) -> dict:
    """name -> (kernel, inputs) for the named kernels, on their final code, each checked against NumPy once."""
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
        if not kernel.wait(600):
            raise SystemExit(f"{name}: its final code was not built ({kernel.specialisation.error if kernel.specialisation else 'timeout'})")
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
    parser.add_argument("--rounds", type=int, default=5, help="rounds (medians are shown)")
    parser.add_argument("--kernels", default=",".join(DEFAULT_KERNELS), help=f"comma-separated, of {', '.join(KERNELS)}")
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
    print(f"serving throughput on {os.cpu_count()} cores: calls/s, median of {args.rounds} rounds of {args.seconds:g} s "
          "(ratio: 2 threads over 1 thread, 2 processes over 1 process, median of the rounds' ratios)")
    columns = [key for key in table[0] if key not in ("kernel", "size")] if table else []
    print(f"{'kernel':<16} {'size':<6} " + " ".join(f"{c:>17}" for c in columns))
    for row in table:
        cells = [f"{row[c]['calls_per_s']:.0f}" + (f" ({row[c]['ratio']:.2f}x)" if "ratio" in row[c] else "") for c in columns]
        print(f"{row['kernel']:<16} {row['size']:<6} " + " ".join(f"{cell:>17}" for cell in cells))


if __name__ == "__main__":
    main()
