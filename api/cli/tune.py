"""`portkern tune`: find and store the best perf config of a bundle's kernels on a device."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from portkern.cli.common import Report, add_cache_dir, add_json, console, store_from, table
from portkern.errors import TuningError


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
    add_cache_dir(tune)
    add_json(tune)
    tune.set_defaults(handler=run_tune)


def run_tune(args: argparse.Namespace) -> Report:
    import portkern
    from portkern.jit import devices
    from portkern.tuner.session import Tuner

    if args.workers is not None and args.workers < 1:
        raise TuningError("--workers must be at least 1")
    store = store_from(args)
    bundle = portkern.load(args.bundle, store=store)
    names = args.kernel or bundle.names()
    records = [bundle.record(name) for name in names]
    target = devices.resolve(args.device, store)
    if not target.runnable:
        raise TuningError(f"cannot tune for {target.label} here: {target.reason}")
    results = []
    deadline = time.perf_counter() + args.time_limit if args.time_limit else None
    with Tuner(workers=args.workers) as tuner, _progress(disabled=args.json) as show:
        for position, record in enumerate(records):
            time_limit = None
            if deadline is not None:
                time_limit = max(1e-3, (deadline - time.perf_counter()) / (len(records) - position))
            results.append(
                tuner.tune(bundle, record, target, args.strategy, budget=args.budget, time_limit=time_limit, retune=args.retune, progress=show)
            )
    data = [r.to_dict() for r in results]

    def render(out):
        rows = []
        for r in results:
            for d in r.dispatches:
                rows.append([
                    r.kernel, d.index, _ms(d.default_s), _ms(d.best_s), _speedup(d.speedup),
                    d.evaluated, d.failed + d.wrong, d.source, d.config if d.source != "skipped" else d.note,
                ])
        columns = ["kernel", "dispatch", "default ms", "best ms", "speedup", "evaluated", "failed", "from", "best config"]
        out.print(table(f"{args.strategy} tuning on {target.label}", columns, rows))
        for r in results:
            out.print(f"{r.kernel}: {r.config}  ({_ms(r.default_s)} -> {_ms(r.best_s)} ms, {_speedup(r.speedup)}, {r.source}, {r.wall_s:.1f} s)")

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
        self.tasks: dict[tuple[str, str], int] = {}

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
