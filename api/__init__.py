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
    from portkern.jit.loader import LoadedBundle

__version__ = "0.1.0"


def load(path, **options) -> "LoadedBundle":
    """Open a bundle on this machine (`portkern.bundle.load`: options `store`, `pool`); its
    kernels' `tune=` is answered by the tuner."""
    from portkern.bundle import load as _load

    return _load(path, **options)
