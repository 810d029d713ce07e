"""The tuning DB: results kept as tuning records ("t") in the per-device store.

Two kinds of record, both written with `Store.put_tuning(problem, device,
compiler, ...)` so that `portkern cache export/import` carries them and an
import can re-derive their keys:

- per dispatch, for the problem `problem_key(what it computes, runtime)`: the
  winning perf config of that problem, so any bundle with the same dispatch on
  the same device reuses it;
- per kernel, for the loader's `selection_problem(record, target)`: the kernel
  config string that `bundle.kernel(name)` then uses without searching.

A stored result answers a request when its strategy was at least as thorough
(`strategies.level`) and, unless the request itself is limited (a budget or a
time limit), when its search was complete.
"""

from __future__ import annotations

import time
from typing import Any

from portkern.cache.keys import problem_key
from portkern.cache.store import UNUSABLE, Store
from portkern.jit.target import Target
from portkern.tuner import strategies
from portkern.tuner.dispatch import Dispatch
from portkern.tuner.pool import cores
from portkern.tuner.results import DispatchResult, TuneResult

#: Keys `Store.put_tuning` owns in a record.
_KEY_PARTS = ("problem", "device", "compiler")


def runtime_context(target: Target) -> str:
    """How the target runs code, as far as it changes the best config."""
    return f"driver={target.driver} threads={cores()}"


def dispatch_problem(dispatch: Dispatch, target: Target) -> str:
    return problem_key(dispatch.problem, runtime_context(target))


def satisfies(record: dict[str, Any] | None, strategy: str, limited: bool = False) -> bool:
    """Whether a stored record answers a request for `strategy` (`limited`: the request has its own
    budget or time limit, so an incomplete search of the same thoroughness does)."""
    if not record or not isinstance(record.get("config"), str) or not isinstance(record.get("strategy"), str):
        return False
    if record.get(UNUSABLE):
        return False
    if record.get("complete", True) is not True and not limited:
        return False
    return strategies.level(record["strategy"]) >= strategies.level(strategy)


class TuningDB:
    """Tuning results of one store, for one compiler."""

    def __init__(self, store: Store, compiler: str) -> None:
        self.store = store
        self.compiler = compiler

    def dispatch(self, dispatch: Dispatch, target: Target) -> dict[str, Any] | None:
        return self.store.get_tuning(dispatch_problem(dispatch, target), target.fingerprint, self.compiler)

    def put_dispatch(self, dispatch: Dispatch, target: Target, result: DispatchResult) -> bool:
        fields = {k: v for k, v in result.to_dict().items() if k not in ("index", "name", "source", *_KEY_PARTS)}
        record = {"kind": "dispatch", "device_label": target.label, "created": time.time(), **fields}
        return self.store.put_tuning(dispatch_problem(dispatch, target), target.fingerprint, self.compiler, record)

    def selection(self, problem: str, target: Target) -> dict[str, Any] | None:
        return self.store.get_tuning(problem, target.fingerprint, self.compiler)

    def put_selection(self, problem: str, target: Target, bundle: str, result: TuneResult) -> bool:
        fields = {k: v for k, v in result.to_dict().items() if k not in ("device", "source", "wall_s", "failed_candidates", *_KEY_PARTS)}
        record = {"kind": "kernel", "bundle": bundle, "device_label": target.label, "created": time.time(), **fields}
        return self.store.put_tuning(problem, target.fingerprint, self.compiler, record)


def result_from_selection(stored: dict[str, Any], kernel: str, device: str) -> TuneResult:
    """The TuneResult a stored kernel selection describes."""
    dispatches = []
    for data in stored.get("dispatches", []):
        if not isinstance(data, dict):
            continue
        try:
            searched = data.get("source") == "search"
            dispatches.append(DispatchResult.from_dict({**data, "source": "db" if searched else data.get("source", "db")}))
        except TypeError:  # a record from another version: the selection itself still holds
            continue
    return TuneResult(
        kernel,
        device,
        str(stored.get("strategy", "")),
        str(stored["config"]),
        "selection",
        dispatches,
        stored.get("default_s"),
        stored.get("best_s"),
    )
