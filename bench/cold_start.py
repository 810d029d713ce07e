"""Cold start on a CPU the bundle meets for the first time: ISA-level baseline code at once,
the exact code built in the background, against compiling from source.

    python bench/cold_start.py [--kernels 4] [--repeat 3] [--calls 50] [--json]
    python bench/cold_start.py --short

First, whole fresh processes (`bench/whole_process.py`: from interpreter start to a checked
result, each part beside the whole, wall and CPU time): a process with an empty cache that
loads the bundle, asks for the first kernel (served from the baseline tier) and calls it,
against a process that compiles the kernel from source with IREE and runs it, alternating,
max(5, --repeat) of each. Printed beside the table: portkern's part (load + kernel() + first
call + `import portkern`; goal <= 60 ms) and the whole process against the source process
(goal <= 0.25). `--short` measures only this, for one kernel and five processes each (CI checks
the results, and the whole-process ratio against twice README's figure: tests/test_benches.py).

Then, per kernel:

Held-out-like kernels: GEMM+bias+ReLU of seeded sizes that are not among the examples,
built into one bundle with `--prebuild cpu:x86-64-v2,cpu:x86-64-v3,cpu:x86-64-v4`.
every measurement runs in a fresh process with a fresh cache directory; libraries are
imported and the host CPU is probed before the clock starts (the probe, once per machine
and cache, is shown apart, and so is opening the bundle, once per bundle: reading and
checking it, its schema check memoised in the cache).

- first result, baseline: `bundle.kernel(name)` and its first call, the bundle open (the
  highest ISA level this CPU has serves; the exact code is then built in the background);
- first result, from source: the kernel's MLIR compiled for this CPU (a fresh compiler
  session), loaded, called once;
- call time of the baseline code and of the exact code after `wait()`, interleaved;
- exact code after `wait()` against a direct finalisation in the same process (the same
  bytes are expected; their call times are interleaved too).

Figures are medians over --repeat processes per kernel. Then what prebuilding costs on
this (build) host per ISA level, the AArch64 levels cross-compiled beside the x86-64
ones: seconds for all kernels of the bundle (median of --repeat passes, the levels taken in
turn within each pass) and the median size of a kernel's code (`--no-prebuild-costs`
leaves this out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from children import environment, python_report
from gemms import manifest_lines, write_gemms
from whole_process import GOAL_RATIO, at_goal, median_row, part_at, portkern_process, print_table, source_process

from portkern.cli.main import main as portkern_main
from portkern.jit import aarch64, devices
from portkern.jit.prebuild import prebuild
from portkern.portable.bundle import read_bundle

LEVELS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")

CHILD = textwrap.dedent(
    """
    import json, statistics, sys, time
    import numpy as np
    import filelock, iree.compiler.api, iree.runtime, jsonschema  # libraries imported before any clock
    import portkern
    import portkern.jit.loader
    from portkern.jit import cpu, devices, finalize
    from portkern.jit.runtime import Executable
    from portkern.portable.compiler import Compiler
    bundle_path, name, mode, calls = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    m, k, n = map(int, sys.argv[5:8])
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32),
            rng.standard_normal(n, dtype=np.float32)]
    reference = np.maximum(args[0].astype(np.float64) @ args[1] + args[2], 0)
    def ok(out):
        return bool(np.allclose(out, reference, rtol=1e-4, atol=1e-4))
    start = time.perf_counter()
    target = devices.resolve("cpu")
    probe_s = time.perf_counter() - start
    def per_call(*functions):
        times = [[] for _ in functions]
        for _ in range(calls):
            for i, f in enumerate(functions):
                began = time.perf_counter()
                f()
                times[i].append(time.perf_counter() - began)
        return [statistics.median(t) for t in times]
    report = {"probe_s": probe_s}
    if mode == "source":
        source = open(sys.argv[8], "rb").read()
        start = time.perf_counter()
        compiler = Compiler(cpu.flags(target.fingerprint))
        vmfb = compiler.to_vmfb(compiler.parse(source), from_phase="start")
        out = Executable(vmfb, name)(*args)[0]
        report.update(first_s=time.perf_counter() - start, ok=ok(out))
    else:
        start = time.perf_counter()
        loaded = portkern.load(bundle_path)
        report["load_s"] = time.perf_counter() - start
        start = time.perf_counter()
        kernel = loaded.kernel(name)
        out = kernel(*args)
        report.update(first_s=time.perf_counter() - start, ok=ok(out), origin=kernel.origin, built_for=kernel.native.built_for)
        baseline = kernel.executable
        report["waited"] = kernel.wait()
        report.update(exact_origin=kernel.origin, exact_for=kernel.native.built_for, exact_ok=ok(kernel(*args)))
        direct = finalize.finalize(loaded.bundle, loaded.record(name), target)
        report["same_bytes"] = direct == kernel.native.data
        direct_code = Executable(direct, loaded.record(name).entry)
        exact = kernel.executable
        baseline_s, exact_s, direct_s = per_call(lambda: baseline(*args), lambda: exact(*args), lambda: direct_code(*args))
        report.update(baseline_call_s=baseline_s, exact_call_s=exact_s, direct_call_s=direct_s)
    print(json.dumps(report))
    """
)


def child(bundle: Path, name: str, mode: str, calls: int, shape: tuple[int, int, int], source: Path, cache: Path) -> dict:
    args = (str(bundle), name, mode, str(calls), *map(str, shape), str(source))
    return python_report(CHILD, *args, env=environment(cache), timeout=1200, what=f"the {mode} run of {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--calls", type=int, default=50, help="calls per code when timing calls")
    parser.add_argument("--seed", type=int, default=7, help="seeds the kernels' sizes (the examples use seed-free fixed sizes)")
    parser.add_argument("--no-prebuild-costs", dest="prebuild_costs", action="store_false",
                        help="leave out the build-host cost of each ISA level's prebuild")
    parser.add_argument("--short", action="store_true", help="whole processes only, one kernel, five processes each (CI)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if platform.machine().lower() not in ("x86_64", "amd64"):
        print("the ISA-level baselines here are x86-64 ones; nothing to measure on this machine")
        return 0
    if args.short:
        args.kernels, args.repeat = 1, 3
    with tempfile.TemporaryDirectory(prefix="portkern-bench-cold-") as tmp:
        root = Path(tmp)
        shapes = build(root, args)
        whole = whole_processes(root, shapes, 5 if args.short else max(5, args.repeat))
        if args.short:
            rows, costs = [], []
        else:
            rows = measure(root, shapes, args)
            costs = prebuild_costs(root / "held-out.pkb", args.repeat) if args.prebuild_costs else []
    report(rows, costs, args, whole)
    return 0 if whole["ok"] else 1


def whole_processes(root: Path, shapes: dict, repeat: int) -> dict:
    """Whole fresh processes on a fresh device (an empty cache each) against the source process, alternating."""
    name = next(iter(shapes))
    fresh, source = [], []
    for i in range(repeat):
        fresh.append(portkern_process(root / "held-out.pkb", [name], shapes, root / f"cache-whole-{i}"))
        source.append(source_process(root / f"{name}.mlir", name, shapes[name]))
    rows = {"portkern, fresh device": median_row(fresh), "IREE from source": median_row(source)}
    own, rest, allowed = part_at(fresh, rows["IREE from source"])
    figures = {
        "portkern_part_ms": own * 1e3,
        "rest_of_process_ms": rest * 1e3,
        "part_at_goal_ms": allowed * 1e3,
        "whole_over_source": rows["portkern, fresh device"]["whole_s"] / rows["IREE from source"]["whole_s"],
        "cpu_over_source": rows["portkern, fresh device"]["cpu_s"] / rows["IREE from source"]["cpu_s"],
    }
    ok = all(row["ok"] for row in rows.values()) and rows["portkern, fresh device"]["origins"] == ["baseline"]
    return {"kernel": name, "shape": shapes[name], "processes": repeat, "rows": rows, "figures": figures, "ok": ok}


def build(root: Path, args: argparse.Namespace) -> dict:
    """The held-out kernels' sources and their bundle with the ISA-level baseline tier; each name's (M, K, N)."""
    shapes = write_gemms(root, args.kernels, args.seed)
    (root / "manifest.yaml").write_text("\n".join(["bundle: held-out", "kernels:", *manifest_lines(shapes)]) + "\n")
    prebuild = ",".join(f"cpu:{level}" for level in LEVELS)
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet
        try:
            status = portkern_main(["build", str(root / "manifest.yaml"), "-o", str(root / "held-out.pkb"), "--prebuild", prebuild, "--json"])
        finally:
            sys.stdout = stdout
    if status != 0:
        raise SystemExit("building the bundle failed")
    return shapes


def prebuild_costs(bundle_path: Path, passes: int) -> list[dict]:
    """Per ISA level (x86-64 and AArch64): time to prebuild every kernel of the bundle, code sizes."""
    bundle = read_bundle(bundle_path)
    targets = [devices.resolve(f"cpu:{level}") for level in (*LEVELS, *aarch64.LEVELS)]  # probes not timed
    times: dict[str, list[float]] = {target.label: [] for target in targets}
    built = {}
    for _ in range(max(1, passes)):
        for target in targets:
            start = time.perf_counter()
            built[target.label] = prebuild(bundle, [target])
            times[target.label].append(time.perf_counter() - start)
    rows = []
    for target in targets:
        done = built[target.label]
        sizes = [n.size for record in done.bundle.kernels for n in record.native if n.target == target.label]
        rows.append({
            "level": target.fingerprint.arch, "isa": target.fingerprint.property("triple").split("-")[0], "kernels": len(sizes),
            "failures": [f"{f.kernel}: {f.error}" for f in done.failures], "build_s": statistics.median(times[target.label]),
            "median_size": statistics.median(sizes) if sizes else 0,
        })
    return rows


def measure(root: Path, shapes: dict, args: argparse.Namespace) -> list[dict]:
    """One row per kernel (see the module docstring)."""
    bundle = root / "held-out.pkb"

    rows = []
    for name, shape in shapes.items():
        runs = {"baseline": [], "source": []}
        for i in range(args.repeat):
            for mode in ("baseline", "source"):
                runs[mode].append(child(bundle, name, mode, args.calls, shape, root / f"{name}.mlir", root / f"cache-{name}-{mode}-{i}"))
        med = lambda mode, field: statistics.median(r[field] for r in runs[mode])  # noqa: E731
        base = runs["baseline"]
        row = {
            "kernel": name, "shape": shape,
            "served": base[0]["built_for"], "origin": base[0]["origin"], "exact": base[0]["exact_for"],
            "all_correct": all(r["ok"] for r in runs["source"]) and all(r["ok"] and r["exact_ok"] for r in base),
            "all_swapped": all(r["waited"] and r["exact_origin"] == "finalized" for r in base),
            "same_bytes": all(r["same_bytes"] for r in base),
            "probe_s": med("baseline", "probe_s"), "load_s": med("baseline", "load_s"),
            "first_baseline_s": med("baseline", "first_s"), "first_source_s": med("source", "first_s"),
            "baseline_call_ms": med("baseline", "baseline_call_s") * 1e3, "exact_call_ms": med("baseline", "exact_call_s") * 1e3,
            "direct_call_ms": med("baseline", "direct_call_s") * 1e3,
        }
        row["first_ratio"] = row["first_baseline_s"] / row["first_source_s"]
        row["exact_over_direct"] = row["exact_call_ms"] / row["direct_call_ms"]
        rows.append(row)
    return rows


def report(rows: list[dict], costs: list[dict], args: argparse.Namespace, whole: dict) -> None:
    if args.json:
        json.dump({"repeat": args.repeat, "calls": args.calls, "whole_processes": whole, "kernels": rows, "prebuild": costs}, sys.stdout, indent=2)
        print()
        return
    figures = whole["figures"]
    print(f"fresh device (empty cache, ISA-level baseline tier) vs compiling {whole['kernel']} "
          f"{'x'.join(map(str, whole['shape']))} from source; whole fresh processes, median of {whole['processes']} each, alternating; ms")
    print_table(whole["rows"])
    print(f"portkern's part (import portkern + load + kernel() + first call): {figures['portkern_part_ms']:.1f} ms (goal <= 60); "
          f"whole process / source process: {figures['whole_over_source']:.3f} wall (goal <= {GOAL_RATIO}), {figures['cpu_over_source']:.3f} CPU")
    print(at_goal(figures))
    if not whole["ok"]:
        print("FAILED: a result was wrong, or a fresh process was not served baseline code")
    if not rows:
        return
    print()
    print(f"cold start, fresh process and cache per run, median of {args.repeat}; apart: probe of this CPU "
          f"{statistics.median(r['probe_s'] for r in rows):.2f} s (once per machine and cache), opening the bundle "
          f"{statistics.median(r['load_s'] for r in rows) * 1e3:.0f} ms (once per bundle)")
    print(f"{'kernel':<8} {'MxKxN':<12} {'served':<12} {'first result':>13} {'from source':>12} {'ratio':>6}  "
          f"{'call: baseline':>14} {'exact':>8} {'direct':>8} {'exact/direct':>12}  checks")
    for r in rows:
        checks = ", ".join(
            text for text, good in (("correct", r["all_correct"]), ("swapped", r["all_swapped"]), ("same bytes as direct", r["same_bytes"]))
            if good
        )
        print(f"{r['kernel']:<8} {'x'.join(map(str, r['shape'])):<12} {r['served']:<12} {r['first_baseline_s'] * 1e3:>10.1f} ms "
              f"{r['first_source_s'] * 1e3:>9.1f} ms {r['first_ratio']:>6.3f}  {r['baseline_call_ms']:>11.3f} ms {r['exact_call_ms']:>5.3f} ms "
              f"{r['direct_call_ms']:>5.3f} ms {r['exact_over_direct']:>12.3f}  {checks}")
    if not costs:
        return
    reference = next(c for c in costs if c["level"] == LEVELS[0])
    print(f"\nprebuild on this host, {len(rows)} kernels per level, median of {max(1, args.repeat)} passes (ratio: to {LEVELS[0]})")
    print(f"{'level':<12} {'ISA':<8} {'build':>9} {'ratio':>6} {'median size':>12}  failures")
    for c in costs:
        failed = "; ".join(c["failures"]) or "none"
        print(f"{c['level']:<12} {c['isa']:<8} {c['build_s']:>7.2f} s {c['build_s'] / reference['build_s']:>6.2f} "
              f"{c['median_size'] / 1024:>8.1f} KiB  {failed}")


if __name__ == "__main__":
    sys.exit(main())
