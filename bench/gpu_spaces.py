"""Compile-only GPU tuning spaces: every candidate of every dispatch compiled and its code object checked.

    python bench/gpu_spaces.py [--targets gfx942,cuda:sm_90] [--budget N] [--workers N] [--json]

Builds the example kernels and a 768x384x640 f32 GEMM+ReLU, then per target
runs what `portkern tune BUNDLE --device T --compile-only` runs: each
dispatch's space (the compiler's default first) compiled in the worker pool,
each code object checked for the target (ELF machine and arch for AMD, PTX
target for NVIDIA). Per dispatch it prints candidates, valid code objects
(distinct: not byte-identical to an earlier candidate's), failures and
their reasons, and exits 1 if any code object failed its check or a
GEMM kernel's space has fewer than 16 distinct valid candidates. Outcomes,
not timings: a busy machine changes only how long it takes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.examples import GEMM_RELU_768, MANIFEST
from portkern.jit import devices
from portkern.jit.workers import Pool
from portkern.portable.builder import build_file
from portkern.tuner.compile_only import compile_space

GOAL = 16
#: The kernels whose contractions must have `GOAL` distinct valid candidates (the MLP's layers are
#: 32x128x64 and 32x16x128: too small for that many distinct tilings; reported, not required).
GOAL_KERNELS = ("gemm_bias_relu", "gemm_glu", "gemm_rowsum", "gemm_transpose_add", "gemm_relu_768")


def bundles(where: Path) -> list[Path]:
    """The example bundle and the 768x384x640 GEMM+ReLU's."""
    examples = where / "examples.pkb"
    build_file(MANIFEST, examples)
    (where / "gemm_relu_768.yaml").write_text(f"bundle: gemm768\nkernels:\n  - name: gemm_relu_768\n    source: {GEMM_RELU_768}\n")
    build_file(where / "gemm_relu_768.yaml", where / "gemm768.pkb")
    return [examples, where / "gemm768.pkb"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="gfx942,cuda:sm_90")
    parser.add_argument("--budget", type=int, help="at most N candidates per dispatch (default: the whole space)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows, problems = [], []
    with tempfile.TemporaryDirectory() as tmp, Pool(args.workers) as pool:
        store = Store(CacheConfig(Path(tmp) / "cache", 1 << 30, False))
        paths = bundles(Path(tmp))
        for spec in args.targets.split(","):
            target = devices.resolve(spec, store)
            for path in paths:
                loaded = portkern.load(path, store=store)
                for name in loaded.names():
                    started = time.perf_counter()
                    reports = compile_space(loaded.natives, loaded.record(name), target, pool, budget=args.budget)
                    for r in reports:
                        invalid = sum(1 for f in r.failures if f["status"] == "invalid")
                        distinct = r.compiled - r.duplicates
                        row = {"target": target.label, "kernel": name, **r.to_dict(), "distinct": distinct, "invalid": invalid,
                               "reasons": dict(r.reasons()), "kernel_wall_s": time.perf_counter() - started}
                        row["failed_configs"] = [f"{f['config']}: {f['reason']}" for f in row.pop("failures")]
                        rows.append(row)
                        if invalid:
                            problems.append(f"{target.label} {name} dispatch {r.index}: {invalid} invalid code objects")
                        if name in GOAL_KERNELS and r.candidates > 1 and args.budget is None and distinct - 1 < GOAL:
                            problems.append(f"{target.label} {name} dispatch {r.index}: {distinct - 1} distinct valid candidates (< {GOAL})")
    if args.json:
        print(json.dumps({"rows": rows, "problems": problems}, indent=2))
    else:
        print(f"{'target':<14} {'kernel':<20} {'d':>2} {'cand':>5} {'valid':>5} {'dist':>5} {'fail':>5} {'inval':>5} {'wall s':>7}  reasons / note")
        for r in rows:
            why = "; ".join(f"{n}x {k}" for k, n in Counter(r["reasons"]).most_common()) or r["note"]
            print(f"{r['target']:<14} {r['kernel']:<20} {r['index']:>2} {r['candidates']:>5} {r['compiled']:>5} {r['distinct']:>5} "
                  f"{r['failed']:>5} {r['invalid']:>5} {r['wall_s']:>7.1f}  {why[:140]}")
        print(f"invalid code objects served: 0 (every failing one is counted as failed); "
              f"invalid found: {sum(r['invalid'] for r in rows)}")
        for r in rows:
            for failure in r["failed_configs"]:
                print(f"failed: {r['target']} {r['kernel']} dispatch {r['index']}: {failure}")
        for p in problems:
            print(f"PROBLEM: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
