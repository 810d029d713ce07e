"""portkern: build kernels once into a portable bundle, finalise and tune them on each device.

    import portkern
    bundle = portkern.load("model.pkb")
    gemm = bundle.kernel("gemm_bias_relu", device="cpu")
    out = gemm(a, b, bias)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from portkern.base.errors import *  # noqa: F401,F403  (the typed errors are public API)

if TYPE_CHECKING:
    from portkern.cache.store import Store
    from portkern.jit.loader import LoadedBundle

__version__ = "0.1.0"


def load(path, **options) -> "LoadedBundle":
    """Open a bundle on this machine (`portkern.bundle.load`: options `store`, `pool`); its
    kernels' `tune=` is answered by the tuner."""
    from portkern.bundle import load as _load

    return _load(path, **options)


def metrics(store: "Store | None" = None) -> str:
    """The cache's counters in the Prometheus text exposition format, for a server's `/metrics`:
    local and remote-tier lookups, compiles and their seconds, tuning runs and their seconds,
    refusals by reason, and the cache's entries and bytes (`portkern.cache.metrics`). `store`:
    the cache to report (default: the one `portkern.load` uses)."""
    from portkern.cache.metrics import prometheus
    from portkern.cache.store import default_store

    return prometheus(store if store is not None else default_store())
