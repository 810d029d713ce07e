"""The tuning sweep over every model the project can build: every strategy on every dispatch ends in
a measured result or a stated reason, never an untyped error.

    python bench/tuning_sweep.py [--suites light,pytorch-converted,node,examples] [--budget 1]
                                 [--count N] [--seed S] [--strategies quick,full,...] [--json]

Per suite (the onnx package's `light` and `pytorch-converted` models, a representative set of its
node conformance cases, the project's examples), each model is built into its own bundle (a model
that does not build or load is counted, not tuned). Then, per kernel:

- candidate generation: every strategy's candidate lists for every dispatch (no compiling): a space
  whose candidates all pass its own rules, or the stated reason it has none;
- tuning: every strategy (searching afresh, `--budget` candidates per dispatch) through the real
  compiler and runtime: per dispatch a measured result or a stated reason; per kernel a typed error
  at worst.

It prints the tally (dispatch outcomes, results, reasons by kind, typed errors by type, untyped
errors listed) and exits 1 if any untyped error occurred. `--count N --seed S` takes a seeded
sample of N models per suite. Budget 1 keeps the run to the outcomes, not the speed: the figures
are outcomes, not timings, so a busy machine changes only how long it takes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import portkern
from portkern.base.errors import PortkernError, brief
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.examples import MANIFEST, onnx_models
from portkern.jit import devices
from portkern.portable.builder import build_file
from portkern.tuner import strategies
from portkern.tuner.pool import cores
from portkern.tuner.session import Tuner
from portkern.tuner.sweep import Tally, sweep_bundle, sweep_spaces

SUITES = ("light", "pytorch-converted", "node", "examples")


def models_of(suite: str) -> list[onnx_models.Model]:
    if suite == "light":
        return onnx_models.light_models()
    if suite == "pytorch-converted":
        return onnx_models.pytorch_converted_models()
    if suite == "node":
        return onnx_models.node_models()
    raise ValueError(suite)


def bundles(suite: str, count: int | None, seed: int, work: Path):
    """(name, bundle path or None, why not) per model of a suite, each model in a bundle of its own."""
    if suite == "examples":
        path = work / "examples.pkb"
        build_file(MANIFEST, path)
        yield "examples", path, ""
        return
    models = models_of(suite)
    if count is not None:
        models = onnx_models.seeded_subset(models, count, seed)
    for model in models:
        where = work / suite / model.name
        try:
            path = where / f"{model.name}.pkb"
            build_file(onnx_models.manifest([model], where, model.name), path)
            yield model.name, path, ""
        except PortkernError as exc:
            yield model.name, None, f"{type(exc).__name__}: {brief(exc, lines=None, sep=' ', limit=160)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--strategies", default=",".join(strategies.names()))
    parser.add_argument("--budget", type=int, default=1, help="candidates per dispatch and strategy (default 1)")
    parser.add_argument("--count", type=int, help="a seeded sample of this many models per suite")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    chosen = args.strategies.split(",")
    report: dict = {"budget": args.budget, "strategies": chosen, "suites": {}}
    every_space, every_tune = [], []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="portkern-sweep-") as tmp, Tuner(workers=args.workers) as tuner:
        work = Path(tmp)
        store = Store(CacheConfig(work / "cache", 1 << 34, False))
        target = devices.resolve("cpu", store)
        for suite in args.suites.split(","):
            spaces, tunes, unbuilt, built = [], [], {}, 0
            for name, path, why in bundles(suite, args.count, args.seed, work):
                if path is None:
                    unbuilt[name] = why
                    continue
                try:
                    loaded = portkern.load(path, store=store)
                except PortkernError as exc:
                    unbuilt[name] = f"{type(exc).__name__}: {brief(exc, lines=None, sep=' ', limit=160)}"
                    continue
                built += 1
                spaces += sweep_spaces(loaded, target, cores())
                tunes += sweep_bundle(tuner, loaded, target, chosen, args.budget)
                if not args.json:
                    print(f"{suite}/{name}: {len(tunes)} tuning outcomes so far, {time.perf_counter() - started:.0f} s", file=sys.stderr)
            every_space += spaces
            every_tune += tunes
            report["suites"][suite] = {
                "models_built": built,
                "not_built": unbuilt,
                "candidate_generation": Tally.of(spaces).to_dict(),
                "tuning": Tally.of(tunes).to_dict(),
            }
    report["total"] = {"candidate_generation": Tally.of(every_space).to_dict(), "tuning": Tally.of(every_tune).to_dict()}
    report["wall_s"] = time.perf_counter() - started
    untyped = len(report["total"]["candidate_generation"]["untyped"]) + len(report["total"]["tuning"]["untyped"])
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        print()
    else:
        for suite, data in [*report["suites"].items(), ("TOTAL", report["total"])]:
            print(f"== {suite}" + (f": {data['models_built']} models built, {len(data['not_built'])} not" if "models_built" in data else ""))
            for part in ("candidate_generation", "tuning"):
                t = data[part]
                print(f"  {part}: {t['outcomes']} outcomes, {t['results']} results, {sum(t['reasons'].values())} reasons, "
                      f"{sum(t['errors'].values())} typed errors, {len(t['untyped'])} untyped")
                for kind, n in t["reasons"].items():
                    print(f"    reason {n:5d}  {kind}")
                for kind, n in t["errors"].items():
                    print(f"    error  {n:5d}  {kind}")
                for o in t["untyped"]:
                    print(f"    UNTYPED {o['kernel']} {o['strategy']} {o['dispatch']}: {o['detail']}")
            for name, why in data.get("not_built", {}).items():
                print(f"    not built: {name}: {why}")
        print(f"{report['wall_s']:.0f} s")
    return 1 if untyped else 0


if __name__ == "__main__":
    sys.exit(main())
