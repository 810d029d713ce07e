"""A bundle built with another IREE release, run with the pinned one: correct?, which stage, finalise time.

    python bench/compat.py [--venv DIR] [--release 3.12.0] [--repeat N] [--json]

Builds the example bundle (its MLIR kernels and ONNX model, whose weights are
parameters) with IREE `--release` installed in a side venv (made in `--venv`
from PyPI when missing: `iree-base-compiler`/`iree-base-runtime` of that
release and portkern's other dependencies from pyproject.toml, then this
portkern with `pip install --no-deps`; it prints how long that took), and the
same manifest with the pinned IREE in this process. Per kernel it loads each
bundle into a fresh cache, finalises the kernel for this CPU (the worker pool
already started), compares the results with the NumPy references, and prints
the stage used and the finalise times side by side (best of `--repeat`). It
also prints bundle sizes with and without source stages (the example bundle,
its MLIR kernels alone, its ONNX model alone beside its parameters' bytes).
Exits 1 when a kernel is wrong or not compiled from its source stage.
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
import tomllib

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.examples import MANIFEST
from portkern.examples.reference import EXAMPLES
from portkern.portable.builder import build_file
from portkern.portable.bundle import read_bundle
from portkern.portable.manifest import load_manifest
from portkern.portable.producer import installed_compiler

REPO = Path(__file__).resolve().parent.parent


def dependencies() -> list[str]:
    """portkern's dependencies and its ONNX extra (pyproject.toml), IREE's packages left out."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [d for d in (*project["dependencies"], *project["optional-dependencies"]["onnx"]) if not d.startswith("iree-")]


def side_venv(where: Path, release: str) -> Path:
    """The side venv's python with IREE `release` and this portkern (`pip install --no-deps`),
    made (from PyPI) when missing."""
    python = where / "bin" / "python"
    started = time.perf_counter()
    if not python.exists():
        print(f"making {where} with IREE {release} from PyPI ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, f"iree-base-compiler=={release}", f"iree-base-runtime=={release}", *dependencies()], check=True)
    subprocess.run([*pip, "--no-deps", "--force-reinstall", str(REPO)], check=True)
    print(f"side venv {where} ready in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return python


def sizes(tmp: Path, built: Path) -> dict[str, dict[str, int]]:
    """Bundle bytes with and without source stages: the example bundle, its MLIR kernels alone and
    its ONNX model alone (and the ONNX model's parameters: its weights, stored once)."""
    found = {}
    records = read_bundle(built).kernels
    groups = {"examples": records, "mlir kernels": [r for r in records if r.kind == "mlir"], "onnx model": [r for r in records if r.kind == "onnx"]}
    for label, group in groups.items():
        manifest = tmp / f"{label.replace(' ', '-')}.yaml"
        kernels = [k for k in load_manifest(MANIFEST).kernels if k.name in {r.name for r in group}]
        manifest.write_text("bundle: sizes\nkernels:\n" + "".join(f"  - name: {k.name}\n    source: {k.source}\n" for k in kernels))
        build_file(manifest, tmp / "with.pkb")
        build_file(manifest, tmp / "without.pkb", source=False)
        with_source = read_bundle(tmp / "with.pkb")
        found[label] = {
            "with_source": (tmp / "with.pkb").stat().st_size,
            "without_source": (tmp / "without.pkb").stat().st_size,
            "source_stages": sum(s.size for r in with_source.kernels for s in r.stages if s.is_source),
            "parameters": sum(p.size for r in with_source.kernels for p in r.parameters),
        }
    return found


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
        size = sizes(tmp, same)
    result = {"built_with": built_with, "runs_with": installed_compiler().version, "kernels": rows, "sizes": size, "problems": problems}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"bundle built with IREE {built_with}, run with IREE {installed_compiler().version} (best of {args.repeat})")
        print(f"{'kernel':<20} {'correct':<8} {'stage':<44} {'same-release s':>14} {'other-release s':>15} {'ratio':>6}")
        for r in rows:
            print(f"{r['kernel']:<20} {str(r['correct']):<8} {r['stage']:<44} {r['finalise_same_s']:>14.3f} {r['finalise_other_s']:>15.3f} {r['ratio']:>6.2f}")
        for label, n in size.items():
            print(f"{label}: {n['with_source']:,} B with source stages, {n['without_source']:,} B without "
                  f"({n['with_source'] / n['without_source']:.2f}x); source stages {n['source_stages']:,} B, parameters {n['parameters']:,} B")
        for p in problems:
            print(f"PROBLEM: {p}")
    return 1 if problems else 0


def _tuple(results) -> tuple:
    return results if isinstance(results, tuple) else (results,)


if __name__ == "__main__":
    sys.exit(main())
