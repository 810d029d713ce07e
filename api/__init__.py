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
    """Open a bundle on this machine; see `portkern.jit.loader.load` for options."""
    from portkern.jit.loader import load as _load

    return _load(path, **options)
