"""The first process after `portkern cache import` against the processes after it, in one run.

    python bench/first_process.py [--repeat 5] [--kernel gemm_bias_relu] [--json]

One kernel is finalised into a source cache and exported; then, --repeat times, a fresh
cache directory imports the export and three fresh processes each time
`portkern.load(...).kernel(name)` (served from the imported cache) and the first call:

    first:  the first process after the import (it probes the CPU: an import carries no
            device probes, which describe the machine that made them);
    later:  the next process (the probe is memoised in the cache);
    primed: the first process after an import followed by `portkern devices`.

Besides wall time, each child reports its own CPU time (user + sys, including the probe's
child process), which a busy machine disturbs less. Figures are medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from children import environment, python_report

from portkern.examples import MANIFEST
from portkern.portable.builder import build_file

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    import portkern
    from portkern.examples.reference import EXAMPLES
    from portkern.jit.runtime import runtime_config
    import portkern.jit.loader
    runtime_config("local-task")
    path, name = sys.argv[1], sys.argv[2]
    inputs = EXAMPLES[name].inputs(np.random.default_rng(0))
    bundle = portkern.load(path)
    cpu0, start = os.times(), time.perf_counter()
    kernel = bundle.kernel(name)
    ready = time.perf_counter()
    kernel(*inputs)
    done, cpu1 = time.perf_counter(), os.times()
    cpu = sum(cpu1[i] - cpu0[i] for i in range(4))
    print(json.dumps({"kernel_s": ready - start, "first_call_s": done - ready, "cpu_s": cpu, "origin": kernel.origin}))
    """
)


def child(bundle: Path, name: str, cache_dir: Path) -> dict:
    return python_report(CHILD, str(bundle), name, env=environment(cache_dir))


def cli(cache_dir: Path, *args: str) -> None:
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(cache_dir)}
    subprocess.run([sys.executable, "-m", "portkern", *args], env=env, capture_output=True, text=True, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--kernel", default="gemm_bias_relu")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"first": [], "later": [], "primed": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bundle, export = tmp / "examples.pkb", tmp / "warm.pkcx"
        build_file(MANIFEST, bundle)
        child(bundle, args.kernel, tmp / "source")
        cli(tmp / "source", "cache", "export", str(export))
        for i in range(args.repeat):
            plain, primed = tmp / f"plain-{i}", tmp / f"primed-{i}"
            for cache_dir in (plain, primed):
                cli(cache_dir, "cache", "import", str(export), "--allow-unsigned")  # timing, not trust: unsigned on purpose
            cli(primed, "devices")
            runs["first"].append(child(bundle, args.kernel, plain))
            runs["later"].append(child(bundle, args.kernel, plain))
            runs["primed"].append(child(bundle, args.kernel, primed))
    assert all(r["origin"] == "cache" for rs in runs.values() for r in rs), runs
    rows = {
        case: {field: statistics.median(r[field] for r in rs) for field in ("kernel_s", "first_call_s", "cpu_s")}
        for case, rs in runs.items()
    }
    if args.json:
        json.dump({"kernel": args.kernel, "repeat": args.repeat, "cases": rows}, sys.stdout, indent=2)
        print()
        return 0
    print(f"{args.kernel} served from an imported cache, fresh process each, median of {args.repeat}")
    print(f"{'process':<46} {'kernel()':>10} {'first call':>11} {'CPU time':>10}")
    labels = {"first": "first after `cache import`", "later": "the next one", "primed": "first after `cache import` + `portkern devices`"}
    for case, row in rows.items():
        print(f"{labels[case]:<46} {row['kernel_s'] * 1e3:>8.1f}ms {row['first_call_s'] * 1e3:>9.1f}ms {row['cpu_s'] * 1e3:>8.0f}ms")
    print(f"first/later kernel(): {rows['first']['kernel_s'] / rows['later']['kernel_s']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
