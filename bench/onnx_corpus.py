"""The outside ONNX corpus through portkern: the onnx package's shipped `pytorch-converted` (82) and
`light` (9) models, each through both intake routes, each run in a fresh process with a fresh cache.

    python bench/onnx_corpus.py [--suites pytorch-converted,light] [--routes manifest,backend]
                                [--models N --seed S] [--filter TEXT] [--jobs J] [--timeout S] [--json FILE]

Routes (`portkern.examples.onnx_corpus`): `manifest` (a manifest naming the shipped `.onnx` file,
`portkern build`, `portkern.load`, the kernel called) and `backend` (`portkern.onnx.prepare(model,
"CPU").run(inputs)`). Every output is compared with onnx's reference at rtol 1e-3, atol 1e-5.
Prints one row per model and route (model, route, built, correct, max error, reason when not
correct), then the tally per suite and route. Exit status 1 when a model is not correct.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from portkern.examples import onnx_corpus as corpus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default=",".join(corpus.SUITES))
    parser.add_argument("--routes", default=",".join(corpus.ROUTES))
    parser.add_argument("--models", type=int, default=None, help="a seeded sample of this many models per suite")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--filter", default="", help="only models whose name contains this text")
    parser.add_argument("--jobs", type=int, default=1, help="models run at the same time (each in its own process)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one model and route may take")
    parser.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    suites = tuple(s for s in args.suites.split(",") if s)
    routes = tuple(r for r in args.routes.split(",") if r)
    unknown = [s for s in suites if s not in corpus.SUITES] + [r for r in routes if r not in corpus.ROUTES]
    if unknown:
        parser.error(f"unknown suite or route: {', '.join(unknown)}")
    if args.models is not None:
        chosen = corpus.sample({s: args.models for s in suites}, args.seed)
    else:
        chosen = corpus.models(suites)
    chosen = [m for m in chosen if args.filter in m.name]
    suite_of = {m.name: m.suite for m in chosen}
    work = [(m, r) for m in chosen for r in routes]
    print(f"{len(chosen)} models x {len(routes)} routes, {args.jobs} at a time", flush=True)
    print(f"{'model':<42} {'route':<9} {'built':<6} {'correct':<8} {'max error':>10}  reason", flush=True)
    rows = []

    def one(item):
        model, route = item
        result = corpus.run(model, route, args.timeout)
        error = "-" if result.max_error is None else f"{result.max_error:.3g}"
        print(
            f"{model.suite + '/' + model.name:<42.42} {route:<9} {'yes' if result.built else 'no':<6} "
            f"{'yes' if result.correct else 'no':<8} {error:>10}  {result.reason[:200]}",
            flush=True,
        )
        return result

    try:
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            rows = list(pool.map(one, work))
    except KeyboardInterrupt:
        print("interrupted: the tally covers the rows above", flush=True)
    tally: Counter = Counter()
    totals: Counter = Counter()
    built: Counter = Counter()
    for row in rows:
        key = (suite_of[row.model], row.route)
        totals[key] += 1
        built[key] += row.built
        tally[key] += row.correct
    print()
    for (suite, route), total in sorted(totals.items()):
        print(f"{suite:<18} {route:<9} correct {tally[(suite, route)]}/{total}  built {built[(suite, route)]}/{total}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**asdict(r), "suite": suite_of[r.model]} for r in rows], f, indent=1)
    return 0 if rows and all(r.correct for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
