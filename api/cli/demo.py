"""`portkern demo`: the whole job on the shipped examples, on this machine's CPU.

Builds the example bundle, finalises (and tunes) every kernel for this CPU,
runs each against its NumPy reference and shows what the cache now holds.
Then the same for the OpenCL C examples on this machine's OpenCL device
(skipped, with the reason, when the toolchain or the device is missing).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from portkern.cli.common import Report, add_cache_dir, add_json, store_from


def register(sub) -> None:
    demo = sub.add_parser("demo", help="build, finalise, tune and run the shipped examples on this CPU")
    demo.add_argument(
        "-o", "--output", type=Path, default=Path("portkern-demo/examples.pkb"),
        help="where to write the example bundle; the OpenCL examples go next to it as STEM-opencl.pkb and STEM-opencl-tuning.pkb",
    )
    demo.add_argument("--device", default="cpu", help="device to run on (default: cpu)")
    demo.add_argument("--tune", default="quick", help="tuning strategy for the MLIR/ONNX kernels and the OpenCL kernels with a parameter space (default: quick; 'default' skips tuning)")
    demo.add_argument("--seed", type=seed, default=0, help="seed of the random inputs (an integer from 0 to 2**63-1; default 0)")
    add_cache_dir(demo)
    add_json(demo)
    demo.set_defaults(handler=run_demo)


def seed(text: str) -> int:
    """A `--seed` value: a non-negative integer NumPy's generator accepts."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{value} is not from 0 to 2**63-1")
    return value


def opencl_output(output: Path) -> Path:
    """Where the OpenCL example bundle goes: beside `output`, named after it."""
    return output.with_name(f"{output.stem}-opencl.pkb")


def run_demo(args: argparse.Namespace) -> Report:
    import portkern
    from portkern.cli.common import console
    from portkern.examples import MANIFEST
    from portkern.portable.builder import build_file

    log = console(stderr=True)
    quiet = args.json
    args.output.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    built = build_file(MANIFEST, args.output, None if quiet else lambda s, i, n: log.print(f"build [{i + 1}/{n}] {s.name}"))
    build_s = time.perf_counter() - start
    store = store_from(args)
    bundle = portkern.load(args.output, store=store)
    rng = np.random.default_rng(args.seed)
    results = run_examples(bundle, args.device, args.tune, rng, None if quiet else log)
    opencl = run_opencl_examples(opencl_output(args.output), store, rng, None if quiet else log, args.tune)
    results += opencl.pop("results")
    digests = {bundle.digest, opencl.get("digest"), opencl.get("tuning_digest")}
    entries = [e for e in store.entries() if e.bundle_digest in digests]
    data = {
        "bundle": str(args.output),
        "digest": built.digest,
        "build_s": build_s,
        "opencl": opencl,
        "cache_dir": str(store.directory),
        "results": results,
        "cache": [{"kernel": e.kernel, "device": e.device_label, "config": e.config, "size": e.size, "hits": e.hits} for e in entries],
        "ok": all(r["ok"] for r in results),
    }

    def render(out):
        from portkern.cli.cache import entries_table

        out.print(entries_table(f"`portkern cache ls` for these bundles ({store.directory})", entries))
        verdict = "all kernels match NumPy" if data["ok"] else "SOME KERNELS DO NOT MATCH NumPy"
        skipped = f" (OpenCL examples skipped: {opencl['skipped']})" if opencl["skipped"] else ""
        out.print(f"{len(results)} kernels, {verdict}{skipped}")

    return Report(data, render, status=0 if data["ok"] else 1)


def run_opencl_examples(output: Path, store, rng: np.random.Generator, log, tune: str | None = None) -> dict:
    """Build the OpenCL C examples and run them on this machine's OpenCL device, if both are possible;
    the examples with a parameter space (a second bundle beside `output`) are tuned with `tune`."""
    import portkern
    from portkern.base.errors import DeviceError
    from portkern.examples import OPENCL_MANIFEST, OPENCL_TUNING_MANIFEST
    from portkern.jit.devices import resolve
    from portkern.portable.builder import build_file
    from portkern.portable.opencl import APT_HINT, missing_tools

    report: dict[str, Any] = {"bundle": str(output), "skipped": None, "results": []}
    missing = missing_tools("opencl")
    if missing:
        report["skipped"] = f"{', '.join(missing)} not installed ({APT_HINT})"
    else:
        try:
            target = resolve("opencl", store)
            report["skipped"] = None if target.runnable else f"{target.label}: {target.reason}"
        except DeviceError as exc:
            report["skipped"] = str(exc)
    if report["skipped"]:
        if log:
            log.print(f"[yellow]skip[/yellow] OpenCL examples: {report['skipped']}")
        return report
    start = time.perf_counter()
    built = build_file(OPENCL_MANIFEST, output, None if log is None else lambda s, i, n: log.print(f"build [{i + 1}/{n}] {s.name} (OpenCL C)"))
    report.update(digest=built.digest, build_s=time.perf_counter() - start)
    report["results"] = run_examples(portkern.load(output, store=store), "opencl", None, rng, log)
    spaces = output.with_name(f"{output.stem}-tuning.pkb")
    start = time.perf_counter()
    built = build_file(OPENCL_TUNING_MANIFEST, spaces, None if log is None else lambda s, i, n: log.print(f"build [{i + 1}/{n}] {s.name} (OpenCL C, every point of its space)"))
    report.update(tuning_bundle=str(spaces), tuning_digest=built.digest, tuning_build_s=time.perf_counter() - start)
    report["results"] += run_examples(portkern.load(spaces, store=store), "opencl", tune, rng, log)
    return report


def run_examples(bundle, device: str, tune, rng: np.random.Generator, log) -> list[dict]:
    """Finalise each kernel of an example bundle for a device, run it and compare with NumPy."""
    from portkern.examples.reference import EXAMPLES

    results = []
    for name in bundle:
        example = EXAMPLES[name]
        start = time.perf_counter()
        kernel = bundle.kernel(name, device=device, tune=tune)
        ready_s = time.perf_counter() - start
        inputs = example.inputs(rng)
        outputs = kernel(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        references = example.reference(*inputs)
        ok = all(np.allclose(o, r, rtol=example.rtol, atol=example.atol) for o, r in zip(outputs, references))
        err = max(float(np.max(np.abs(o.astype(np.float64) - r))) for o, r in zip(outputs, references))
        results.append(
            {
                "kernel": name,
                "device": kernel.device,
                "config": kernel.config,
                "origin": kernel.origin,
                "ready_s": ready_s,
                "max_abs_error": err,
                "rtol": example.rtol,
                "atol": example.atol,
                "ok": ok,
            }
        )
        tuning = kernel.tuning
        if tuning is not None and tuning.speedup:
            results[-1].update(default_s=tuning.default_s, tuned_s=tuning.best_s, speedup=tuning.speedup)
        if log is not None:
            mark = "[green]ok  [/green]" if ok else "[red]FAIL[/red]"
            gain = f" ({tuning.default_s * 1e3:.3f} -> {tuning.best_s * 1e3:.3f} ms, {tuning.speedup:.2f}x)" if tuning is not None and tuning.speedup else ""
            log.print(
                f"{mark} {name:<20} {kernel.device:<14} max|err| {err:.2e} (rtol {example.rtol:g}, atol {example.atol:g})"
                f"  {kernel.origin} in {ready_s * 1000:.1f} ms, config {kernel.config}{gain}"
            )
    return results
