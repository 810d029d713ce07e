"""`portkern tune`: find and store the best perf config of a bundle's kernels on a device."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from portkern.base import settings
from portkern.base.errors import CompileForbiddenError, DispatchTuningError, PortkernError, TuningError, one_line
from portkern.cli.common import JSON_FORMAT, Report, add_cache_dir, add_json, console, store_from, table

if TYPE_CHECKING:
    from rich.progress import TaskID


def register(sub) -> None:
    from portkern.tuner import strategies

    tune = sub.add_parser("tune", help="tune a bundle's kernels for a device and store the winners")
    tune.add_argument("bundle", type=Path)
    tune.add_argument("--kernel", action="append", metavar="K", help="tune only this kernel (repeatable; default: all)")
    tune.add_argument("--device", default="cpu", help="device spec (default: cpu)")
    tune.add_argument("--strategy", default="quick", choices=strategies.names(), help="search strategy (default: quick)")
    tune.add_argument("--budget", type=int, metavar="N", help="at most N candidates per dispatch (default: the strategy's)")
    tune.add_argument("--time-limit", type=float, metavar="S", help="stop searching after S seconds in all")
    tune.add_argument("--workers", type=int, metavar="N", help="parallel compile workers (default: one per core)")
    tune.add_argument("--retune", action="store_true", help="search again even when a result is stored")
    tune.add_argument(
        "--compile-only", action="store_true",
        help="for a device that is not here (e.g. --device gfx942, cuda:sm_90): compile every dispatch's search space "
        "(at most --budget candidates each) and check the code objects; nothing is stored",
    )
    tune.add_argument(
        "--shapes", action="append", metavar="ARG=SHAPE[,SHAPE...]",
        help="kernels with dynamic dimensions: tune per shape bucket for these shapes, e.g. a=1x256,64x256,2048x256 "
        "(repeat for more arguments; the i-th shapes of every argument form one call)",
    )
    tune.add_argument(
        "--report", type=Path, metavar="FILE.html",
        help="write a page with the search's plots and each kernel's per-dispatch profile (its data beside it as FILE.json)",
    )
    add_cache_dir(tune)
    add_json(tune)
    tune.set_defaults(handler=run_tune)


def run_tune(args: argparse.Namespace) -> Report:
    import portkern
    from portkern.jit import devices
    from portkern.tuner import strategies
    from portkern.tuner.search import Budget
    from portkern.tuner.session import Tuner

    if args.workers is not None and args.workers < 1:
        raise TuningError("--workers must be at least 1")
    strategies.get(args.strategy)
    Budget(args.budget, args.time_limit)  # bad options fail the command, not each kernel
    if args.report is not None:
        _report_possible(args)
    store = store_from(args)
    bundle = portkern.load(args.bundle, store=store)
    names = args.kernel or bundle.names()
    records = [bundle.record(name) for name in names]
    forbid_compiling(store, names)
    target = devices.resolve(args.device, store)
    if args.compile_only:
        return _compile_only(args, bundle, records, target)
    if not target.runnable:
        raise TuningError(f"cannot tune for {target.label} here: {target.reason}")
    if args.shapes:
        return _tune_shapes(args, bundle, records, target)
    results, errors = [], []
    deadline = time.perf_counter() + args.time_limit if args.time_limit else None
    with Tuner(workers=args.workers) as tuner, _progress(disabled=args.json) as show:
        for position, record in enumerate(records):
            time_limit = None
            if deadline is not None:
                time_limit = max(1e-3, (deadline - time.perf_counter()) / (len(records) - position))
            try:
                results.append(
                    tuner.tune(bundle.natives, record, target, args.strategy, budget=args.budget, time_limit=time_limit, retune=args.retune, progress=show)
                )
            except PortkernError as exc:  # one kernel's failure: reported, the others are still tuned
                errors.append(_error(record.name, exc))
        profiles = _profiles(bundle, results, target, tuner) if args.report is not None else []
    data = {
        "json_format": JSON_FORMAT,
        "device": target.label,
        "strategy": args.strategy,
        "ok": not errors,
        "kernels": [r.to_dict(evaluations=True) for r in results],
        "errors": errors,
    }
    if args.report is not None:
        from portkern.tuner import report

        beside = report.write(args.report, {**data, "profiles": profiles})
        data["report"] = {"html": str(args.report), "json": str(beside)}

    def render(out):
        rows = []
        for r in results:
            for d in r.dispatches:
                rows.append([
                    r.kernel, d.index, _ms(d.default_s), _ms(d.best_s), _speedup(d.speedup),
                    d.evaluated, d.failed + d.wrong, d.source + ("" if d.complete else " (incomplete)"),
                    d.note if d.source == "skipped" else f"{d.config} ({d.note})" if d.note else d.config,
                ])
        columns = [
            "kernel", "dispatch", "kernel ms, dispatch at default", "kernel ms, dispatch tuned", "dispatch speedup",
            "evaluated", "failed", "from", "config",
        ]
        out.print(table(f"{args.strategy} tuning on {target.label} (per dispatch: whole-kernel call time with that dispatch changed)", columns, rows))
        for r in results:
            out.print(
                f"{r.kernel}: {r.config}  kernel call {_ms(r.default_s)} ms default -> {_ms(r.best_s)} ms chosen, "
                f"speedup {_speedup(r.speedup)} ({r.source}, {r.wall_s:.1f} s{'' if r.complete else ', incomplete'})"
            )
        for e in errors:
            where = f" dispatch {e['dispatch']}" if e["dispatch"] else ""
            out.print(f"[red]{e['kernel']}{where}: not tuned: {e['type']}: {e['message']}[/red]")

    return Report(data, render, status=1 if errors else 0)


def _report_possible(args: argparse.Namespace) -> None:
    """Refuse `--report` before any work where it cannot be written."""
    from portkern.tuner import report

    if args.compile_only or args.shapes:
        raise TuningError("--report shows a tuning run on this device; it does not take --compile-only or --shapes")
    report.check(args.report)


def _profiles(bundle, results, target, tuner) -> list[dict]:
    """Each tuned kernel's per-dispatch profile at its default and chosen config (`--report`);
    one that cannot be profiled is listed with the reason."""
    from portkern.tuner.profile import profile_kernel

    found = []
    for r in results:
        try:
            profile = profile_kernel(bundle.natives, bundle.record(r.kernel), target, r.config, role="tuned", pool=tuner.pool)
            found.append(profile.to_dict())
        except PortkernError as exc:
            found.append({"kernel": r.kernel, "error": f"{type(exc).__name__}: {one_line(exc, limit=500)}"})
    return found


def forbid_compiling(store, names: list[str]) -> None:
    """Refuse to tune, before any work, where compiling is turned off: tuning compiles candidates."""
    from portkern.cache import metrics

    if settings.compile_mode() == settings.COMPILE_NEVER:
        metrics.refused(store, metrics.COMPILE_FORBIDDEN)
        kernels = ", ".join(repr(name) for name in names)
        raise CompileForbiddenError(
            f"tuning {kernels} compiles candidate configs, and compiling is turned off here "
            f"({settings.COMPILE}={settings.COMPILE_NEVER}): tune on a build farm and import or publish the results"
        )


def _compile_only(args: argparse.Namespace, bundle, records, target) -> Report:
    """`portkern tune --compile-only`: each dispatch's space compiled and checked, per dispatch counts and reasons."""
    from portkern.jit.workers import Pool, shared_pool
    from portkern.tuner.compile_only import compile_space

    if args.shapes:
        raise TuningError("--compile-only compiles the kernels as built; it does not take --shapes")
    kernels, errors = [], []
    pool = Pool(args.workers) if args.workers else shared_pool()
    try:
        for record in records:
            try:
                reports = compile_space(bundle.natives, record, target, pool, budget=args.budget)
            except PortkernError as exc:  # one kernel's failure: reported, the others are still compiled
                errors.append(_error(record.name, exc))
                continue
            kernels.append({"kernel": record.name, "dispatches": [r.to_dict() for r in reports]})
    finally:
        if args.workers:
            pool.close()
    data = {"json_format": JSON_FORMAT, "device": target.label, "compile_only": True, "ok": not errors, "kernels": kernels, "errors": errors}

    def render(out):
        rows = []
        for kernel in kernels:
            for d in kernel["dispatches"]:
                reasons: dict[str, int] = {}
                for failure in d["failures"]:
                    reasons[failure["reason"]] = reasons.get(failure["reason"], 0) + 1
                why = "; ".join(f"{n}x {reason}" for reason, n in sorted(reasons.items(), key=lambda item: -item[1]))
                rows.append([kernel["kernel"], d["index"], d["candidates"], d["compiled"], d["duplicates"], d["failed"], "; ".join(filter(None, [d["note"], why]))])
        columns = ["kernel", "dispatch", "candidates", "compiled", "duplicates", "failed", "notes and failure reasons"]
        out.print(table(f"compile-only tuning space on {target.label} (candidate 0: the compiler's default; nothing stored)", columns, rows))
        for e in errors:
            out.print(f"[red]{e['kernel']}: not compiled: {e['type']}: {e['message']}[/red]")

    return Report(data, render, status=1 if errors else 0)


def _error(kernel: str, exc: PortkernError) -> dict:
    """A kernel's tuning failure as JSON: kernel, dispatch (when one failed) and the typed reason."""
    return {
        "kernel": kernel,
        "dispatch": exc.dispatch if isinstance(exc, DispatchTuningError) else None,
        "type": type(exc).__name__,
        "message": one_line(exc.reason if isinstance(exc, DispatchTuningError) else exc),
    }


def parse_shapes(items: list[str]) -> list[dict[str, tuple[int, ...]]]:
    """`--shapes a=1x256,64x256 --shapes b=...` as one {argument: shape} per call."""
    lists: dict[str, list[tuple[int, ...]]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip() or not text.strip():
            raise TuningError(f"--shapes {item!r}: expected ARG=SHAPE[,SHAPE...], e.g. a=1x256,64x256")
        try:
            shapes = [tuple(int(d) for d in part.strip().split("x")) if part.strip() not in ("", "scalar") else () for part in text.split(",")]
        except ValueError:
            raise TuningError(f"--shapes {item!r}: a shape is sizes joined by x, e.g. 64x256") from None
        if name.strip() in lists:
            raise TuningError(f"--shapes names {name.strip()!r} twice")
        lists[name.strip()] = shapes
    counts = {len(v) for v in lists.values()} - {1}
    if len(counts) > 1:
        raise TuningError(f"--shapes: arguments list different numbers of shapes ({', '.join(f'{k}: {len(v)}' for k, v in lists.items())})")
    calls = max(counts, default=1)
    return [{name: shapes[i if len(shapes) > 1 else 0] for name, shapes in lists.items()} for i in range(calls)]


def _tune_shapes(args: argparse.Namespace, bundle, records, target) -> Report:
    """`portkern tune --shapes`: per-bucket tuning of kernels with dynamic dimensions."""
    from portkern.tuner.session import Tuner, tune_kernel_shapes

    shapes = parse_shapes(args.shapes)
    if not args.kernel:
        raise TuningError("--shapes needs --kernel: the shapes belong to one kernel's arguments")
    found = []
    with Tuner(workers=args.workers) as tuner, _progress(disabled=args.json) as show:
        for record in records:
            found += tune_kernel_shapes(
                bundle.natives, record, target, args.strategy, shapes, tuner=tuner, budget=args.budget, time_limit=args.time_limit,
                retune=args.retune, progress=show,
            )
    buckets = [{k: v for k, v in r.to_dict().items() if k != "tuning"} for r in found]
    data = {"json_format": JSON_FORMAT, "device": target.label, "strategy": args.strategy, "ok": True, "buckets": buckets, "errors": []}

    def render(out):
        rows = [
            [
                r.kernel, r.bucket, ", ".join(f"{k}={v}" for k, v in r.values.items()), _ms(r.default_s),
                _ms(r.best_s), r.code, _ms(r.bucket_s), r.bucket_config if r.bucket_config != "default" else "dynamic default", r.config,
            ]
            for r in found
        ]
        columns = ["kernel", "bucket", "tuned for", "dynamic ms", "specialised ms", "these sizes run", "tuned dynamic ms", "other sizes run", "tuned config"]
        out.print(table(f"{args.strategy} tuning per shape bucket on {target.label}", columns, rows))

    return Report(data, render)


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.3f}" if seconds else "-"


def _speedup(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


class _progress:
    """A rich progress bar per searched dispatch on stderr, fed by `Progress` events."""

    def __init__(self, disabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console(stderr=True), disable=disabled, transient=False,
        )
        self.tasks: dict[tuple[str, str], TaskID] = {}

    def __enter__(self):
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def __call__(self, event) -> None:
        key = (event.kernel, event.dispatch)
        if key not in self.tasks:
            self.tasks[key] = self.bar.add_task(f"{event.kernel} dispatch {event.dispatch}", total=event.planned)
        failed = "" if event.evaluation.ok else f" [dim]({event.evaluation.status})[/dim]"
        self.bar.update(self.tasks[key], completed=event.done, total=max(event.planned, event.done),
                        description=f"{event.kernel} dispatch {event.dispatch}{failed}")
