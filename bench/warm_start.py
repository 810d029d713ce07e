"""Cold finalisation vs warm start from the cache, per example kernel, in one run.

    python bench/warm_start.py [--repeat 5] [--json]

Each measurement runs in a fresh Python process (nothing memoised in memory):
    cold: empty cache; portkern.load + bundle.kernel(name) + first call (finalises);
    warm: the cache filled by cold; the same three steps (loads native code).
One-time process costs (imports, starting the IREE runtime, opening the cache
database) are measured apart and not counted per kernel; reading and checking
the bundle is counted. Children run with Python's default .pyc caching. Figures are medians of --repeat
processes; the ratio is warm/cold.
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

from portkern.examples import MANIFEST
from portkern.portable.builder import build_file
from portkern.portable.manifest import load_manifest

# Times one kernel's load + kernel() + first call in a fresh process, after warming up the process itself.
CHILD = textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    import numpy as np
    import portkern
    from portkern.examples.reference import EXAMPLES
    from portkern.cache.store import default_store
    from portkern.jit.runtime import runtime_config
    import portkern.jit.cpu, portkern.jit.loader
    runtime_config("local-task")
    default_store().enabled
    setup = time.perf_counter() - t0
    path, name = sys.argv[1], sys.argv[2]
    inputs = EXAMPLES[name].inputs(np.random.default_rng(0))
    start = time.perf_counter()
    kernel = portkern.load(path).kernel(name)
    ready = time.perf_counter()
    kernel(*inputs)
    done = time.perf_counter()
    print(json.dumps({"setup_s": setup, "ready_s": ready - start, "elapsed_s": done - start, "origin": kernel.origin}))
    """
)


def measure(bundle: Path, name: str, cache_dir: Path) -> dict:
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(cache_dir)}
    # Python's default: compiled modules are cached as .pyc (some sandboxes turn that off,
    # which makes every lazily imported module count as compile time).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(bundle), name], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = [k.name for k in load_manifest(MANIFEST).kernels]
    rows, setups = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bundle = tmp / "examples.pkb"
        build_file(MANIFEST, bundle)
        for name in names:
            cold, warm, ready = [], [], []
            for i in range(args.repeat):
                cache_dir = tmp / f"cache-{name}-{i}"
                first = measure(bundle, name, cache_dir)
                second = measure(bundle, name, cache_dir)
                assert (first["origin"], second["origin"]) == ("finalized", "cache"), (first, second)
                cold.append(first["elapsed_s"])
                warm.append(second["elapsed_s"])
                ready.append(second["ready_s"])
                setups.append(second["setup_s"])
            c, w = statistics.median(cold), statistics.median(warm)
            rows.append({"kernel": name, "cold_s": c, "warm_s": w, "warm_ready_s": statistics.median(ready), "ratio": w / c})
    setup = statistics.median(setups)
    if args.json:
        json.dump({"repeat": args.repeat, "process_setup_s": setup, "kernels": rows}, sys.stdout, indent=2)
        print()
        return 0
    print(f"cold finalise vs warm cache start (load + kernel() + first call), fresh process each, median of {args.repeat}")
    print(f"{'kernel':<20} {'cold':>10} {'warm':>10} {'warm/cold':>10}   {'warm until callable (load + kernel())':>38}")
    for r in rows:
        print(f"{r['kernel']:<20} {r['cold_s'] * 1e3:>8.1f}ms {r['warm_s'] * 1e3:>8.2f}ms {100 * r['ratio']:>9.2f}%   {r['warm_ready_s'] * 1e3:>36.2f}ms")
    print(f"one-time process setup (imports, IREE runtime start, cache open), not counted above: {setup * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
