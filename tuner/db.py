"""The tuning DB: results kept as "t" records in the per-device store.

Two kinds of record:

- per dispatch, keyed by `tuning_key(problem_key(what it computes, runtime),
  device fingerprint, compiler)`: the winning perf config of that problem, so
  any bundle with the same dispatch on the same device reuses it;
- per kernel, keyed by the loader's `selection_key(record, target)`: the
  kernel config string that `bundle.kernel(name)` then uses without searching.

A stored result answers a request when its strategy was at least as thorough
(`strategies.level`). `portkern cache export/import` carries both kinds.
"""

from __future__ import annotations

import time
from typing import Any

from portkern.cache.keys import problem_key, tuning_key
from portkern.cache.store import Store
from portkern.jit.target import Target
from portkern.portable.bundle import KernelRecord
from portkern.tuner import strategies
from portkern.tuner.dispatch import Dispatch
from portkern.tuner.pool import cores
from portkern.tuner.results import DispatchResult, TuneResult

KIND = "t"


def runtime_context(target: Target) -> str:
    """How the target runs code, as far as it changes the best config."""
    return f"driver={target.driver} threads={cores()}"


def dispatch_key(dispatch: Dispatch, target: Target, compiler: str) -> str:
    return tuning_key(problem_key(dispatch.problem, runtime_context(target)), target.fingerprint, compiler)


def satisfies(record: dict[str, Any] | None, strategy: str) -> bool:
    """Whether a stored record answers a request for `strategy`."""
    if not record or not isinstance(record.get("config"), str) or not isinstance(record.get("strategy"), str):
        return False
    return strategies.level(record["strategy"]) >= strategies.level(strategy)


class TuningDB:
    """Tuning results of one store."""

    def __init__(self, store: Store, compiler: str) -> None:
        self.store = store
        self.compiler = compiler

    def dispatch(self, dispatch: Dispatch, target: Target) -> dict[str, Any] | None:
        return self.store.get_record(KIND, dispatch_key(dispatch, target, self.compiler))

    def put_dispatch(self, dispatch: Dispatch, target: Target, result: DispatchResult) -> bool:
        record = {
            "kind": "dispatch",
            "problem": dispatch.problem,
            "runtime": runtime_context(target),
            "device": target.label,
            "compiler": self.compiler,
            "created": time.time(),
            **{k: v for k, v in result.to_dict().items() if k not in ("index", "name", "problem", "source")},
        }
        return self.store.put_record(KIND, dispatch_key(dispatch, target, self.compiler), record)

    def selection(self, key: str) -> dict[str, Any] | None:
        return self.store.get_record(KIND, key)

    def put_selection(self, key: str, record: KernelRecord, bundle: str, result: TuneResult) -> bool:
        stored = {
            "kind": "kernel",
            "kernel": record.name,
            "bundle": bundle,
            "device": result.device,
            "compiler": self.compiler,
            "created": time.time(),
            **{k: v for k, v in result.to_dict().items() if k not in ("kernel", "device", "source", "wall_s")},
        }
        return self.store.put_record(KIND, key, stored)


def result_from_selection(stored: dict[str, Any], kernel: str, device: str) -> TuneResult:
    """The TuneResult a stored kernel selection describes."""
    dispatches = []
    for data in stored.get("dispatches", []):
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
