"""Finalising from the bundle vs compiling from source, per example kernel, as each is paid.

    python bench/finalize_vs_source.py [--repeat 5] [--amd-arch gfx942] [--short] [--json] [--debug]

Per example kernel, on this CPU, the sides taken in turn within each of --repeat rounds:

(a) source: one whole `iree-compile` process (`iree.compiler.compile_file`, the way a
    program compiles from source with IREE) of the kernel's MLIR to a vmfb, with the flags a
    finalisation uses for this CPU plus the front-end flags the bundle's stage was built with;
    for ONNX the importer's MLIR (the import itself is shown apart);
(b) bundle: what a cold `kernel()` pays before its first call: `NativeCode.obtain` into an
    empty cache: lookup, lock, a compile job on a worker of the pool (the worker already up, as
    in a process that has finalised before), the code check, the store write;
(c) in-process: the same stage compiled to the same code in this process (IREE's own compile;
    b/c is what the route through a worker adds);
(c0) verified: (c) with IREE verifying the IR after every pass, as `iree-compile` does (a
    finalisation verifies its module once, before the first pass); c/c0 is what that saves. The
    code of (b), (c) and (c0) is checked byte-identical;
(d) source in-process: the kernel's MLIR (as for (a)) parsed and compiled to a vmfb in this
    process, one compiler session kept as a worker keeps its own (IREE alone, no process start);
    c/d is IREE's own share of a finalisation against IREE's own compile from source, the
    least (b/a) can reach while the device compiles from the stored stage.

Both the worker and this process compile every kernel once before the clock starts. Each figure
is the median of --repeat runs; the ratio is b/a, and the median of the ratios is printed last.
A fresh worker's start (spawn, Python, importing IREE's compiler) is shown apart: a process pays
it once, for its first cold kernel. `--debug` logs every worker job's parts (DEBUG on
`portkern.jit.workers`).

Then the same for an AMD GPU arch (compile only, no GPU needed, in this process), three ways:
source -> code object; the device-independent (flow) stage with the real target attached ->
code object; the amdgpu placeholder stage with the real target swapped in -> code object.
Resolving the arch's target attribute (once per arch and compiler, memoised on devices) is
shown apart. `--short` (CI): the CPU rows only, 3 rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.examples import MANIFEST
from portkern.jit import amdgpu, codeobject, cpu, devices, finalize
from portkern.jit.gpu import fit
from portkern.jit.workers import Pool
from portkern.portable.builder import build, build_file
from portkern.portable.compiler import Compiler
from portkern.portable.lower import BUILD_FLAGS, import_onnx
from portkern.portable.manifest import load_manifest
from portkern.portable.source import fitted_phase


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--amd-arch", default="gfx942", help="AMD arch for the GPU comparison ('' to skip it)")
    parser.add_argument("--short", action="store_true", help="CPU rows only, 3 rounds (CI)")
    parser.add_argument("--debug", action="store_true", help="log each worker job's parts on stderr")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.short:
        args.repeat, args.amd_arch = 3, ""
    if args.debug:
        logging.basicConfig(stream=sys.stderr, format="%(name)s: %(message)s")
        logging.getLogger("portkern.jit.workers").setLevel(logging.DEBUG)
    with tempfile.TemporaryDirectory(prefix="portkern-bench-finalize-") as tmp:
        report = cpu_rows(Path(tmp), max(1, args.repeat), in_process=not args.short)
    report["amdgpu"] = amd_rows(args.amd_arch, args.repeat) if args.amd_arch else None
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
        return 0 if report["ok"] else 1
    print(f"finalise from the bundle vs compile from source, {report['device']}, median of {report['repeat']}")
    print(f"{'kernel':<20} {'(a) iree-compile':>16} {'(b) bundle':>11} {'(c) in-process':>15} {'(c0) verified':>14} "
          f"{'(d) source here':>16} {'b/c':>6} {'c/c0':>6} {'c/d':>6} {'b/a':>6}  note")
    for r in report["kernels"]:
        note = f"+ ONNX import {r['import_s']:.2f} s not counted in (a)" if r["kind"] == "onnx" else ""
        if r["in_process_s"]:
            here = (f"{r['in_process_s']:>13.3f} s {r['verified_s']:>12.3f} s {r['source_here_s']:>14.3f} s "
                    f"{r['bundle_s'] / r['in_process_s']:>6.2f} {r['in_process_s'] / r['verified_s']:>6.2f} "
                    f"{r['in_process_s'] / r['source_here_s']:>6.2f}")
        else:
            here = f"{'-':>15} {'-':>14} {'-':>16} {'-':>6} {'-':>6} {'-':>6}"
        print(f"{r['kernel']:<20} {r['source_s']:>14.3f} s {r['bundle_s']:>9.3f} s {here} {r['ratio']:>6.2f}  {note}")
    print(f"a fresh worker's start, paid once per process (its first cold kernel): {report['worker_start_s']:.2f} s")
    print(f"median ratio b/a {report['median_ratio']:.2f} (goal <= 0.5)")
    if report["iree_share"] is not None:
        print(f"median c/d {report['iree_share']:.2f}: IREE's own compile from the stored stage against IREE's own from source")
        print(f"median c/c0 {report['verify_share']:.2f}: verifying the module once against after every pass "
              f"(code byte-identical: {'yes' if report['identical'] else 'NO'})")
    if not report["ok"]:
        print("FAILED: a side gave no code, or (b), (c) and (c0) gave different code")
    amd = report["amdgpu"]
    if amd:
        print()
        print(f"AMD {amd['arch']} finalisation, compile only, in this process, median of {args.repeat} "
              f"(target attribute resolved once in {amd['resolve_s'] * 1000:.0f} ms, not counted)")
        print(f"{'kernel':<20} {'source':>9} {'flow stage':>11} {'placeholder':>12} {'flow/src':>9} {'ph/src':>7}  code")
        for r in amd["kernels"]:
            print(
                f"{r['kernel']:<20} {r['source_s']:>7.3f} s {r['flow_s']:>9.3f} s {r['placeholder_s']:>10.3f} s "
                f"{r['flow_s'] / r['source_s']:>9.2f} {r['placeholder_s'] / r['source_s']:>7.2f}  {r['code']}"
            )
    return 0 if report["ok"] else 1


def fresh_store(root: Path) -> Store:
    return Store(CacheConfig(Path(tempfile.mkdtemp(dir=root)), 1 << 32, False))


def cpu_rows(root: Path, repeat: int, in_process: bool = True) -> dict:
    """The CPU comparison (see the module docstring): one row per example kernel (side (c) only
    when `in_process`)."""
    from iree.compiler import compile_file

    target = devices.resolve("cpu")
    flags = [*cpu.flags(target.fingerprint), *BUILD_FLAGS]
    path = root / "examples.pkb"
    bundle = build_file(MANIFEST, path)
    sources, imports = {}, {}
    for spec in load_manifest(MANIFEST).kernels:
        if spec.kind == "onnx":
            start = time.perf_counter()
            text = import_onnx(spec.source)
            imports[spec.name] = time.perf_counter() - start
            sources[spec.name] = root / f"{spec.name}.mlir"
            sources[spec.name].write_bytes(text)
        elif spec.kind == "mlir":
            sources[spec.name] = spec.source
    kinds = {spec.name: spec.kind for spec in load_manifest(MANIFEST).kernels}
    out = root / "source.vmfb"

    def from_source(name: str) -> int:
        compile_file(str(sources[name]), extra_args=flags, output_file=str(out))
        return out.stat().st_size

    codes: dict[tuple[str, str], bytes] = {}

    def from_bundle(pool: Pool, name: str) -> tuple[float, int]:
        loaded = portkern.load(path, store=fresh_store(root), pool=pool)
        plan = loaded.plan(loaded.record(name), target)
        start = time.perf_counter()
        native = loaded.natives.obtain(plan)
        elapsed = time.perf_counter() - start
        assert native.origin == "finalized", native.origin
        codes["bundle", name] = native.data
        return elapsed, len(native.data)

    def compile_here(name: str, verify_each: bool = False) -> int:
        module, stage = finalize.stage_module(bundle, bundle.kernel(name), target)
        code = finalize.finish(target, module, fitted_phase(stage), name, verify_each=verify_each)
        codes["verified" if verify_each else "in_process", name] = code
        return len(code)

    here = Compiler(flags)

    def source_here(name: str) -> int:
        module = here.parse(Path(sources[name]).read_bytes(), name=name)
        return len(here.to_vmfb(module, from_phase="start", name=name, safe_indices=False))

    times: dict[str, dict[str, list[float]]] = {
        n: {"source": [], "bundle": [], "in_process": [], "verified": [], "source_here": []} for n in sources
    }
    sizes: dict[str, dict[str, int]] = {n: {} for n in sources}
    starts = []
    with Pool(workers=1) as pool:
        for index, name in enumerate(sources):  # everything compiled once before the clock starts
            start = time.perf_counter()
            from_bundle(pool, name)
            if index == 0:
                starts.append(time.perf_counter() - start)
            from_source(name)
            if in_process:
                compile_here(name)
                compile_here(name, verify_each=True)
                source_here(name)
        for round_ in range(repeat):
            here_sides = (("in_process", False), ("verified", True))[:: -1 if round_ % 2 else 1]  # in turn
            for name in sources:
                start = time.perf_counter()
                sizes[name]["source"] = from_source(name)
                times[name]["source"].append(time.perf_counter() - start)
                seconds, sizes[name]["bundle"] = from_bundle(pool, name)
                times[name]["bundle"].append(seconds)
                if in_process:
                    for side, verify_each in here_sides:
                        start = time.perf_counter()
                        sizes[name][side] = compile_here(name, verify_each)
                        times[name][side].append(time.perf_counter() - start)
                    start = time.perf_counter()
                    sizes[name]["source_here"] = source_here(name)
                    times[name]["source_here"].append(time.perf_counter() - start)
    first = next(iter(sources))
    warm_first = statistics.median(times[first]["bundle"])
    identical = all(len({code for (_, kernel), code in codes.items() if kernel == name}) == 1 for name in sources)
    rows = []
    for name in sources:
        row = {f"{side}_s": statistics.median(values) if values else None for side, values in times[name].items()}
        row.update(kernel=name, kind=kinds[name], import_s=imports.get(name, 0.0), sizes=sizes[name])
        row["ratio"] = row["bundle_s"] / row["source_s"]
        rows.append(row)
    return {
        "device": target.label,
        "repeat": repeat,
        "flags": flags,
        "kernels": rows,
        "median_ratio": statistics.median(r["ratio"] for r in rows),
        "iree_share": statistics.median(r["in_process_s"] / r["source_here_s"] for r in rows) if in_process else None,
        "verify_share": statistics.median(r["in_process_s"] / r["verified_s"] for r in rows) if in_process else None,
        "identical": identical,
        "worker_start_s": max(0.0, statistics.median(starts) - warm_first),
        "ok": identical and all(all(size > 0 for size in r["sizes"].values()) for r in rows),
    }


def amd_rows(arch: str, repeat: int) -> dict:
    """Per kernel: AMD code object from source, from the flow stage, from the placeholder stage."""
    start = time.perf_counter()
    target = amdgpu.target(arch)
    resolve_s = time.perf_counter() - start
    manifest = dataclasses.replace(load_manifest(MANIFEST), targets=("cpu", "amdgpu"))
    bundle = build(manifest)
    rows = []
    for spec in manifest.kernels:
        record = bundle.kernel(spec.name)
        source = import_onnx(spec.source) if spec.kind == "onnx" else spec.source.read_bytes()

        def from_source():
            c = Compiler(amdgpu.flags(target.fingerprint.arch))
            return c.to_vmfb(c.parse(source), from_phase="start")

        def from_stage(family):
            stage = record.stage(family)

            def run():
                c = Compiler()
                module = c.parse(bundle.blob(stage.blob))
                fit(module, stage, target)
                return c.to_vmfb(module, from_phase=stage.phase)

            return run

        results = {name: timed(fn, repeat) for name, fn in (
            ("source", from_source), ("flow", from_stage("any")), ("placeholder", from_stage("amdgpu"))
        )}
        for vmfb, _ in results.values():
            codeobject.check(vmfb, target.fingerprint)
        rows.append({
            "kernel": spec.name,
            **{f"{name}_s": seconds for name, (_, seconds) in results.items()},
            "code": codeobject.inspect(results["placeholder"][0]).summary(),
        })
    return {"arch": target.label, "resolve_s": resolve_s, "kernels": rows}


def timed(fn, repeat: int) -> tuple[bytes, float]:
    """The last result of `fn` and its median time."""
    results = []
    seconds = median_time(lambda: results.append(fn()), repeat)
    return results[-1], seconds


if __name__ == "__main__":
    sys.exit(main())
