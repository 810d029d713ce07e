"""Facts about the running Python interpreter that change what portkern may do in it."""

from __future__ import annotations

import sys


def gil_enabled() -> bool:
    """Whether this interpreter runs Python in one thread at a time (a free-threaded build,
    Python 3.13t and later, may not)."""
    enabled = getattr(sys, "_is_gil_enabled", None)
    return enabled() if enabled is not None else True
