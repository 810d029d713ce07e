"""OpenCL kernels with a parameter space, on this machine's OpenCL device (PoCL here), in one run.

    python bench/opencl_tuning.py [--strategy full] [--size 512] [--json]

For each example kernel of `examples/manifest_opencl_tuning.yaml` (a tiled
matmul and a tiled transpose), with the shapes it is tuned at set from --size
(matmul: M = N = K = size; transpose: 2 size x 2 size):

- build: points of the space built into the bundle, distinct SPIR-V modules
  stored and the bytes of all stages, the build's wall time, and its warnings
  (points left out because they did not build, points built at -O0);
- tune: `bundle.kernel(name, device="opencl", tune=STRATEGY)` on an empty
  cache: candidates evaluated, failed and wrong, the default point's and the
  tuned point's call time (best of interleaved rounds, side by side in one
  process, with the device buffers made once), the speedup, and whether the
  default's and the tuned kernel's outputs match NumPy (float64 reference);
- -O0: for the default and the tuned point, the same point built from -O0
  SPIR-V instead of -O2 (the build's fallback when llvm-spirv-15 mistranslates
  optimised code), timed interleaved against the -O2 build: what the fallback
  costs at run time where both are valid.

No NumPy timings: NumPy only checks results.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import yaml

ROUNDS = 15


def _manifest(size: int, where: Path) -> Path:
    """The example manifest with sources made absolute and the tuning shapes set from `size`."""
    from portkern.examples import OPENCL_TUNING_MANIFEST

    data = yaml.safe_load(OPENCL_TUNING_MANIFEST.read_text())
    for kernel in data["kernels"]:
        kernel["source"] = str(OPENCL_TUNING_MANIFEST.parent / kernel["source"])
        at = kernel["tune"]["at"]
        kernel["tune"]["at"] = {k: size if "K" in at else 2 * size for k in at}
    path = where / "manifest.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _build(manifest: Path, output: Path, opt: str | None = None) -> tuple[float, list[str]]:
    """Build time and BuildWarnings; `opt` forces every kernel to be compiled at that level."""
    from portkern.portable import opencl
    from portkern.portable.builder import build_file

    original = opencl._compile
    if opt is not None:
        opencl._compile = functools.partial(original, opt=opt)  # the bench's only way to force -O0
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = time.perf_counter()
            build_file(manifest, output)
            seconds = time.perf_counter() - start
    finally:
        opencl._compile = original
    return seconds, [str(w.message) for w in caught]


def _spirv_by_point(record) -> dict[str, str]:
    """Each point's config and the digest of its SPIR-V."""
    from portkern.portable.launch import launch_of

    return {v.config: next(record.stages[i].blob for i in v.stages if record.stages[i].format == "spirv") for v in launch_of(record).variants}


def _reference(name: str, inputs: list[np.ndarray]) -> np.ndarray:
    if name.startswith("matmul"):
        return inputs[0].astype(np.float64) @ inputs[1].astype(np.float64)
    return inputs[0].T.astype(np.float64)


def _correct(out: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.allclose(out, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max())))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="full")
    parser.add_argument("--size", type=int, default=512, help="matmul M=N=K, transpose 2x this (a multiple of 64)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import portkern
    from portkern.cache.config import CacheConfig
    from portkern.cache.store import Store
    from portkern.jit import opencl
    from portkern.jit.opencl_native import Executable
    from portkern.portable.launch import launch_of
    from portkern.tuner.opencl_family import OpenclBench

    reason = opencl.unavailable()
    if reason:
        print(f"skipped: {reason}")
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-opencl-tuning-") as tmp:
        work = Path(tmp)
        manifest = _manifest(args.size, work)
        build_s, warned = _build(manifest, work / "spaces.pkb")
        _, _ = _build(manifest, work / "spaces-O0.pkb", opt="-O0")
        store = Store(CacheConfig(work / "cache", 4 << 30, False))
        bundle = portkern.load(work / "spaces.pkb", store=store)
        plain = portkern.load(work / "spaces-O0.pkb", store=store)
        for record in bundle.bundle.kernels:
            name = record.name
            launch = launch_of(record)
            spirv = {s.blob for s in record.stages if s.format == "spirv"}
            size = sum(s.size for s in record.stages)
            default = bundle.kernel(name, device="opencl")
            start = time.perf_counter()
            tuned = bundle.kernel(name, device="opencl", tune=args.strategy)
            tune_s = time.perf_counter() - start
            result = tuned.tuning
            evaluations = result.evaluations
            rng = np.random.default_rng(0)
            inputs = [rng.uniform(-1, 1, shape).astype(np.float32) for shape in launch.tuning_shapes()]
            want = _reference(name, inputs)
            row = {
                "kernel": name, "device": tuned.device, "strategy": args.strategy,
                "points": len(launch.variants), "spirv_modules": len(spirv), "stage_bytes": size,
                "build_warnings": [w for w in warned if name in w or name.split("_")[0] in w],
                "tuning_shapes": [list(s) for s in launch.tuning_shapes()],
                "config": tuned.config, "evaluated": len(evaluations),
                "failed": sum(e.status not in ("ok", "wrong", "duplicate") for e in evaluations),
                "wrong": sum(e.status == "wrong" for e in evaluations),
                "default_s": result.default_s, "tuned_s": result.best_s, "speedup": result.speedup, "tune_wall_s": tune_s,
                "default_correct": _correct(default(*inputs), want), "tuned_correct": _correct(tuned(*inputs), want),
            }
            # -O0 vs -O2 builds of the same point, side by side, where the -O2 build is valid: a point whose
            # SPIR-V is the same in both bundles was built at -O0 already (the build's fallback)
            stage_of, o0_stage = _spirv_by_point(record), _spirv_by_point(plain.record(name))
            optimised_points = [c for c in stage_of if stage_of[c] != o0_stage[c]]
            row["built_at_O0"] = len(stage_of) - len(optimised_points)
            default_config = launch.variants[0].config
            wanted = [c for c in (default_config, tuned.config) if c in optimised_points]
            wanted += [c for c in optimised_points if c not in wanted][: max(0, 2 - len(wanted))]
            bench = OpenclBench(record, tuned.target, inputs)
            o0 = []
            for config in wanted:
                config = "default" if config == default_config else config
                try:
                    built = plain.native(plain.record(name), tuned.target, config)
                    optimised = bundle.native(record, tuned.target, config)
                except portkern.base.errors.PortkernError as exc:
                    o0.append({"config": config, "error": str(exc)[:200]})
                    continue
                pair = [Executable(n.data, record, tuned.target, config) for n in (optimised, built)]
                o2_t, o0_t = bench.interleaved(pair, rounds=ROUNDS)
                o0.append({"config": config, "O2_s": o2_t.min_s, "O0_s": o0_t.min_s, "O0_cost": o0_t.min_s / o2_t.min_s})
            row["O0"] = o0
            rows.append(row)
    data = {"size": args.size, "strategy": args.strategy, "build_s": build_s, "bundle_warnings": len(warned), "kernels": rows}
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        print()
        return 0
    print(f"OpenCL parameter spaces on {rows[0]['device']}: build {build_s:.1f} s for both kernels; tuning strategy {args.strategy}")
    print(f"{'kernel':<16} {'points':>6} {'at O0':>5} {'SPIR-V':>6} {'stages':>9} {'evaluated':>9} {'failed':>6} {'wrong':>5} "
          f"{'default':>10} {'tuned':>10} {'speedup':>7} {'tune wall':>9}  correct  config")
    for r in rows:
        ok = "yes" if r["default_correct"] and r["tuned_correct"] else "NO"
        print(
            f"{r['kernel']:<16} {r['points']:>6} {r['built_at_O0']:>5} {r['spirv_modules']:>6} {r['stage_bytes'] / 1024:>5.0f} KiB {r['evaluated']:>9} "
            f"{r['failed']:>6} {r['wrong']:>5} {r['default_s'] * 1e3:>7.2f} ms {r['tuned_s'] * 1e3:>7.2f} ms "
            f"{r['speedup']:>6.2f}x {r['tune_wall_s']:>7.1f} s  {ok:<7}  {r['config']}"
        )
    for r in rows:
        for w in r["build_warnings"]:
            print(f"  build warning: {w[:300]}")
    print("run-time cost of -O0 SPIR-V (the build's fallback) against -O2, same point, interleaved, on points whose -O2 build is valid:")
    for r in rows:
        for item in r["O0"]:
            if "error" in item:
                print(f"  {r['kernel']:<16} {item['config']}: {item['error']}")
            else:
                print(f"  {r['kernel']:<16} {item['O2_s'] * 1e3:7.2f} ms -O2, {item['O0_s'] * 1e3:7.2f} ms -O0 ({item['O0_cost']:.2f}x)  {item['config']}")
    return 0 if all(r["default_correct"] and r["tuned_correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
