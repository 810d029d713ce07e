"""The tuning DB: the one place tuning records are read and written.

Tuning records are the store's "t" records (`Store.get_tuning`/`put_tuning`: each
record keeps the parts of its key, so `portkern cache export/import` can derive the
key again, and records are shared through the remote tier). For one compiler, by
problem key (formed in `cache.keys`), there are three kinds:

- per dispatch (`keys.dispatch_problem`): the winning perf config for what a
  dispatch computes, reused by any bundle with the same dispatch on the same device;
- per kernel (`keys.selection_problem`): the kernel config `bundle.kernel(name)`
  uses without searching (the kernel's selection), set aside when it does not build;
  an OpenCL kernel's is keyed by its launch description and stages too
  (`keys.opencl_space`), so bundles built from one `.cl` source with other parameter
  spaces (or none) never read, nor set aside, each other's selection;
- per kernel with dynamic dimensions (`keys.index_problem`): what tuning decided
  for each shape bucket.

The tuner writes them; the loader reads selections and bucket decisions.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any, Mapping

from portkern.cache.device import DeviceFingerprint
from portkern.cache.keys import index_problem, tuning_key
from portkern.cache.store import UNUSABLE, Store

__all__ = ["TuningDB", "UNUSABLE"]

#: Fields `Store.put_tuning` owns in a record (the parts of its key).
_KEY_PARTS = ("problem", "device", "compiler")


def _fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if k not in _KEY_PARTS}


class TuningDB:
    """The tuning records of one store, for one compiler (`NativeCode`'s `compiler_id`)."""

    def __init__(self, store: Store, compiler: str) -> None:
        self.store = store
        self.compiler = compiler

    def lock(self, problem: str, device: DeviceFingerprint) -> AbstractContextManager[object]:
        """A cross-process lock for tuning `problem` on `device`, so concurrent processes search it once."""
        return self.store.lock(tuning_key(problem, device, self.compiler))

    # --- per dispatch ---------------------------------------------------------------

    def dispatch(self, problem: str, device: DeviceFingerprint) -> dict[str, Any] | None:
        """The stored result for a dispatch's problem (`keys.dispatch_problem`), if any."""
        return self.store.get_tuning(problem, device, self.compiler)

    def put_dispatch(self, problem: str, device: DeviceFingerprint, label: str, fields: Mapping[str, Any]) -> bool:
        """Store a dispatch's result (`fields`: its config, strategy, timings, ...) for the device labelled `label`."""
        record = {"kind": "dispatch", "device_label": label, "created": time.time(), **_fields(fields)}
        return self.store.put_tuning(problem, device, self.compiler, record)

    # --- per kernel -------------------------------------------------------------------

    def selection(self, problem: str, device: DeviceFingerprint) -> dict[str, Any] | None:
        """A kernel's stored selection (`keys.selection_problem`), usable or not."""
        return self.store.get_tuning(problem, device, self.compiler)

    def put_selection(self, problem: str, device: DeviceFingerprint, label: str, bundle: str, fields: Mapping[str, Any]) -> bool:
        """Store a kernel's selection (`fields`: its config, strategy, dispatches, timings, ...)."""
        record = {"kind": "kernel", "bundle": bundle, "device_label": label, "created": time.time(), **_fields(fields)}
        return self.store.put_tuning(problem, device, self.compiler, record)

    def chosen(self, problem: str, device: DeviceFingerprint) -> tuple[str, bool] | None:
        """The config a kernel's stored selection names and whether its calls run on the task
        executor whatever their size (`executor`), unless it is marked unusable (None: no usable selection)."""
        stored = self.selection(problem, device) or {}
        config = stored.get("config")
        return (config, stored.get("executor") is True) if isinstance(config, str) and not stored.get(UNUSABLE) else None

    def set_aside(self, problem: str, device: DeviceFingerprint, config: str, reason: str) -> bool:
        """Mark a kernel's stored selection unusable (`reason`) if it still names `config`; True when marked."""
        stored = self.selection(problem, device)
        if stored is None or stored.get("config") != config:
            return False
        return self.store.put_tuning(problem, device, self.compiler, {**stored, UNUSABLE: reason})

    # --- per bucket of a kernel with dynamic dimensions -----------------------------------

    def buckets(self, selection: str, device: DeviceFingerprint) -> dict[str, Any] | None:
        """The stored bucket decisions of a kernel (`selection`: its `keys.selection_problem`):
        {"kernel": name, "buckets": {label: decision}}, or None."""
        return self.store.get_tuning(index_problem(selection), device, self.compiler)

    def put_buckets(self, selection: str, device: DeviceFingerprint, kernel: str, buckets: Mapping[str, Any]) -> bool:
        """Store a kernel's bucket decisions (label -> decision as plain data)."""
        return self.store.put_tuning(index_problem(selection), device, self.compiler, {"kernel": kernel, "buckets": dict(buckets)})
