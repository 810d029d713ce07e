"""`portkern cache ls|show|stats|verify|prune|clear|export|import|publish`."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

from portkern.base.errors import CacheError, PortkernError, UsageError, one_line
from portkern.base.settings import format_size
from portkern.cli.common import (
    JSON_FORMAT,
    Report,
    add_cache_dir,
    add_json,
    add_sign,
    device_filter,
    human_age,
    shown,
    store_from,
    table,
)

#: Entries `cache ls` shows without `--all` or `--limit`.
DEFAULT_LIMIT = 50


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text!r}")
    return value


DEVICE_HELP = "only this device: any spelling `finalize --target` takes (gfx942, amdgpu:gfx942, cpu:znver4, cpu), or a fingerprint prefix"


def register(sub) -> None:
    cache = sub.add_parser("cache", help="inspect and manage the per-device cache")
    actions = cache.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help: str, handler):
        p = actions.add_parser(name, help=help)
        add_cache_dir(p)
        add_json(p)
        p.set_defaults(handler=handler)
        return p

    ls = action("ls", "list cached native code, most recently used first", run_ls)
    ls.add_argument("--device", help=DEVICE_HELP)
    ls.add_argument("--kernel", help="only this kernel name")
    ls.add_argument("--bundle", help="only this bundle name")
    shown = ls.add_mutually_exclusive_group()
    shown.add_argument("--limit", type=positive, default=DEFAULT_LIMIT, metavar="N",
                       help=f"show the N most recently used (default {DEFAULT_LIMIT})")
    shown.add_argument("--all", action="store_true", help="show every entry")
    show = action("show", "everything about one entry", run_show)
    show.add_argument("key", help="entry key or a unique prefix of it")
    stats = action("stats", "entries, bytes, hits and misses, per device", run_stats)
    stats.add_argument("--prometheus", action="store_true",
                       help="the cache's counters in the Prometheus text format (hits, misses, remote lookups, compiles, "
                       "tuning runs, refusals by reason)")
    action("verify", "check rows, files and records; remove what is inconsistent (exit 1 if anything was)", run_verify)
    prune = action("prune", "evict old entries or shrink to a size", run_prune)
    prune.add_argument("--max-size", help="evict least recently used entries until the cache fits, e.g. 500MB")
    prune.add_argument("--older-than", help="evict entries not used for this long, e.g. 30d, 12h")
    clear = action("clear", "remove everything (unknown files included), or one device's entries", run_clear)
    clear.add_argument("--device", help=DEVICE_HELP)
    export = action("export", "write native code and tuning results to a file", run_export)
    export.add_argument("file", type=Path)
    export.add_argument("--device", help=DEVICE_HELP)
    add_sign(export, "the export file")
    imp = action("import", "add an exported file's entries to this cache", run_import)
    imp.add_argument("file", type=Path)
    imp.add_argument("--device", help=DEVICE_HELP)
    imp.add_argument(
        "--allow-unsigned",
        action="store_true",
        help="import native code even if no key in $PORTKERN_TRUSTED_KEYS signed the file",
    )
    publish = action("publish", "make sure the remote tier has a bundle's native code for a device (finalising what "
                     "is missing here first); exit 1 unless every kernel's code is there", run_publish)
    publish.add_argument("bundle", type=Path)
    publish.add_argument("--device", default="cpu", help="device spec or target, as `finalize --target` takes it (default: cpu)")
    publish.add_argument("--kernel", action="append", metavar="NAME", help="only these kernels (default: all)")
    publish.add_argument("--workers", type=positive, metavar="N", help="finalise up to N kernels at once (default: one per core)")


def entries_table(title: str, entries: list, serves: list[str] | None = None, kinds: list[str] | None = None):
    """The `cache ls` table of cache entries (with which hosts each serves and what its code is
    here, when given)."""
    now = time.time()
    rows = [
        [e.key[:12], e.kernel, e.bundle, e.device_label, e.config, e.stage or "-", format_size(e.size), human_age(e.created, now),
         human_age(e.last_used, now), e.hits]
        for e in entries
    ]
    columns = ["key", "kernel", "bundle", "device", "config", "from stage", "size", "age", "used", "hits"]
    if kinds is not None:
        rows = [row + [text] for row, text in zip(rows, kinds)]
        columns.append("code")
    if serves is not None:
        rows = [row + [text] for row, text in zip(rows, serves)]
        columns.append("serves")
    return table(title, columns, rows)


def run_ls(args: argparse.Namespace) -> Report:
    from portkern.cache.store import Filter

    store = store_from(args)
    where = Filter(kernel=args.kernel, bundle=args.bundle, device=device_filter(args.device, store))
    entries = store.entries(where, limit=None if args.all else args.limit)
    total = store.count(where)
    shown = f"{len(entries)} entries" if len(entries) == total else f"the {len(entries)} most recently used of {total} entries (--all for all)"
    from portkern.cli.build import code_kind
    from portkern.cli.build import serves as hosts_served

    served = [hosts_served(e.device) for e in entries]
    kinds = [code_kind(e.device, e.config) for e in entries]
    data = [{**asdict(e), "serves": text, "code": kind, "directory": str(store.directory_of(e.key))}
            for e, text, kind in zip(entries, served, kinds)]
    return Report(data, lambda out: out.print(entries_table(f"{places_text(store.places())}: {shown}", entries, served, kinds)))


def places_text(places: list[dict[str, str]]) -> str:
    """Cache directories in lookup order, each with its state unless it is the one writable directory."""
    if len(places) == 1 and places[0]["state"] == "writable":
        return places[0]["directory"]
    return " + ".join(f"{place['directory']} ({place['state']})" for place in places)


def run_show(args: argparse.Namespace) -> Report:
    store = store_from(args)
    matches = store.find(args.key)
    if not matches:
        raise CacheError(f"no cache entry with key {args.key!r}")
    if len(matches) > 1:
        raise CacheError(f"key prefix {args.key!r} matches more than one entry; give more of it")
    entry = matches[0]
    data = asdict(entry)

    def render(out):
        for name, value in data.items():
            if name == "device":
                value = ", ".join(f"{k}={v}" for k, v in value.items() if k != "features") + f", {len(value.get('features', '').split(','))} features"
            elif name in ("created", "last_used") and value:
                value = f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(value))} ({human_age(value)} ago)"
            elif name == "size":
                value = f"{value} ({format_size(value)})"
            elif name == "flags":
                value = " ".join(value)
            out.print(f"[bold]{name:>14}[/bold]  {value}")

    return Report(data, render)


def run_stats(args: argparse.Namespace) -> Report:
    if args.prometheus:
        return _prometheus(args)
    stats = store_from(args).stats()

    def render(out):
        looked = stats["hits"] + stats["misses"]
        rate = f" ({100 * stats['hits'] / looked:.0f}% hits)" if looked else ""
        out.print(f"{places_text(stats['directories'])}: {stats['entries']} entries, {format_size(stats['bytes'])} of {format_size(stats['max_size'])}, "
                  f"{stats['tuning_results']} tuning results, {stats['hits']} hits / {stats['misses']} misses{rate}")
        if stats["remote_hits"] or stats["remote_misses"] or stats["remote_errors"]:
            errors = f", {stats['remote_errors']} lookups Redis did not answer" if stats["remote_errors"] else ""
            out.print(f"remote tier: {stats['remote_hits']} hits / {stats['remote_misses']} misses{errors}")
        if len(stats["directories"]) > 1:
            rows = [[p["directory"], p["state"], p.get("entries", 0), format_size(p.get("bytes", 0))] for p in stats["directories"]]
            out.print(table("directories, in lookup order", ["directory", "state", "entries", "size"], rows))
        rows = [[d, v["entries"], format_size(v["bytes"]), v["hits"]] for d, v in sorted(stats["devices"].items())]
        out.print(table("per device", ["device", "entries", "size", "hits"], rows))

    return Report(stats, render)


def _prometheus(args: argparse.Namespace) -> Report:
    """`cache stats --prometheus`: the exposition text as it is, on stdout."""
    import sys

    import portkern

    if args.json:
        raise UsageError("cache stats: --prometheus and --json are two formats; give one")
    text = portkern.metrics(store_from(args))

    def render(out) -> None:
        sys.stdout.write(text)

    return Report(text, render)


def run_verify(args: argparse.Namespace) -> Report:
    from portkern.cache import scratch

    store = store_from(args)
    checked = store.count()
    findings = [
        {"kind": f.kind, "name": f.name, "problem": f.problem, "fixed": f.fixed,
         "kernel": f.entry.kernel if f.entry else None, "device": f.entry.device_label if f.entry else None}
        for f in store.verify()
    ]
    findings += [{"kind": "scratch", "name": str(path), "problem": "scratch directory of a process that is gone", "fixed": True,
                  "kernel": None, "device": None} for path in scratch.sweep()]
    data = {"checked": checked, "found": findings}

    def render(out):
        for item in findings:
            what = f" {item['kernel']} on {item['device']}" if item["kernel"] else ""
            done = "removed" if item["fixed"] else "NOT fixed"
            name = item["name"] if item["kind"] == "directory" else item["name"][:40]
            out.print(f"[red]{done}[/red] {item['kind']} {name}{what}: {item['problem']}")
        fixed = sum(1 for item in findings if item["fixed"])
        unfixed = len(findings) - fixed
        if not findings:
            verdict = "all intact"
        elif not unfixed:
            verdict = f"found and fixed {fixed} problems"
        else:
            verdict = f"found {len(findings)} problems, {unfixed} of them not fixed or not checked"
        out.print(f"verified {checked} entries: {verdict}")

    return Report(data, render, status=1 if findings else 0)


def run_prune(args: argparse.Namespace) -> Report:
    from portkern.base.settings import parse_duration, parse_size

    if args.max_size is None and args.older_than is None:
        raise CacheError("prune needs --max-size and/or --older-than")
    store = store_from(args)
    evicted = store.prune(
        max_size=parse_size(args.max_size) if args.max_size else None,
        older_than=parse_duration(args.older_than) if args.older_than else None,
    )
    data = {"evicted": [{"key": e.key, "kernel": e.kernel, "device": e.device_label, "size": e.size} for e in evicted]}
    return Report(data, lambda out: out.print(f"evicted {len(evicted)} entries, {format_size(sum(e.size for e in evicted))}"))


def run_clear(args: argparse.Namespace) -> Report:
    store = store_from(args)
    removed = store.clear(device_filter(args.device, store))
    what = f"entries of {args.device}" if args.device else "entries (and every other file of the cache but its emptied database)"
    return Report({"removed": removed, "device": args.device}, lambda out: out.print(f"removed {removed} {what}"))


def run_export(args: argparse.Namespace) -> Report:
    from portkern.base.signing import key_to_sign_with
    from portkern.cache.transfer import export

    store = store_from(args)
    report = export(store, args.file, device=device_filter(args.device, store), sign_with=key_to_sign_with(args.sign))
    signed = f", signed ({report.signed})" if report.signed else ""

    def render(out):
        out.print(f"exported {report.entries} entries ({format_size(report.bytes)}) and {report.records} tuning results to {args.file}{signed}")
        if report.note:
            out.print(f"[yellow]note:[/yellow] {report.note}")

    return Report(report.to_dict(), render)


def run_import(args: argparse.Namespace) -> Report:
    from portkern.cache.transfer import import_

    store = store_from(args)
    report = import_(store, args.file, device=device_filter(args.device, store), allow_unsigned=args.allow_unsigned)

    def render(out):
        out.print(f"{args.file}: {report.signature.describe()}")
        for reason in report.rejected:
            out.print(f"[red]rejected[/red] {reason}")
        if report.unsigned_allowed:
            out.print("[yellow]native code imported WITHOUT a trusted signature (--allow-unsigned)[/yellow]")
        out.print(f"imported {report.entries} entries ({format_size(report.bytes)}) and {report.records} tuning results; "
                  f"{report.skipped} already here, {len(report.rejected)} rejected")

    return Report(report.to_dict(), render, status=1 if report.rejected else 0)


def run_publish(args: argparse.Namespace) -> Report:
    """`cache publish BUNDLE`: each kernel's native code for the device (finalised here when the local
    cache and the remote tier lack it) offered to the remote tier; per kernel what became of it."""
    import portkern
    from portkern.cache.publish import publish
    from portkern.cache.remote import PRESENT, PUBLISHED, REMOTE_ENV
    from portkern.cli.finalize import remote_line
    from portkern.jit import devices
    from portkern.jit.toolchain import toolchain_for

    store = store_from(args)
    remote = store.remote
    if remote is None:
        raise UsageError(f"cache publish needs a remote tier: set {REMOTE_ENV} (redis://host:port/db)")
    bundle = portkern.load(args.bundle, store=store)
    target = devices.resolve(args.device, store)
    rows: list[dict] = []
    wanted: list[str] = []
    for name in args.kernel or bundle.names():
        record = bundle.record(name)
        row = {"kernel": name, "key": None, "origin": None, "remote": None, "published": None, "error": None}
        if not toolchain_for(record).accepts(target):
            row["error"] = f"{record.kind} kernel: does not run on {target.label}"
        else:
            wanted.append(name)
        rows.append(row)
    outcomes = bundle.prepare(args.device, wanted, workers=args.workers) if wanted else {}
    for row in rows:
        native = outcomes.get(row["kernel"])
        if isinstance(native, PortkernError):
            row.update(published=False, error=f"{type(native).__name__}: {one_line(native)}")
        elif native is not None:
            row.update(key=native.key, origin=native.origin)
    ready = [row for row in rows if row["key"]]
    publication = publish(store, remote, [row["key"] for row in ready], {row["key"] for row in ready if row["origin"] == "finalized"})
    for row in ready:
        row["remote"] = publication.outcomes[row["key"]]
        row["published"] = row["remote"] in (PUBLISHED, PRESENT)
    summary = publication.summary()
    failed = sum(1 for row in rows if row["published"] is False and row["key"] is None)
    if failed:  # kernels without native code here (compiling off, a failed compile): not published either
        summary["missing"] += failed
        summary["reason"] = "; ".join(filter(None, [summary["reason"], f"{failed} kernel(s) have no native code here (see each kernel's error)"]))
    not_published = [row["kernel"] for row in rows if row["published"] is False]
    data = {
        "json_format": JSON_FORMAT, "bundle": str(args.bundle), "device": target.label, "cache_dir": str(store.directory),
        "ok": not not_published, "published": not not_published and bool(ready), "remote": summary,
        "kernels": rows, "not_published": not_published,
    }

    def render(out):
        cells = [[r["kernel"], r["origin"] or "-", r["remote"] or "-", r["error"] or ""] for r in rows]
        out.print(table(f"{args.bundle} for {target.label} -> {remote.url}", ["kernel", "origin", "remote tier", "error"], cells))
        out.print(remote_line(summary))
        if not_published:
            out.print(f"[red]{len(not_published)} kernel(s) not in the remote tier:[/red] {shown(', '.join(not_published))}")

    return Report(data, render, status=0 if data["ok"] else 1)
