"""Where the cache lives and how big it may grow, from the environment.

Mirrors what users know from CUDA's and AMD's JIT caches:

- `PORTKERN_CACHE_DIR`: the directory (default: the platform's user cache dir).
- `PORTKERN_CACHE_DISABLE=1`: no cache at all; every kernel is finalised anew.
- `PORTKERN_CACHE_MAXSIZE`: size budget, e.g. `2GB`, `512MiB`, `1000000` (bytes).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from portkern.errors import CacheError

DEFAULT_MAX_SIZE = 1 << 30
#: A layout version in the path, so an incompatible future layout starts afresh.
LAYOUT = "v1"

_UNITS = {
    "": 1,
    "B": 1,
    "K": 10**3,
    "KB": 10**3,
    "M": 10**6,
    "MB": 10**6,
    "G": 10**9,
    "GB": 10**9,
    "T": 10**12,
    "TB": 10**12,
    "KIB": 1 << 10,
    "MIB": 1 << 20,
    "GIB": 1 << 30,
    "TIB": 1 << 40,
}


@dataclass(frozen=True)
class CacheConfig:
    """Resolved cache settings."""

    directory: Path
    max_size: int
    disabled: bool


def parse_size(text: str) -> int:
    """Bytes in a size such as `2GB`, `512MiB`, `1.5G` or `1000`."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).upper() not in _UNITS:
        raise CacheError(f"cannot read size {text!r} (examples: 2GB, 512MiB, 1000000)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def parse_age(text: str) -> float:
    """Seconds in an age such as `30d`, `12h`, `90m`, `45s`."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", str(text))
    if not match:
        raise CacheError(f"cannot read age {text!r} (examples: 30d, 12h, 90m)")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[match.group(2)]
    return float(match.group(1)) * scale


def default_directory() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("portkern", appauthor=False))


def from_env(directory: str | Path | None = None) -> CacheConfig:
    """Settings from arguments first, then `PORTKERN_CACHE_*`, then defaults."""
    env = os.environ
    base = Path(directory or env.get("PORTKERN_CACHE_DIR") or default_directory())
    disabled = env.get("PORTKERN_CACHE_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")
    max_size = parse_size(env["PORTKERN_CACHE_MAXSIZE"]) if env.get("PORTKERN_CACHE_MAXSIZE") else DEFAULT_MAX_SIZE
    return CacheConfig(base / LAYOUT, max_size, disabled)
