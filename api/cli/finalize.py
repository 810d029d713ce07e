"""`portkern finalize`: native code for named targets, ahead of time, into the cache.

On a host without the device (`--target gfx942`, `cuda:sm_90`, `cpu:znver4`):
the entries are stored under that target's fingerprint and are served to a
device with exactly that fingerprint, CPU code also to any host whose CPU has
every feature it was built with; `--export FILE` ships them to a fleet. With a remote
tier (`PORTKERN_REMOTE_CACHE`), a publisher also makes sure the fleet has each entry;
`--json` says what was published (`published`, `remote`), and `--publish` fails unless all was.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from portkern.base.errors import PortkernError, UsageError, one_line
from portkern.base.settings import format_size
from portkern.cli.common import JSON_FORMAT, Report, add_cache_dir, add_json, add_sign, console, store_from, table


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
    fin.add_argument("--publish", action="store_true",
                     help="require the remote tier: exit 1 unless every entry is published there")
    add_sign(fin, "the export file")
    add_cache_dir(fin)
    add_json(fin)
    fin.set_defaults(handler=run_finalize)


def run_finalize(args: argparse.Namespace) -> Report:
    import portkern
    from portkern.base.signing import check_signing_key, key_to_sign_with
    from portkern.cache import transfer
    from portkern.jit import codeobject, devices

    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be at least 1")
    sign_with = key_to_sign_with(args.sign) if args.export else None
    if sign_with is not None:
        check_signing_key(sign_with)  # a bad key fails before finalising
    store = store_from(args)
    bundle = portkern.load(args.bundle, store=store)
    specs = [spec for value in args.target for spec in devices.split(value)]
    if not specs:  # (`--target "$UNSET"`: nothing to finalise is not a success)
        raise UsageError(f"--target names no target ({', '.join(map(repr, args.target))}); e.g. --target cpu,gfx942")
    targets = [devices.resolve(spec, store) for spec in specs]
    names = args.kernel or bundle.names()
    for name in names:
        bundle.record(name)
    rows: list[dict[str, Any]] = []
    with _progress(disabled=args.json) as show:
        prepared = [(target, bundle.prepare(spec, names, workers=args.workers, progress=show.for_target(target.label, len(names))))
                    for spec, target in zip(specs, targets)]
    for target, outcomes in prepared:
        for name, native in outcomes.items():
            row = {"kernel": name, "target": target.label, "fingerprint": target.fingerprint.digest()}
            if isinstance(native, PortkernError):
                rows.append({**row, "ok": False, "error": f"{type(native).__name__}: {one_line(native)}"})
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
    remote = _publish(store, rows, args.publish)
    published = remote is not None and not remote["missing"] and bool(keys)
    # per entry, `finalize_s`: the time its native code took to make (for a cache hit, when it was made);
    # `remote`: "published" (written now), "present" (the fleet had it) or why it is not in the remote tier
    data = {
        "json_format": JSON_FORMAT, "bundle": str(args.bundle), "cache_dir": str(store.directory), "entries": rows,
        "exported": exported, "published": published, "remote": remote,
    }

    def render(out):
        shown = [
            [r["kernel"], r["target"], r.get("origin", "FAILED"), format_size(r["size"]) if r["ok"] else "-", r.get("code") or r.get("error")]
            for r in rows
        ]
        out.print(table(f"finalised into {store.directory}", ["kernel", "target", "origin", "size", "code"], shown))
        if exported:
            signed = f", signed ({exported['signed']})" if exported["signed"] else ""
            out.print(f"exported {exported['entries']} entries ({format_size(exported['bytes'])}) to {exported['path']}{signed}")
        if remote is not None:
            out.print(remote_line(remote))

    ok = all(r["ok"] for r in rows) and (published or not args.publish)
    return Report(data, render, status=0 if ok else 1)


def remote_line(remote: dict) -> str:
    """One line of what was published (`Publication.summary`)."""
    missing = f"; {remote['missing']} not published: {remote['reason']}" if remote["missing"] else ""
    return f"remote tier {remote['url']} ({remote['role']}): {remote['published']} published, {remote['present']} already there{missing}"


def _publish(store, rows: list[dict], required: bool) -> dict | None:
    """Offer each finalised entry to the remote tier (`cache.publish`), noting the outcome in its
    row; what was published (`Publication.summary`), or None without a remote tier."""
    from portkern.cache.publish import publish
    from portkern.cache.remote import REMOTE_ENV

    if store.remote is None:
        if required:
            raise UsageError(f"--publish needs a remote tier ({REMOTE_ENV})")
        return None
    done = [row for row in rows if row["ok"]]
    publication = publish(store, store.remote, [row["key"] for row in done], {row["key"] for row in done if row["origin"] == "finalized"})
    for row in done:
        row["remote"] = publication.outcomes[row["key"]]
    return publication.summary()


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
