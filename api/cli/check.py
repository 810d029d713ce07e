"""`portkern check BUNDLE [--device D]`: whether every kernel of a bundle has native code for a
device on this machine (the local cache, the bundle's prebuilt code, or code for a CPU model this
host runs), so that no kernel would compile here. Nothing is compiled and no remote tier is asked.
Exit 1 naming each kernel that would compile (or cannot be planned), 0 when all are ready.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from portkern.base.errors import PortkernError, one_line
from portkern.cli.common import JSON_FORMAT, Report, add_cache_dir, add_json, shown, store_from, table


def register(sub) -> None:
    check = sub.add_parser("check", help="exit 1 naming each kernel of a bundle that would compile on a device here (compiles nothing)")
    check.add_argument("bundle", type=Path)
    check.add_argument("--device", default="cpu", help="device spec, as `run --device` takes it (default: cpu)")
    add_cache_dir(check)
    add_json(check)
    check.set_defaults(handler=run_check)


def run_check(args: argparse.Namespace) -> Report:
    import portkern
    from portkern.jit import devices
    from portkern.jit.toolchain import toolchain_for

    store = store_from(args)
    bundle = portkern.load(args.bundle, store=store)
    target = devices.resolve(args.device, store)
    rows: list[dict[str, Any]] = []
    for name in bundle.names():
        record = bundle.record(name)
        if not toolchain_for(record).accepts(target):
            rows.append({"kernel": name, "state": "other device", "ready": None, "origin": None, "config": None, "key": None,
                         "detail": f"{record.kind} kernel: does not run on {target.label}"})
            continue
        try:
            config, _, _ = bundle.config_for(record, target, None)  # the config `kernel()` would use
            plan = bundle.plan(record, target, config)
            native = bundle.available(plan)
        except PortkernError as exc:
            rows.append({"kernel": name, "state": "error", "ready": False, "origin": None, "config": None, "key": None,
                         "detail": f"{type(exc).__name__}: {one_line(exc)}"})
            continue
        if native is None:
            row: dict[str, Any] = {"state": "would compile", "ready": False, "origin": None, "detail": None}
        else:
            detail = f"built for {native.built_for}" if native.built_for and native.built_for != target.label else None
            if native.origin == "baseline":
                detail = f"{detail}; runs now, its exact code is compiled in the background"
            row = {"state": "ready", "ready": True, "origin": native.origin, "detail": detail}
        rows.append({"kernel": name, **row, "config": config, "key": plan.hex})
    would_compile = [r["kernel"] for r in rows if r["state"] == "would compile"]
    errors = [r["kernel"] for r in rows if r["state"] == "error"]
    data = {
        "json_format": JSON_FORMAT, "bundle": str(args.bundle), "device": target.label, "runnable": target.runnable,
        "cache_dir": str(store.directory), "ok": not would_compile and not errors, "kernels": rows,
        "would_compile": would_compile, "errors": errors,
    }

    def render(out):
        cells = [[r["kernel"], r["state"], r["origin"] or "-", r["detail"] or ""] for r in rows]
        out.print(table(f"{args.bundle} on {target.label}", ["kernel", "state", "origin", "detail"], cells))
        if not target.runnable:
            out.print(f"note: {target.label} is not on this machine ({shown(target.reason)})")
        if would_compile:
            out.print(f"[red]{len(would_compile)} kernel(s) would compile on {target.label}:[/red] "
                      f"{shown(', '.join(would_compile))} (`portkern finalize {shown(args.bundle)} --target {target.label}` builds them)")
        if errors:
            out.print(f"[red]{len(errors)} kernel(s) cannot be checked:[/red] {shown(', '.join(errors))}")
        if data["ok"]:
            out.print(f"ready: every kernel has native code for {target.label}")

    return Report(data, render, status=0 if data["ok"] else 1)
