"""`portkern build` and `portkern inspect`."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping

from portkern.base.errors import BuildError, UsageError
from portkern.base.settings import format_size
from portkern.cli.common import JSON_FORMAT, Report, add_cache_dir, add_json, add_sign, shown, store_from, table


def register(sub) -> None:
    build = sub.add_parser("build", help="build a bundle from a manifest")
    build.add_argument("manifest", type=Path, help="manifest.yaml")
    build.add_argument("-o", "--output", type=Path, required=True, help="bundle file to write (.pkb): a new file renamed over the path, so a process that loaded the old one keeps it")
    build.add_argument(
        "--prebuild",
        metavar="TARGETS",
        help="also store native code for these comma-separated targets, e.g. gfx942,cuda:sm_90,cpu:znver4",
    )
    build.add_argument(
        "--no-source", action="store_true",
        help="leave out the kernels' source stage (for sources that must not ship); such a bundle runs only with "
        "the IREE release that built it",
    )
    add_sign(build, "the bundle")
    add_json(build)
    build.set_defaults(handler=run_build)

    inspect = sub.add_parser("inspect", help="show what a bundle holds, and what this device's tuning DB holds for its kernels")
    inspect.add_argument("bundle", type=Path)
    inspect.add_argument("--device", default="cpu", help="device whose tuning records are shown, as `run --device` takes it (default: cpu)")
    add_cache_dir(inspect)
    add_json(inspect)
    inspect.set_defaults(handler=run_inspect)


def run_build(args: argparse.Namespace) -> Report:
    from portkern.portable.builder import build_file

    def say(text: str) -> None:
        if not args.json:
            from portkern.cli.common import console

            console(stderr=True).print(text)

    from portkern.base.signing import check_signing_key, key_to_sign_with, sign_file, signature_path

    if args.output.exists() and not args.output.is_file():  # (a device, a pipe, a directory)
        raise BuildError(f"{args.output}: not a regular file: a bundle is written to a file, which the build reads back to check")
    sign_with = key_to_sign_with(args.sign)
    if sign_with is not None:
        check_signing_key(sign_with)  # a bad key fails before the build
    finish = None
    failures: list = []
    if args.prebuild is not None:
        from portkern.jit.devices import resolve, split
        from portkern.jit.prebuild import prebuild

        targets = [resolve(spec) for spec in split(args.prebuild)]  # bad names fail before the build
        if not targets:
            raise UsageError(f"--prebuild names no target ({args.prebuild!r}); e.g. --prebuild cpu:x86-64-v3,gfx942")

        def finish(bundle):
            done = prebuild(bundle, targets, lambda record, target: say(f"prebuild {record.name} for {target.label} ..."))
            failures.extend(done.failures)
            return done.bundle

    starts: dict[str, float] = {}

    def progress(spec, i, n) -> None:
        starts[spec.name] = time.perf_counter()
        say(f"[{i + 1}/{n}] {spec.name} ({spec.kind}) ...")

    built: list[float] = []

    def finished(bundle):
        built.append(time.perf_counter())
        return finish(bundle) if finish is not None else bundle

    build_file(args.manifest, args.output, progress, finished, source=not args.no_source)
    if sign_with is not None:
        sign_file(args.output, sign_with)
    else:
        signature_path(args.output).unlink(missing_ok=True)  # a signature of an earlier build would not match
    report = describe(args.output)
    report.data["written"] = str(args.output)
    ends = [*list(starts.values())[1:], *built]
    for kernel, start, end in zip(report.data["kernels"], starts.values(), ends):
        kernel["build_s"] = end - start  # lowering this kernel on the build host (prebuilds not included)
    report.data["prebuild_failures"] = [asdict(f) for f in failures]
    if failures:
        shown = report.render

        def render(out):
            shown(out)
            for failure in failures:
                out.print(f"[red]prebuild failed[/red]: {failure.kernel} for {failure.target}: {failure.error}")
            out.print(f"{len(failures)} prebuild(s) failed; the bundle holds the native code that was built")

        report = Report(report.data, render, status=1)
    return report


def run_inspect(args: argparse.Namespace) -> Report:
    from portkern.jit import devices
    from portkern.portable.bundle import decode_file, read_bundle_head

    report = describe(args.bundle)
    store = store_from(args)
    target = devices.resolve(args.device, store)
    raw, size = read_bundle_head(args.bundle)
    records = decode_file(args.bundle, raw, file_size=size).kernels
    tuned = [tuning_of(record, target, store) for record in records]
    for kernel, found in zip(report.data["kernels"], tuned):
        kernel["tuning"] = found
    report.data["tuning_device"] = target.label
    report.data["cache_dir"] = str(store.directory)
    described = report.render

    def render(out):
        if described is not None:
            described(out)
        rows = [
            [record.name, found["config"] or "-", ", ".join(found["options"]) or "-",
             ", ".join(f"{d['index']}={d['config']}" for d in found["dispatches"]) or "-",
             found["strategy"] or "-", f"{found['speedup']:.2f}x" if found["speedup"] else "-", _tuning_note(found)]
            for record, found in zip(records, tuned)
        ]
        title = f"tuning on {target.label} ({store.directory})"  # (cells and title are escaped by `table`)
        out.print(table(title, ["kernel", "config", "module options", "tuned dispatches", "strategy", "speedup", "note"], rows))

    return Report(report.data, render, status=report.status)


def tuning_of(record, target, store) -> dict[str, Any]:
    """What the tuning DB of `store` holds for a kernel on `target`: the config `kernel()` serves
    ("default" when no usable selection is stored; None when the kernel does not run there), its
    module options and tuned dispatches, how it was found, and each shape bucket's decision."""
    from portkern.base.errors import PortkernError, one_line
    from portkern.cache.tuning import UNUSABLE, TuningDB
    from portkern.jit.buckets import read_index
    from portkern.jit.native import check_toolchain, compiler_id, selection_problem

    found: dict[str, Any] = {
        "config": None, "stored": False, "options": [], "dispatches": [], "strategy": None, "complete": None,
        "default_s": None, "best_s": None, "speedup": None, "unusable": None, "note": "", "buckets": [],
    }
    try:
        check_toolchain(record, target)
        db = TuningDB(store, compiler_id(record))
        problem = selection_problem(record, target)
        stored = db.selection(problem, target.fingerprint)
        buckets = read_index(db.buckets(problem, target.fingerprint))
    except PortkernError as exc:
        found["note"] = f"{type(exc).__name__}: {one_line(exc, limit=200)}"
        return found
    found["config"] = "default"
    if isinstance(stored, dict) and isinstance(stored.get("config"), str):
        found["stored"] = True
        found.update({k: stored[k] for k, kind in (("strategy", str), ("complete", bool), ("note", str)) if isinstance(stored.get(k), kind)})
        found.update({k: float(stored[k]) for k in ("default_s", "best_s") if type(stored.get(k)) in (int, float) and stored[k] > 0})
        if found["default_s"] and found["best_s"]:
            found["speedup"] = found["default_s"] / found["best_s"]
        if stored.get(UNUSABLE):
            found["unusable"] = str(stored[UNUSABLE])
        else:
            found["config"] = stored["config"]
        _split(found, stored["config"])
    for label, decided in buckets.items():
        bucket_s = decided.bucket_s if type(decided.bucket_s) in (int, float) else None
        found["buckets"].append({
            "bucket": label, "values": dict(decided.values), "code": decided.code, "config": decided.config,
            "bucket_config": decided.bucket_config, "default_s": decided.default_s, "best_s": decided.best_s, "bucket_s": bucket_s,
        })
    return found


def _split(found: dict[str, Any], config: str) -> None:
    """Fill a `tuning_of` entry's module options and dispatch configs from a stored kernel config."""
    from portkern.base.errors import PerfConfigError
    from portkern.tuner import kernel_config, perfconfig

    try:
        parsed = kernel_config.parse(config)
    except PerfConfigError as exc:
        found["note"] = f"stored config not readable: {exc}"
        return
    found["options"] = list(parsed.options)
    found["dispatches"] = [{"index": index, "config": perfconfig.to_string(c)} for index, c in parsed.dispatches]


def _tuning_note(found: dict[str, Any]) -> str:
    """The note column of `inspect`'s tuning table."""
    parts = []
    if not found["stored"] and found["config"] is not None:
        parts.append("nothing stored: the compiler's default")
    if found["unusable"]:
        parts.append(f"stored selection set aside (does not build): {found['unusable']}")
    if found["complete"] is False:
        parts.append("incomplete search")
    if found["buckets"]:
        parts.append("buckets: " + ", ".join(f"{b['bucket']} {b['code']}" for b in found["buckets"]))
    if found["note"] and (found["config"] is None or not found["stored"]):
        parts.append(found["note"])
    return "; ".join(parts)


def _stage_text(stage) -> str:
    """A stage in `inspect`'s table: `any/flow`, `amdgpu/executable-sources (placeholder)`, `source (onnx-protobuf, opset 17)`."""
    if stage.is_source:
        model = f", opset {stage.model['opset']}, IR v{stage.model['ir_version']}" if stage.model else ""
        return f"source ({stage.format}{model})"
    return f"{stage.family}/{stage.phase}{' (placeholder)' if stage.placeholder else ''}"


def serves(device: Mapping[str, Any]) -> str:
    """Which hosts native code built for this device (a fingerprint as plain data) is served to."""
    from portkern.cache.device import DeviceFingerprint
    from portkern.jit.cpu import serves as hosts_served

    return hosts_served(DeviceFingerprint.from_dict(device))


def code_kind(device: dict, config: str) -> str:
    """What a cache entry's code is here: "tuned" (a tuned config), "baseline" (built for a CPU
    model or ISA level below this host's) or "finalized"."""
    from portkern.cache.device import DeviceFingerprint
    from portkern.jit import cpu

    if config != "default":
        return "tuned"
    return "baseline" if cpu.is_baseline(DeviceFingerprint.from_dict(device), cpu.host()) else "finalized"


def describe(path: Path) -> Report:
    """A bundle's kernels, stages, native slices, producers, digest and signature."""
    from portkern.base.signing import from_env, verify_file
    from portkern.portable.bundle import IREE_KINDS, decode_file, read_bundle_head

    raw, size = read_bundle_head(path)
    bundle = decode_file(path, raw, file_size=size)
    verdict = verify_file(path, raw if bundle.parameters is None else None, from_env().trusted)
    data = {
        "json_format": JSON_FORMAT,
        "path": str(path),
        "name": bundle.name,
        "digest": bundle.digest,
        "format_version": ".".join(map(str, bundle.version)),
        "size": size,
        "kernels": [
            {
                "name": k.name,
                "kind": k.kind,
                "entry": k.entry,
                "signature": k.signature.to_dict(),
                "signature_text": str(k.signature),
                "contract_text": k.signature.contract_text if k.kind in IREE_KINDS else "launch description",
                "stages": [s.to_dict() for s in k.stages],
                "native": [{**n.to_dict(), "serves": serves(n.device)} for n in k.native],
                "launch": dict(k.launch),
                "parameters": {"count": len(k.parameters), "bytes": sum(p.size for p in k.parameters)},
            }
            for k in bundle.kernels
        ],
        "signature": verdict.to_dict(),
        "parameters": bundle.parameters.to_dict() if bundle.parameters is not None else None,
    }

    def render(out):
        out.print(f"[bold]{shown(bundle.name)}[/bold]  {shown(path)}  ({format_size(size or 0)}, format {shown(data['format_version'])})")
        out.print(f"digest sha256:{shown(bundle.digest)}")
        out.print(f"signature: {shown(verdict.describe())}")
        rows = []
        for k in bundle.kernels:
            stages = ", ".join(
                f"{_stage_text(s)} {format_size(s.size)}" for s in k.stages
            ) if len(k.stages) <= 4 else f"{len(k.stages)} stages ({format_size(sum(s.size for s in k.stages))})"
            native = ", ".join(f"{n.target} {format_size(n.size)} ({serves(n.device)})" for n in k.native) or "-"
            contract = k.signature.contract_text if k.kind in IREE_KINDS else "launch (below)"
            weights = f"{len(k.parameters)}, {format_size(sum(p.size for p in k.parameters))}" if k.parameters else "-"
            rows.append([k.name, k.kind, k.entry, str(k.signature), contract, stages, native, weights])
        out.print(table(None, ["kernel", "kind", "entry", "signature", "shape contract", "stages", "prebuilt", "parameters"], rows))
        producers = sorted({f"{s.producer.compiler} {s.producer.version}" + (
            f" (bytecode v{s.producer.bytecode_version})" if s.producer.bytecode_version is not None else "")
            for k in bundle.kernels for s in k.stages})
        out.print("producer: " + shown("; ".join(producers)))
        for k in bundle.kernels:
            points = k.launch.get("variants", []) if k.launch else []
            if points and points[0].get("params"):
                default = ",".join(f"{n}={v}" for n, v in points[0]["params"])
                at = ", ".join(f"{n}={v}" for n, v in k.launch.get("tune_at", {}).items()) or "static shapes"
                out.print(shown(f"launch {k.name}: global ({', '.join(k.launch['global'])}); {len(points)} points, default {default}, tuned at {at}"))
            elif k.launch:
                sizes = "; ".join(
                    ("" if v["subgroup_size"] is None else f"sub-group {v['subgroup_size']}: ")
                    + ("x".join(map(str, v["local"])) if v["local"] else "driver's choice")
                    for v in k.launch["variants"]
                )
                out.print(shown(f"launch {k.name}: global ({', '.join(k.launch['global'])}), local {sizes}"))

    return Report(data, render)
