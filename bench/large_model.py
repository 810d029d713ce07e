"""Large models: weights as parameters, mapped from the bundle, across model sizes, in one run.

    python bench/large_model.py [--sizes 75M,1G,5G] [--workdir DIR] [--keep] [--json]    (default sizes: 75M,1G)

Per size, an MLP-style ONNX model is generated (`portkern.examples.large_mlp`; 5G and up
with its weights in an ONNX external data file, smaller ones inline) and then, each step
in a fresh child process:
    build: `portkern build` (peak memory of the build and its importer child, from getrusage);
    cold:  empty cache; load + kernel() (copies the bundle into the cache, checking its
           parameter chunks; finalises) + first call;
           COLD_RUNS rounds over all sizes, the fastest finalisation of each size kept
           (finalisation is the worker's compile, from job sent to native code back; the
           copy and chunk check are timed apart, before it);
    warm:  the cache filled by cold; load + kernel() + first call (nothing hashed, nothing
           compiled), with the bundle file and portkern's copy of it in the OS page cache
           (read through just before);
    numpy: the same forward pass in NumPy over the same weights, mapped from the bundle file
           (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset): what one pass over the weights costs;
    disk:  warm again, after the pages of the bundle file and its copy were dropped from the page cache
           (posix_fadvise DONTNEED): the weights come from the disk during the first call.
It prints the bundle size against the weights, the cache entry against the weights, cold
finalisation time, the chunk check, the warm first results, build peak memory against the
largest tensor, and the largest difference from NumPy (computed layer by layer here).
Needs disk for the model, its bundle and portkern's copy of it (about 3x the weights) under --workdir.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from children import environment
from children import python_report as child

from portkern.cache.layout import PARAMETERS
from portkern.examples.large_mlp import reference, weight_bytes, write_mlp

BATCH = 8
SEED = 0
#: Layer widths per size label: weights of about 75 MB, 1 GB and 5 GB in five square layers each
#: (the same depth and dispatches at every size, so cold finalisation compiles the same code;
#: largest tensors 14, 196 and 1024 MiB). "1M" is the small model whose build sets the baseline.
SIZES = {
    "1M": (256, 512, 256, 256),
    "75M": (1920,) * 6,
    "1G": (7168,) * 6,
    "5G": (16384,) * 6,
}
#: Cold runs per size (each from an empty cache, in a fresh process): cold figures are the run
#: that finalised fastest (a compile of about half a second varies by 10-20% run to run).
COLD_RUNS = 3
#: Sizes at or above this many weight bytes are written with ONNX external data.
EXTERNAL_FROM = 2 << 30

CHILD_RUN = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    import portkern
    from portkern.cache.layout import PARAMETERS
    from portkern.cache.store import default_store
    from portkern.jit.runtime import runtime_config
    import portkern.jit.loader
    runtime_config("local-task")
    store = default_store()
    path, batch, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if sys.argv[5] == "evict":  # the bundle and portkern's copy of it, which the kernel maps
        for name in [path, *(store.directory / PARAMETERS).glob("*.pkb")]:
            fd = os.open(name, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    x = np.random.default_rng(1).standard_normal((batch, width), dtype=np.float32)
    start = time.perf_counter()
    loaded = portkern.load(path)
    opened = time.perf_counter()
    record = loaded.record("mlp")
    loaded.parameters_for(record)
    checked = time.perf_counter()
    kernel = loaded.kernel("mlp")
    ready = time.perf_counter()
    y = kernel(x)
    done = time.perf_counter()
    kernel(x)
    again = time.perf_counter() - done
    np.save(sys.argv[4], y)
    entries = [e.size for e in store.entries()]
    print(json.dumps({"open_s": opened - start, "check_s": checked - opened, "kernel_s": ready - checked, "call_s": done - ready,
                      "first_result_s": done - start, "ready_s": ready - start, "next_call_s": again, "origin": kernel.origin, "finalize_s": kernel.native.finalize_s,
                      "entry_bytes": max(entries) if entries else 0}))
    """
)

CHILD_NUMPY = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from portkern.portable.bundle import read_bundle
    path, widths = sys.argv[1], json.loads(sys.argv[2])
    bundle = read_bundle(path)
    section, by_name = bundle.parameters, {p.name: p for p in bundle.kernel("mlp").parameters}
    mapped = np.memmap(path, dtype=np.uint8, mode="r")

    def weight(name, shape):
        p = by_name[name]
        return mapped[section.offset + p.offset : section.offset + p.offset + p.size].view(np.float32).reshape(shape)

    x = np.random.default_rng(1).standard_normal((8, widths[0]), dtype=np.float32)

    def forward():  # the bundle holds each W transposed (portable.onnx_layout): (out, in)
        h = x
        for i in range(len(widths) - 1):
            h = h @ weight(f"W{i}", (widths[i + 1], widths[i])).T + weight(f"b{i}", (widths[i + 1],))
            if i < len(widths) - 2:
                h = np.maximum(h, 0)
        return h

    start = time.perf_counter()
    forward()
    first = time.perf_counter()
    forward()
    print(json.dumps({"first_s": first - start, "next_s": time.perf_counter() - first}))
    """
)

CHILD_BUILD = textwrap.dedent(
    """
    import json, resource, subprocess, sys, time
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "portkern", "build", sys.argv[1], "-o", sys.argv[2]], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode:
        sys.exit(done.stderr)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"build_s": elapsed, "peak_bytes": peak_kib * 1024}))
    """
)


def fixed_build_memory(workdir: Path) -> int:
    """Peak memory of building a model of 1.3 MiB: what a build costs whatever the weights
    (Python, the IREE compiler's libraries, the ONNX importer)."""
    where = workdir / "fixed"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    write_mlp(where / "m.onnx", SIZES["1M"], BATCH, SEED)
    (where / "manifest.yaml").write_text("bundle: fixed\nkernels:\n  - name: mlp\n    source: m.onnx\n")
    peak = child(CHILD_BUILD, str(where / "manifest.yaml"), str(where / "m.pkb"))["peak_bytes"]
    shutil.rmtree(where, ignore_errors=True)
    return peak


@dataclass
class Size:
    """One model size: built, then run cold (in rounds, beside the other sizes), then warm."""

    label: str
    widths: tuple[int, ...]
    where: Path
    weights: int
    external: bool
    largest: int
    generate_s: float
    build: dict
    env: dict
    colds: list = field(default_factory=list)

    @property
    def args(self) -> tuple[str, ...]:
        return (str(self.where / "m.pkb"), str(BATCH), str(self.widths[0]))


def prepare(label: str, workdir: Path, keep: bool) -> Size:
    """The size's model generated and built (the model removed unless `keep`)."""
    widths = SIZES[label]
    where = workdir / label
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    weights = weight_bytes(widths)
    external = weights >= EXTERNAL_FROM
    largest = max(widths[i] * widths[i + 1] * 4 for i in range(len(widths) - 1))
    started = time.perf_counter()
    write_mlp(where / "m.onnx", widths, BATCH, SEED, external)
    generate_s = time.perf_counter() - started
    (where / "manifest.yaml").write_text("bundle: large\nkernels:\n  - name: mlp\n    source: m.onnx\n")
    build = child(CHILD_BUILD, str(where / "manifest.yaml"), str(where / "m.pkb"))
    if not keep:
        for name in ("m.onnx", "m.onnx.data"):
            (where / name).unlink(missing_ok=True)
    env = environment(where / "cache")
    return Size(label, widths, where, weights, external, largest, generate_s, build, env)


def run_cold(size: Size) -> None:
    """One cold run, from an empty cache (the last one's entry serves the warm runs)."""
    shutil.rmtree(size.where / "cache", ignore_errors=True)
    size.colds.append(child(CHILD_RUN, *size.args, str(size.where / "cold.npy"), "keep", env=size.env))


def read_through(path: Path) -> None:
    """Read a file once, so that its pages are in the OS page cache."""
    with open(path, "rb", buffering=0) as f:
        while f.read(64 << 20):
            pass


def finish(size: Size, fixed: int, keep: bool) -> dict:
    """The warm, NumPy and page-cache-dropped runs, and the size's figures."""
    where, widths, env = size.where, size.widths, size.env
    cold = min(size.colds, key=lambda run: run["finalize_s"])
    for name in [where / "m.pkb", *(where / "cache").glob(f"*/{PARAMETERS}/*.pkb")]:  # the bundle and the copy mapped
        read_through(name)
    warm = child(CHILD_RUN, *size.args, str(where / "warm.npy"), "keep", env=env)
    numpy_pass = child(CHILD_NUMPY, str(where / "m.pkb"), json.dumps(widths), env=env)
    disk = child(CHILD_RUN, *size.args, str(where / "disk.npy"), "evict", env=env)
    x = np.random.default_rng(1).standard_normal((BATCH, widths[0]), dtype=np.float32)
    expected = reference(x, widths, SEED)
    error = max(float(np.max(np.abs(np.load(where / f"{run}.npy") - expected) / (1 + np.abs(expected)))) for run in ("cold", "warm", "disk"))
    bundle_bytes = (where / "m.pkb").stat().st_size
    build, weights, largest = size.build, size.weights, size.largest
    result = {
        "size": size.label,
        "widths": list(widths),
        "weights_bytes": weights,
        "external_data": size.external,
        "largest_tensor_bytes": largest,
        "generate_s": size.generate_s,
        "build_s": build["build_s"],
        "build_peak_bytes": build["peak_bytes"],
        "build_peak_over_largest": build["peak_bytes"] / largest,
        "build_fixed_bytes": fixed,
        "build_extra_over_largest": max(0, build["peak_bytes"] - fixed) / largest,
        "bundle_bytes": bundle_bytes,
        "bundle_over_weights": bundle_bytes / weights,
        "cache_entry_bytes": cold["entry_bytes"],
        "entry_over_weights": cold["entry_bytes"] / weights,
        "cold_finalize_s": cold["finalize_s"],
        "cold_finalize_runs_s": [run["finalize_s"] for run in size.colds],
        "cold_check_s": cold["check_s"],
        "cold_first_result_s": cold["first_result_s"],
        "warm_origin": warm["origin"],
        "warm_check_s": warm["check_s"],
        "warm_first_result_s": warm["first_result_s"],
        "warm_ready_s": warm["ready_s"],
        "warm_next_call_s": warm["next_call_s"],
        "numpy_pass_s": numpy_pass["first_s"],
        "numpy_next_pass_s": numpy_pass["next_s"],
        "disk_ready_s": disk["ready_s"],
        "disk_first_result_s": disk["first_result_s"],
        "disk_next_call_s": disk["next_call_s"],
        "max_rel_error": error,
    }
    if not keep:
        shutil.rmtree(where, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="75M,1G", help=f"comma-separated, of {', '.join(SIZES)} (5G: about 11 GB of disk)")
    parser.add_argument("--workdir", type=Path, default=None, help="where models, bundles and caches go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep models, bundles and caches")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="portkern-large-"))
    started = time.perf_counter()
    results = []
    try:
        fixed = fixed_build_memory(workdir)
        sizes = [prepare(label.strip(), workdir, args.keep) for label in args.sizes.split(",")]
        for _ in range(COLD_RUNS):  # in rounds: a change in the machine's load touches every size alike
            for size in sizes:
                run_cold(size)
        for size in sizes:
            results.append(finish(size, fixed, args.keep))
            if not args.json:
                print_row(results[-1])
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    finals = [r["cold_finalize_s"] for r in results]
    summary = {"results": results, "finalize_spread": max(finals) / min(finals) - 1 if finals else 0.0, "elapsed_s": time.perf_counter() - started}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"cold finalisation spread across sizes: {summary['finalize_spread']:.0%} (the bench took {summary['elapsed_s']:.0f} s)")


def print_row(r: dict) -> None:
    mb = 1 << 20
    print(
        f"{r['size']:>4}: weights {r['weights_bytes'] / mb:8.1f} MiB{' (external data)' if r['external_data'] else ''}; "
        f"bundle/weights {r['bundle_over_weights']:.4f}; cache entry {r['cache_entry_bytes'] / 1024:.1f} KiB "
        f"({r['entry_over_weights']:.5%} of weights); build {r['build_s']:.1f} s, peak {r['build_peak_bytes'] / mb:.0f} MiB "
        f"= {r['build_peak_over_largest']:.2f}x largest tensor (above the {r['build_fixed_bytes'] / mb:.0f} MiB of a 1 MiB model's "
        f"build: {r['build_extra_over_largest']:.2f}x); cold: finalise {r['cold_finalize_s']:.2f} s "
        f"(best of {', '.join(f'{v:.2f}' for v in r['cold_finalize_runs_s'])}), "
        f"copy and chunk check {r['cold_check_s']:.2f} s, first result {r['cold_first_result_s']:.2f} s; warm ({r['warm_origin']}): "
        f"check {r['warm_check_s'] * 1000:.1f} ms, callable after {r['warm_ready_s']:.3f} s, first result {r['warm_first_result_s']:.3f} s "
        f"(a second call: {r['warm_next_call_s']:.3f} s; NumPy's pass over the same mapped weights: {r['numpy_pass_s']:.3f} s, "
        f"then {r['numpy_next_pass_s']:.3f} s); page cache dropped: callable after {r['disk_ready_s']:.3f} s, first result "
        f"{r['disk_first_result_s']:.3f} s (a second call: {r['disk_next_call_s']:.3f} s); max rel. error vs NumPy {r['max_rel_error']:.1e}"
    )


if __name__ == "__main__":
    main()
