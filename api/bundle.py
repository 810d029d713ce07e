"""`portkern.load`: a bundle opened with the tuner behind `tune=`.

`jit.loader` opens bundles, plans kernels and serves them, and never tunes. A
bundle opened here answers `tune=` with a strategy that searches through the
tuner (`tuner.session`, imported only when a kernel is tuned: a warm call path
never loads it); the loader then gets native code for the config the tuner chose
and stored. The tuner's worker jobs (reading dispatches, stamping configs) are
registered with the worker pool here, so stored configs compile in any process
that opened its bundles with `portkern.load`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from portkern.jit import loader
from portkern.tuner import jobs

if TYPE_CHECKING:
    from portkern.cache.store import Store
    from portkern.jit.native import NativeCode
    from portkern.jit.target import Target
    from portkern.jit.workers import Pool
    from portkern.portable.bundle import KernelRecord
    from portkern.tuner.results import TuneResult


class SharedTuner:
    """The loader's `Tuning`, answered by the process's shared tuner (`tuner.session`)."""

    def tune(self, natives: "NativeCode", record: "KernelRecord", target: "Target", strategy: str) -> "TuneResult":
        from portkern.tuner import session

        return session.tune_kernel(natives, record, target, strategy=strategy)

    def tune_shapes(self, natives: "NativeCode", record: "KernelRecord", target: "Target", strategy: str, shapes: Sequence) -> list:
        from portkern.tuner import session

        return session.tune_kernel_shapes(natives, record, target, strategy, shapes)


#: What answers `tune=` for bundles opened here.
TUNER = SharedTuner()


def load(path: str | Path, *, store: "Store | None" = None, pool: "Pool | None" = None) -> loader.LoadedBundle:
    """Open and check a bundle (`jit.loader.load`), its `tune=` answered by the tuner."""
    jobs.register()
    return loader.load(path, store=store, pool=pool, tuning=TUNER)
