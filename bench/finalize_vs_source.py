"""Finalising from the bundle vs compiling from source, per example kernel, in one run.

    python bench/finalize_vs_source.py [--repeat 3] [--json]

(a) source: the kernel's source (for ONNX, the MLIR the importer made from it;
    the import itself is shown apart) compiled to native code for this CPU;
(b) bundle: the bundle's portable stage parsed and finalised for this CPU.
Both run in this process with fresh compiler sessions and the same target
flags; each figure is the median of --repeat runs. The ratio is b/a.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from portkern.examples import MANIFEST
from portkern.jit import cpu
from portkern.portable.builder import build_file
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
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

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
        json.dump({"device": host.label, "repeat": args.repeat, "kernels": rows, "median_ratio": median_ratio}, sys.stdout, indent=2)
        print()
        return 0
    print(f"finalise from bundle vs compile from source, {host.label}, median of {args.repeat}")
    print(f"{'kernel':<20} {'source→native':>14} {'bundle→native':>14} {'ratio b/a':>10}  note")
    for r in rows:
        note = f"+ ONNX import {r['import_s']:.2f} s not counted in source" if r["kind"] == "onnx" else ""
        print(f"{r['kernel']:<20} {r['source_s']:>12.3f} s {r['bundle_s']:>12.3f} s {r['ratio']:>10.2f}  {note}")
    print(f"median ratio {median_ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
