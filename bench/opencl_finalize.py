"""Cold SPIR-V finalisation vs warm start from the cached binary, per OpenCL example kernel, in one run.

    python bench/opencl_finalize.py [--repeat 3] [--json]

Every sample is a fresh Python process, so nothing is warm in memory, and
PoCL's own kernel cache is off in all of them (POCL_KERNEL_CACHE=0 and a
fresh, empty POCL_CACHE_DIR per process):

(a) cold: an empty portkern cache; `bundle.kernel(name, device="opencl")`
    builds the program from the bundle's stage (SPIR 1.2 on PoCL), launches it
    to get native code and stores the binary; then the first call;
(b) warm: the cache a cold sample filled; the same two steps, now building
    the program from the cached native binary.

The timed region is kernel() plus the first call on the example's inputs;
process start, imports, loading the bundle and the device probe are outside
it. Figures are medians of --repeat samples; the ratio is a/b. A cold sample
includes PoCL's one-time LLVM start-up in that process (~0.3 s here), which
every process that finalises pays.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from children import environment, report


def worker(bundle_path: str, name: str) -> None:
    """One sample: print kernel-ready and first-call times as JSON."""
    import numpy as np

    import portkern
    from portkern.examples.reference import EXAMPLES
    from portkern.jit.devices import resolve

    bundle = portkern.load(bundle_path)
    target = resolve("opencl", bundle.store)
    inputs = EXAMPLES[name].inputs(np.random.default_rng(0))
    start = time.perf_counter()
    kernel = bundle.kernel(name, device="opencl")
    ready = time.perf_counter()
    kernel(*inputs)
    done = time.perf_counter()
    json.dump(
        {"ready_s": ready - start, "call_s": done - ready, "origin": kernel.origin, "binary": len(kernel.native.data), "device": target.label},
        sys.stdout,
    )


def sample(bundle: Path, name: str, cache: Path) -> dict:
    pocl = Path(tempfile.mkdtemp(prefix="bench-pocl-"))
    env = {**environment(cache, unset=("PORTKERN_CACHE_DISABLE",)), "POCL_KERNEL_CACHE": "0", "POCL_CACHE_DIR": str(pocl)}
    try:
        return report([sys.executable, __file__, "--worker", str(bundle), name], env=env, timeout=600, what=f"the worker for {name}")
    finally:
        shutil.rmtree(pocl, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", nargs=2, metavar=("BUNDLE", "KERNEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0

    from portkern.examples import OPENCL_MANIFEST
    from portkern.jit import opencl
    from portkern.portable.builder import build_file

    reason = opencl.unavailable()
    if reason:
        print(f"skipped: {reason}")
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-opencl-") as tmp:
        bundle = Path(tmp) / "opencl-examples.pkb"
        for record in build_file(OPENCL_MANIFEST, bundle).kernels:
            name = record.name
            cold = [sample(bundle, name, Path(tmp) / f"cold-{name}-{i}") for i in range(args.repeat)]
            warm = [sample(bundle, name, Path(tmp) / f"cold-{name}-0") for _ in range(args.repeat)]
            assert {s["origin"] for s in cold} == {"finalized"} and {s["origin"] for s in warm} == {"cache"}
            row = {"kernel": name, "device": cold[0]["device"], "binary_bytes": cold[0]["binary"]}
            for label, samples in (("cold", cold), ("warm", warm)):
                row[f"{label}_ready_s"] = statistics.median(s["ready_s"] for s in samples)
                row[f"{label}_call_s"] = statistics.median(s["call_s"] for s in samples)
                row[f"{label}_s"] = statistics.median(s["ready_s"] + s["call_s"] for s in samples)
            row["ratio"] = row["cold_s"] / row["warm_s"]
            rows.append(row)
    if args.json:
        json.dump({"repeat": args.repeat, "kernels": rows}, sys.stdout, indent=2)
        print()
        return 0
    print(f"OpenCL: cold SPIR-V finalisation vs warm start from the cached binary, {rows[0]['device']}, median of {args.repeat} fresh processes")
    print(f"{'kernel':<14} {'cold ready':>11} {'1st call':>9} {'warm ready':>11} {'1st call':>9} {'ratio a/b':>10} {'binary':>9}")
    for r in rows:
        print(
            f"{r['kernel']:<14} {r['cold_ready_s'] * 1e3:>8.1f} ms {r['cold_call_s'] * 1e3:>6.1f} ms "
            f"{r['warm_ready_s'] * 1e3:>8.1f} ms {r['warm_call_s'] * 1e3:>6.1f} ms {r['ratio']:>10.1f} {r['binary_bytes'] / 1024:>6.1f} KiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
