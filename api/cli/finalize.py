"""`portkern finalize`: native code for named targets, ahead of time, into the cache.

On a host without the device (`--target gfx942`, `cuda:sm_90`, `cpu:znver4`):
the entries are stored under that target's fingerprint and are served to a
device with exactly that fingerprint, CPU code also to any host whose CPU has
every feature it was built with; `--export FILE` ships them to a fleet.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from portkern.cli.common import JSON_FORMAT, Report, add_cache_dir, add_json, add_sign, console, human_size, store_from, table
from portkern.errors import PortkernError, UsageError


def register(sub) -> None:
    fin = sub.add_parser("finalize", help="finalise a bundle's kernels for named targets into the cache")
    fin.add_argument("bundle", type=Path)
    fin.add_argument(
        "--target",
        action="append",
        required=True,
        metavar="TARGETS",
        help="target(s), comma-separated or repeated: gfx942, gfx90a:xnack-, cuda:sm_90, cpu:znver4, cpu",
    )
    fin.add_argument("--kernel", action="append", metavar="NAME", help="only these kernels (default: all)")
    fin.add_argument("--workers", type=int, metavar="N", help="finalise up to N kernels at once (default: one per core)")
    fin.add_argument("--export", type=Path, metavar="FILE", help="also write the entries to an export file")
    add_sign(fin, "the export file")
    add_cache_dir(fin)
    add_json(fin)
    fin.set_defaults(handler=run_finalize)


def run_finalize(args: argparse.Namespace) -> Report:
    import portkern
    from portkern.cache import transfer
    from portkern.jit import codeobject, devices
    from portkern.signing import check_signing_key, key_to_sign_with

    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be at least 1")
    sign_with = key_to_sign_with(args.sign) if args.export else None
    if sign_with is not None:
        check_signing_key(sign_with)  # a bad key fails before finalising
    store = store_from(args)
    bundle = portkern.load(args.bundle, store=store)
    specs = [spec for value in args.target for spec in devices.split(value)]
    targets = [devices.resolve(spec, store) for spec in specs]
    names = args.kernel or bundle.names()
    for name in names:
        bundle.record(name)
    rows = []
    with _progress(disabled=args.json) as show:
        prepared = [(target, bundle.prepare(spec, names, workers=args.workers, progress=show.for_target(target.label, len(names))))
                    for spec, target in zip(specs, targets)]
    for target, outcomes in prepared:
        for name, native in outcomes.items():
            row = {"kernel": name, "target": target.label, "fingerprint": target.fingerprint.digest()}
            if isinstance(native, PortkernError):
                rows.append({**row, "ok": False, "error": f"{type(native).__name__}: {' '.join(str(native).split())}"})
                continue
            rows.append(
                {
                    **row,
                    "ok": True,
                    "key": native.key,
                    "origin": native.origin,
                    "size": len(native.data),
                    "finalize_s": native.finalize_s,
                    "code": codeobject.inspect(native.data).summary(),
                }
            )
    keys = [r["key"] for r in rows if r["ok"]]
    exported = transfer.export(store, args.export, keys=keys, sign_with=sign_with).to_dict() if args.export else None
    # per entry, `finalize_s`: the time its native code took to make (for a cache hit, when it was made)
    data = {"json_format": JSON_FORMAT, "bundle": str(args.bundle), "cache_dir": str(store.directory), "entries": rows, "exported": exported}

    def render(out):
        shown = [
            [r["kernel"], r["target"], r.get("origin", "FAILED"), human_size(r["size"]) if r["ok"] else "-", r.get("code") or r.get("error")]
            for r in rows
        ]
        out.print(table(f"finalised into {store.directory}", ["kernel", "target", "origin", "size", "code"], shown))
        if exported:
            signed = f", signed ({exported['signed']})" if exported["signed"] else ""
            out.print(f"exported {exported['entries']} entries ({human_size(exported['bytes'])}) to {exported['path']}{signed}")

    return Report(data, render, status=0 if all(r["ok"] for r in rows) else 1)



class _progress:
    """A rich progress bar per target on stderr: kernels finalised (or found) so far."""

    def __init__(self, disabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console(stderr=True), disable=disabled, transient=False,
        )

    def __enter__(self):
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def for_target(self, label: str, kernels: int):
        task = self.bar.add_task(f"finalising for {label}", total=kernels)

        def show(done: int, total: int, plan) -> None:
            self.bar.update(task, completed=done, total=total, description=f"finalising for {label}: {plan.name}")

        return show
