"""A bundle built with another IREE release, run with the pinned one: correct?, which stage, finalise time.

    python bench/compat.py [--venv DIR] [--release 3.12.0] [--repeat N] [--json]

Builds the example bundle (four MLIR kernels and an ONNX model) with IREE
`--release` installed in a side venv (created in `--venv` when missing:
`iree-base-compiler`/`iree-base-runtime` of that release and portkern's
other dependencies, then this portkern with `pip install --no-deps`), and
the same manifest with the pinned IREE in this process. Per kernel it
loads each bundle into a fresh cache, finalises the kernel for this CPU
(the worker pool already started), compares the results with the NumPy
references, and prints the stage used and the finalise times side by side
(best of `--repeat`). It also prints bundle sizes with and without the
source stage. Exits 1 when a kernel is wrong or not compiled from its
source stage.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.examples import MANIFEST
from portkern.examples.reference import EXAMPLES
from portkern.portable.builder import build_file
from portkern.portable.bundle import read_bundle
from portkern.portable.producer import installed_compiler

REPO = Path(__file__).resolve().parent.parent
DEPENDENCIES = ["onnx", "msgpack", "diskcache", "pyyaml", "numpy", "jsonschema", "rich", "platformdirs", "filelock"]


def side_venv(where: Path, release: str) -> Path:
    """The side venv's python with IREE `release` and this portkern (made when missing)."""
    python = where / "bin" / "python"
    marker = where / f"portkern-{release}.ok"
    if not marker.exists():
        print(f"making {where} (IREE {release}; about a minute) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, f"iree-base-compiler=={release}", f"iree-base-runtime=={release}", *DEPENDENCIES], check=True)
        marker.touch()
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(REPO)], check=True)
    return python


def finalise(path: Path, name: str, cache: Path) -> tuple[float, object]:
    """Seconds to get `name` ready from a fresh cache, and the kernel."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bundle = portkern.load(path, store=Store(CacheConfig(cache, 1 << 30, False)))
    start = time.perf_counter()
    kernel = bundle.kernel(name)
    return time.perf_counter() - start, kernel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "portkern-bench" / "iree-side")
    parser.add_argument("--release", default="3.12.0")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    old_python = side_venv(args.venv, args.release)
    rows, problems = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        old, same = tmp / "old.pkb", tmp / "same.pkb"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        subprocess.run([str(old_python), "-m", "portkern", "build", str(MANIFEST), "-o", str(old), "--json"],
                       check=True, stdout=subprocess.DEVNULL, env=env, cwd=tmp)
        build_file(MANIFEST, same)
        build_file(MANIFEST, tmp / "same-nosource.pkb", source=False)
        built_with = read_bundle(old).kernels[0].stages[0].producer.version
        finalise(same, "gemm_bias_relu", tmp / "warm")  # start the worker pool
        rng = np.random.default_rng(0)
        for name in portkern.load(same).names():
            times = {"same": [], "other": []}
            for round_ in range(args.repeat):
                for label, path in (("same", same), ("other", old)):
                    seconds, kernel = finalise(path, name, tmp / f"cache-{label}-{name}-{round_}")
                    times[label].append(seconds)
                    if label == "other":
                        other = kernel
            example = EXAMPLES[name]
            inputs = example.inputs(rng)
            try:
                for got, want in zip(_tuple(other(*inputs)), example.reference(*inputs)):
                    np.testing.assert_allclose(got, want, rtol=example.rtol, atol=example.atol)
                correct = True
            except AssertionError:
                correct = False
            row = {"kernel": name, "correct": correct, "stage": other.stage, "finalise_same_s": min(times["same"]),
                   "finalise_other_s": min(times["other"])}
            row["ratio"] = row["finalise_other_s"] / row["finalise_same_s"]
            rows.append(row)
            if not correct or not other.stage.startswith("source"):
                problems.append(f"{name}: correct={correct}, stage {other.stage}")
        sizes = {p.name: p.stat().st_size for p in (same, tmp / "same-nosource.pkb")}
        kernels_only = tmp / "kernels.yaml"
        mlir = [k.name for k in read_bundle(same).kernels if k.kind == "mlir"]
        kernels_only.write_text("bundle: kernels\nkernels:\n" + "".join(f"  - name: {k}\n    source: {MANIFEST.parent / (k + '.mlir')}\n" for k in mlir))
        build_file(kernels_only, tmp / "k.pkb")
        build_file(kernels_only, tmp / "k-nosource.pkb", source=False)
        sizes.update({p.name: p.stat().st_size for p in (tmp / "k.pkb", tmp / "k-nosource.pkb")})
    result = {"built_with": built_with, "runs_with": installed_compiler().version, "kernels": rows, "sizes": sizes, "problems": problems}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"bundle built with IREE {built_with}, run with IREE {installed_compiler().version} (best of {args.repeat})")
        print(f"{'kernel':<20} {'correct':<8} {'stage':<34} {'same-release s':>14} {'other-release s':>15} {'ratio':>6}")
        for r in rows:
            print(f"{r['kernel']:<20} {str(r['correct']):<8} {r['stage']:<34} {r['finalise_same_s']:>14.3f} {r['finalise_other_s']:>15.3f} {r['ratio']:>6.2f}")
        print(f"example bundle: {sizes['same.pkb']} B with source, {sizes['same-nosource.pkb']} B without "
              f"({sizes['same.pkb'] / sizes['same-nosource.pkb']:.2f}x)")
        print(f"MLIR kernel bundle: {sizes['k.pkb']} B with source, {sizes['k-nosource.pkb']} B without "
              f"({sizes['k.pkb'] / sizes['k-nosource.pkb']:.2f}x)")
        for p in problems:
            print(f"PROBLEM: {p}")
    return 1 if problems else 0


def _tuple(results) -> tuple:
    return results if isinstance(results, tuple) else (results,)


if __name__ == "__main__":
    sys.exit(main())
