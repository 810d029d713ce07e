"""A warm process against compiling from source: whole fresh processes, every kernel already cached.

    python bench/warm_start.py [--kernels 4] [--repeat 5] [--short] [--json]
    python bench/warm_start.py --per-kernel [--repeat 5] [--json]

Default: held-out-like GEMM+bias+ReLU kernels of seeded sizes (`bench/gemms.py`) in one bundle,
its cache filled once; then, alternating, --repeat fresh processes that load the bundle, ask
for the first kernel, call it, then ask for each further kernel, and as many fresh processes
that compile the first kernel from source with IREE and run it (`bench/whole_process.py`:
each part beside the whole, from interpreter start; wall and CPU time; medians). Printed:
the table, the first kernel's time after `import portkern` (load + kernel() + first call;
goal <= 30 ms), each further kernel's (goal <= 0.5 ms), and the whole process against the
source process. `--short`: two kernels, five processes each (CI checks the results, and the
whole-process ratio against twice README's figure: tests/test_benches.py).

`--split`: where a warm process's first kernel goes: --repeat fresh warm processes run with
`python -X importtime`; printed per module imported after `import portkern` (load + kernel() +
first call), the least self time over the processes, beside the first kernel's whole time; what is
not importing is the rest (reading and checking the bundle, the cache lookups, the runtime). Also
printed: how many record classes (`dataclasses.dataclass`) those imports define and what defining
them costs (counted in as many more processes, without -X importtime, through a wrapper of
`dataclasses.dataclass` installed before `import portkern`).

`--per-kernel`: cold finalisation vs warm start per example kernel, each in a fresh process:
    cold: empty cache; portkern.load + bundle.kernel(name) + first call (finalises);
    warm: the cache filled by cold; the same three steps (loads native code).
One-time process costs (imports, starting the IREE runtime, opening the cache
database) are measured apart and not counted per kernel; reading and checking
the bundle is counted. Figures are medians of --repeat processes; the ratio is warm/cold.
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

from children import environment, last_json, python_report
from gemms import manifest_lines, write_gemms
from whole_process import GOAL_RATIO, at_goal, median_row, part_at, portkern_process, print_table, source_process

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


# `--split`: the first kernel of a warm process, everything else (NumPy, the inputs) imported and made before `import portkern`.
SPLIT_CHILD = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    path, names, shapes = sys.argv[1], sys.argv[2].split(","), json.loads(sys.argv[3])
    m, k, n = shapes[names[0]]
    rng = np.random.default_rng(0)
    a, b, bias = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    made = []  # (seconds, name) of each record class defined through `dataclasses.dataclass` (argv[4] == "records")
    if sys.argv[4:] == ["records"]:
        import dataclasses
        define = dataclasses.dataclass

        def counted(cls=None, /, **options):
            def wrap(c):
                began = time.perf_counter()
                record = define(c, **options)
                made.append((time.perf_counter() - began, f"{c.__module__}.{c.__qualname__}"))
                return record
            return wrap if cls is None else wrap(cls)

        dataclasses.dataclass = counted
    import portkern
    before = len(made)
    start = time.perf_counter()
    out = portkern.load(path).kernel(names[0])(a, b, bias)
    first = time.perf_counter() - start
    ok = bool(np.allclose(out, np.maximum(a.astype(np.float64) @ b + bias, 0), rtol=1e-4, atol=1e-4))
    print(json.dumps({"first_s": first, "ok": ok, "records": made[before:]}))
    """
)


def measure(bundle: Path, name: str, cache_dir: Path) -> dict:
    return python_report(CHILD, str(bundle), name, env=environment(cache_dir))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--kernels", type=int, default=4, help="kernels in the bundle (the first is timed first, the others as further kernels)")
    parser.add_argument("--seed", type=int, default=11, help="seeds the kernels' sizes")
    parser.add_argument("--short", action="store_true", help="two kernels, five processes each (CI)")
    parser.add_argument("--per-kernel", action="store_true", help="cold finalisation vs warm start per example kernel")
    parser.add_argument("--split", action="store_true", help="where the first kernel's time goes: imports per module, and the rest")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.split:
        return split(args)
    if not args.per_kernel:
        return whole_processes(args)
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


def held_out(root: Path, count: int, seed: int) -> tuple[dict, list[str], Path, Path]:
    """`count` held-out GEMMs written and built into one bundle under `root`: their shapes, names,
    the bundle and the (still empty) cache directory."""
    shapes = write_gemms(root, count, seed)
    names = list(shapes)
    (root / "manifest.yaml").write_text("\n".join(["bundle: held-out", "kernels:", *manifest_lines(names)]) + "\n")
    bundle = root / "held-out.pkb"
    build_file(root / "manifest.yaml", bundle)
    return shapes, names, bundle, root / "cache"


def whole_processes(args: argparse.Namespace) -> int:
    """The default bench (see the module docstring); non-zero when a result is wrong."""
    count, repeat = (2, 5) if args.short else (max(2, args.kernels), max(1, args.repeat))
    with tempfile.TemporaryDirectory(prefix="portkern-bench-warm-") as tmp:
        root = Path(tmp)
        shapes, names, bundle, cache = held_out(root, count, args.seed)
        filled = fill_cache(bundle, names, cache)
        warm, source = [], []
        for _ in range(repeat):  # alternating, so that a busy machine disturbs both alike
            warm.append(portkern_process(bundle, names, shapes, cache))
            source.append(source_process(root / f"{names[0]}.mlir", names[0], shapes[names[0]]))
    rows = {"portkern, warm": median_row(warm), "IREE from source": median_row(source)}
    first = statistics.median(r["load_s"] + r["kernel_s"] + r["call_s"] for r in warm)
    figures = {
        "first_kernel_ms": first * 1e3,
        "further_kernel_ms": rows["portkern, warm"]["further_s"] * 1e3,
        "whole_over_source": rows["portkern, warm"]["whole_s"] / rows["IREE from source"]["whole_s"],
        "cpu_over_source": rows["portkern, warm"]["cpu_s"] / rows["IREE from source"]["cpu_s"],
    }
    own, rest, allowed = part_at(warm, rows["IREE from source"])
    figures.update(portkern_part_ms=own * 1e3, rest_of_process_ms=rest * 1e3, part_at_goal_ms=allowed * 1e3)
    ok = filled and all(row["ok"] for row in rows.values()) and rows["portkern, warm"]["origins"] == ["cache"]
    if args.json:
        json.dump({"kernels": {n: shapes[n] for n in names}, "processes": repeat, "rows": rows, "figures": figures, "ok": ok}, sys.stdout, indent=2)
        print()
    else:
        print(f"warm process (every kernel cached) vs compiling {names[0]} {'x'.join(map(str, shapes[names[0]]))} from source; "
              f"whole fresh processes, median of {repeat} each, alternating; ms")
        print_table(rows)
        print(f"first kernel after import portkern (load + kernel() + first call): {figures['first_kernel_ms']:.1f} ms (goal <= 30); "
              f"each further kernel(): {figures['further_kernel_ms']:.2f} ms (goal <= 0.5)")
        print(f"whole process / source process: {figures['whole_over_source']:.3f} wall (goal <= {GOAL_RATIO}), "
              f"{figures['cpu_over_source']:.3f} CPU")
        print(at_goal(figures))
        if not ok:
            print("FAILED: a result was wrong, or a warm process did not find its kernels cached")
    return 0 if ok else 1


def split(args: argparse.Namespace) -> int:
    """The `--split` report (see the module docstring)."""
    count, repeat = max(2, args.kernels), max(1, args.repeat)
    with tempfile.TemporaryDirectory(prefix="portkern-bench-warm-") as tmp:
        root = Path(tmp)
        shapes, names, bundle, cache = held_out(root, count, args.seed)
        if not fill_cache(bundle, names, cache):
            print("FAILED: the cache could not be filled")
            return 1
        env = environment(cache)
        argv = [sys.executable, "-X", "importtime", "-c", SPLIT_CHILD, str(bundle), ",".join(names), json.dumps(shapes)]
        subprocess.run(argv, env=env, capture_output=True, check=True)  # (the modules' .pyc written)
        firsts: list[float] = []
        selves: dict[str, list[float]] = {}
        records: list[tuple[int, float]] = []
        for _ in range(repeat):
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            report = last_json(done.stdout)
            if not report["ok"]:
                print("FAILED: a result was wrong")
                return 1
            firsts.append(report["first_s"] * 1e3)
            counted = subprocess.run([sys.executable, "-c", SPLIT_CHILD, *argv[5:], "records"], env=env, capture_output=True, text=True, check=True)
            made = last_json(counted.stdout)["records"]
            records.append((len(made), sum(seconds for seconds, _ in made) * 1e3))
            for module, self_us in imported_after(done.stderr, "portkern"):
                selves.setdefault(module, []).append(self_us / 1e3)
    least = {module: min(times) for module, times in selves.items()}
    imports = sum(least.values())
    first = statistics.median(firsts)
    defined = {"count": max(n for n, _ in records), "ms": min(ms for _, ms in records)}
    if args.json:
        json.dump({"processes": repeat, "first_kernel_ms": first, "imports_ms": imports, "modules_ms": least, "records": defined},
                  sys.stdout, indent=2)
        print()
        return 0
    print(f"a warm process's first kernel (load + kernel() + first call), {repeat} fresh processes with -X importtime")
    print(f"first kernel: {first:.1f} ms (median; -X importtime itself adds to it); imports in it: {imports:.1f} ms "
          f"(each module's least self time) in {len(least)} modules; the rest: {first - imports:.1f} ms")
    print(f"record classes (dataclasses) defined by those imports: {defined['count']}, {defined['ms']:.1f} ms "
          f"(least over as many processes without -X importtime; part of the modules' self times below)")
    groups: dict[str, float] = {}
    for module, ms in least.items():
        group = module if module.startswith("portkern.") else module.split(".")[0]
        groups[group] = groups.get(group, 0.0) + ms
    for group, ms in sorted(groups.items(), key=lambda item: -item[1]):
        print(f"  {ms:7.2f} ms  {group}")
    return 0


def imported_after(importtime: str, first: str) -> list[tuple[str, int]]:
    """(module, self time in us) of each module `python -X importtime` reports after module `first`."""
    found, seen = [], False
    for line in importtime.splitlines():
        parts = line.split("|")
        if not line.startswith("import time:") or len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        module = parts[2].strip()
        if seen:
            found.append((module, int(parts[0].split(":")[1])))
        seen = seen or module == first
    return found


def fill_cache(bundle: Path, names: list[str], cache: Path) -> bool:
    """Every kernel finalised into `cache` (in a process of its own); whether they all were."""
    code = ("import sys, portkern\nb = portkern.load(sys.argv[1])\nfor n in sys.argv[2].split(','):\n"
            "    k = b.kernel(n); k.wait()\nprint(all(b.kernel(n).origin == 'cache' for n in sys.argv[2].split(',')))")
    done = subprocess.run([sys.executable, "-c", code, str(bundle), ",".join(names)], env={**os.environ, "PORTKERN_CACHE_DIR": str(cache)},
                          capture_output=True, text=True, timeout=1200)
    return done.returncode == 0 and done.stdout.strip().endswith("True")


if __name__ == "__main__":
    sys.exit(main())
