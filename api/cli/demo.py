"""`portkern demo`: the whole job on the shipped examples, on this machine's CPU.

Builds the example bundle, finalises (and tunes) every kernel for this CPU,
runs each against its NumPy reference and shows what the cache now holds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from portkern.cli.common import Report, add_cache_dir, add_json, store_from


def register(sub) -> None:
    demo = sub.add_parser("demo", help="build, finalise, tune and run the shipped examples on this CPU")
    demo.add_argument("-o", "--output", type=Path, default=Path("portkern-demo/examples.pkb"), help="where to write the example bundle")
    demo.add_argument("--device", default="cpu", help="device to run on (default: cpu)")
    demo.add_argument("--tune", default=None, help="tuning strategy (default: none)")
    demo.add_argument("--seed", type=int, default=0)
    add_cache_dir(demo)
    add_json(demo)
    demo.set_defaults(handler=run_demo)


def run_demo(args: argparse.Namespace) -> Report:
    import portkern
    from portkern.cli.common import console
    from portkern.examples import MANIFEST
    from portkern.examples.reference import EXAMPLES
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
    results = []
    for name in bundle:
        example = EXAMPLES[name]
        start = time.perf_counter()
        kernel = bundle.kernel(name, device=args.device, tune=args.tune)
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
        if not quiet:
            mark = "[green]ok  [/green]" if ok else "[red]FAIL[/red]"
            log.print(
                f"{mark} {name:<20} {kernel.device:<14} max|err| {err:.2e} (rtol {example.rtol:g}, atol {example.atol:g})"
                f"  {kernel.origin} in {ready_s * 1000:.1f} ms, config {kernel.config}"
            )
    entries = [e for e in store.entries() if e.bundle_digest == bundle.digest]
    data = {
        "bundle": str(args.output),
        "digest": built.digest,
        "build_s": build_s,
        "cache_dir": str(store.directory),
        "results": results,
        "cache": [{"kernel": e.kernel, "device": e.device_label, "config": e.config, "size": e.size, "hits": e.hits} for e in entries],
        "ok": all(r["ok"] for r in results),
    }

    def render(out):
        from portkern.cli.cache import entries_table

        out.print(entries_table(f"`portkern cache ls` for this bundle ({store.directory})", entries))
        verdict = "all kernels match NumPy" if data["ok"] else "SOME KERNELS DO NOT MATCH NumPy"
        out.print(f"{len(results)} kernels, {verdict}")

    return Report(data, render, status=0 if data["ok"] else 1)
