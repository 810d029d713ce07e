"""`portkern run`: one kernel of a bundle on .npy inputs, results to .npz."""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

from portkern.base.errors import ArgumentTypeError, PortkernError, brief
from portkern.cli.common import JSON_FORMAT, Report, add_cache_dir, add_json, store_from, table


def register(sub) -> None:
    run = sub.add_parser("run", help="run one kernel on .npy inputs")
    run.add_argument("bundle", type=Path)
    run.add_argument("kernel")
    run.add_argument("--inputs", nargs="*", type=Path, default=[], metavar="NPY", help="one .npy file per argument")
    run.add_argument("--out", type=Path, help="write results to this .npz file (result0, result1, ...); the name must end in .npz")
    run.add_argument("--device", default="cpu", help="device spec (default: cpu)")
    run.add_argument("--tune", default=None, help="tuning strategy to apply first (default: none; use a stored result)")
    add_cache_dir(run)
    add_json(run)
    run.set_defaults(handler=run_kernel)


def load_inputs(paths: list[Path]) -> list:
    """Arrays from .npy files; pickled object arrays, and files shorter than their header
    says (empty, truncated, or claiming more elements than they hold), are refused."""
    import numpy as np

    arrays = []
    for index, path in enumerate(paths):
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
                version = np.lib.format.read_magic(f)
                if version in read_header:
                    shape, _, dtype = read_header[version](f)
                    count = math.prod(shape)
                    if not dtype.hasobject and count * dtype.itemsize > size - f.tell():
                        raise ValueError(f"its header says {count} elements of {dtype}, {count * dtype.itemsize} bytes; the file holds {size - f.tell()}")
                f.seek(0)
                arrays.append(np.load(f, allow_pickle=False))
        except (OSError, ValueError, EOFError, MemoryError) as exc:
            raise ArgumentTypeError(f"input {index} ({path}): cannot read a .npy array: {brief(exc) or type(exc).__name__}") from None
    return arrays


def run_kernel(args: argparse.Namespace) -> Report:
    import numpy as np

    import portkern

    if args.out is not None and args.out.suffix != ".npz":
        raise ArgumentTypeError(f"--out {args.out}: results are written as a NumPy .npz archive; give a name ending in .npz")
    inputs = load_inputs(args.inputs)
    bundle = portkern.load(args.bundle, store=store_from(args))
    started = time.perf_counter()
    kernel = bundle.kernel(args.kernel, device=args.device, tune=args.tune)
    ready = time.perf_counter()
    results = kernel(*inputs)
    called = time.perf_counter()
    results = results if isinstance(results, tuple) else (results,)
    if args.out:
        try:
            with open(args.out, "wb") as out:
                np.savez(out, **{f"result{i}": r for i, r in enumerate(results)})  # type: ignore[arg-type]  # numpy's stub reads the names as allow_pickle
        except OSError as exc:
            raise PortkernError(f"cannot write {args.out}: {exc}") from None
    data = {
        "json_format": JSON_FORMAT,
        "kernel": kernel.name,
        "device": kernel.device,
        "config": kernel.config,
        "origin": kernel.origin,
        "stage": kernel.stage,
        "out": str(args.out) if args.out else None,
        "results": [{"name": f"result{i}", "shape": list(r.shape), "dtype": str(r.dtype)} for i, r in enumerate(results)],
        # kernel_s: getting the kernel ready (cache, finalisation, tuning); call_s: reading the inputs and the call
        "timings": {"kernel_s": ready - started, "call_s": called - ready},
    }

    def render(out):
        rows = [[d["name"], "x".join(map(str, d["shape"])), d["dtype"]] for d in data["results"]]
        out.print(table(f"{kernel.name} on {kernel.device} (config {kernel.config}, {kernel.origin}, from {kernel.stage})", ["result", "shape", "dtype"], rows))
        if args.out:
            out.print(f"saved to {args.out}")

    return Report(data, render)
