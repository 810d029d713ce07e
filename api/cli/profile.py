"""`portkern profile`: each dispatch of a kernel timed alone, for the compiler's default and the tuned config."""

from __future__ import annotations

import argparse
from pathlib import Path

from portkern.base.errors import TuningError
from portkern.cli.common import JSON_FORMAT, Report, add_cache_dir, add_json, store_from, table


def register(sub) -> None:
    profile = sub.add_parser(
        "profile", help="time each dispatch of a kernel alone, at the compiler's default and at the tuned config",
    )
    profile.add_argument("bundle", type=Path)
    profile.add_argument("kernel")
    profile.add_argument("--device", default="cpu", help="device spec (default: cpu)")
    profile.add_argument(
        "--config", metavar="CONFIG",
        help="profile this kernel config beside the default (default: the stored tuned config, if any)",
    )
    profile.add_argument("--workers", type=int, metavar="N", help="parallel compile workers (default: one per core)")
    add_cache_dir(profile)
    add_json(profile)
    profile.set_defaults(handler=run_profile)


def run_profile(args: argparse.Namespace) -> Report:
    import portkern
    from portkern.jit import devices
    from portkern.jit.workers import Pool
    from portkern.tuner import kernel_config
    from portkern.tuner.profile import profile_kernel

    if args.workers is not None and args.workers < 1:
        raise TuningError("--workers must be at least 1")
    if args.config is not None:
        kernel_config.parse(args.config)  # PerfConfigError before any work
    store = store_from(args)
    bundle = portkern.load(args.bundle, store=store)
    record = bundle.record(args.kernel)
    target = devices.resolve(args.device, store)
    pool = Pool(args.workers) if args.workers else None
    try:
        found = profile_kernel(bundle.natives, record, target, args.config, pool=pool)
    finally:
        if pool is not None:
            pool.close()
    data = {"json_format": JSON_FORMAT, "ok": True, **found.to_dict()}
    return Report(data, lambda out: render(out, data))


def render(out, data: dict) -> None:
    """A profile's tables (one per config) and its whole-against-sum lines, as `portkern profile` prints them."""
    for config in data["configs"]:
        rows = [
            [d["index"], d["name"], d["calls"], _ms(d["call_s"]), _ms(d["time_s"]), _share(d["share"]), d["note"]]
            for d in config["dispatches"]
        ]
        title = f"{data['kernel']} on {data['device']} ({data['driver']}), {config['role']} config: {config['config']}"
        out.print(table(title, ["dispatch", "name", "calls", "ms per call", "ms in kernel", "share", "note"], rows))
        whole, total = config["whole_s"], config["sum_s"]
        covered = f" ({total / whole:.0%} of the whole)" if whole and total else ""
        out.print(f"whole kernel call {_ms(whole)} ms; dispatches timed alone, added up: {_ms(total)} ms{covered}")
        if config["note"]:
            out.print(config["note"])
    if data["note"]:
        out.print(data["note"])


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.3f}" if seconds else "-"


def _share(value: float | None) -> str:
    return f"{value:.1%}" if value is not None else "-"
