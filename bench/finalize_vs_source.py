"""Finalising from the bundle vs compiling from source, per example kernel, in one run.

    python bench/finalize_vs_source.py [--repeat 3] [--amd-arch gfx942] [--json]

(a) source: the kernel's source (for ONNX, the MLIR the importer made from it;
    the import itself is shown apart) compiled to native code for this CPU;
(b) bundle: the bundle's portable stage parsed and finalised for this CPU.
Both run in this process with fresh compiler sessions and the same target
flags; each figure is the median of --repeat runs. The ratio is b/a.

Then the same for an AMD GPU arch (compile only, no GPU needed), three ways:
source -> code object; the device-independent (flow) stage with the real
target attached -> code object; the amdgpu placeholder stage with the real
target swapped in -> code object. Resolving the arch's target attribute (once
per arch and compiler, memoised on devices) is shown apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from portkern.examples import MANIFEST
from portkern.jit import amdgpu, codeobject, cpu
from portkern.jit.gpu import fit
from portkern.portable.builder import build, build_file
from portkern.portable.compiler import Compiler
from portkern.portable.lower import import_onnx
from portkern.portable.manifest import load_manifest


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--amd-arch", default="gfx942", help="AMD arch for the GPU comparison ('' to skip it)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    amd = amd_rows(args.amd_arch, args.repeat) if args.amd_arch else None

    host = cpu.host()
    flags = cpu.flags(host)
    with tempfile.TemporaryDirectory() as tmp:
        bundle = build_file(MANIFEST, Path(tmp) / "examples.pkb")
    rows = []
    for spec in load_manifest(MANIFEST).kernels:
        record = bundle.kernel(spec.name)
        stage = record.stage()
        import_s = 0.0
        if spec.kind == "onnx":
            start = time.perf_counter()
            source = import_onnx(spec.source)
            import_s = time.perf_counter() - start
        else:
            source = spec.source.read_bytes()

        def from_source():
            c = Compiler(flags)
            c.to_vmfb(c.parse(source), from_phase="start")

        def from_bundle():
            c = Compiler(flags)
            c.to_vmfb(c.parse(bundle.blob(stage.blob)), from_phase=stage.phase)

        source_s = median_time(from_source, args.repeat)
        bundle_s = median_time(from_bundle, args.repeat)
        rows.append(
            {"kernel": spec.name, "kind": spec.kind, "import_s": import_s, "source_s": source_s, "bundle_s": bundle_s, "ratio": bundle_s / source_s}
        )
    median_ratio = statistics.median(r["ratio"] for r in rows)
    if args.json:
        json.dump({"device": host.label, "repeat": args.repeat, "kernels": rows, "median_ratio": median_ratio, "amdgpu": amd}, sys.stdout, indent=2)
        print()
        return 0
    print(f"finalise from bundle vs compile from source, {host.label}, median of {args.repeat}")
    print(f"{'kernel':<20} {'source→native':>14} {'bundle→native':>14} {'ratio b/a':>10}  note")
    for r in rows:
        note = f"+ ONNX import {r['import_s']:.2f} s not counted in source" if r["kind"] == "onnx" else ""
        print(f"{r['kernel']:<20} {r['source_s']:>12.3f} s {r['bundle_s']:>12.3f} s {r['ratio']:>10.2f}  {note}")
    print(f"median ratio {median_ratio:.2f}")
    if amd:
        print()
        print(f"AMD {amd['arch']} finalisation, compile only, median of {args.repeat} "
              f"(target attribute resolved once in {amd['resolve_s'] * 1000:.0f} ms, not counted)")
        print(f"{'kernel':<20} {'source':>9} {'flow stage':>11} {'placeholder':>12} {'flow/src':>9} {'ph/src':>7}  code")
        for r in amd["kernels"]:
            print(
                f"{r['kernel']:<20} {r['source_s']:>7.3f} s {r['flow_s']:>9.3f} s {r['placeholder_s']:>10.3f} s "
                f"{r['flow_s'] / r['source_s']:>9.2f} {r['placeholder_s'] / r['source_s']:>7.2f}  {r['code']}"
            )
    return 0


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
