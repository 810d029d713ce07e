"""Where the cache lives and how big it may grow, from the environment.

Mirrors what users know from CUDA's and AMD's JIT caches:

- `PORTKERN_CACHE_DIR`: the directory (default: the platform's user cache dir), or several
  separated by `os.pathsep` (e.g. a read-only cache baked into an image, then a writable one):
  looked up in order, new entries written to the first writable one.
- `PORTKERN_CACHE_DISABLE=1`: no cache at all; every kernel is finalised anew.
- `PORTKERN_CACHE_MAXSIZE`: size budget, e.g. `2GB`, `512MiB`, `1000000` (bytes).

A setting that cannot be read costs one `CacheWarning` and its default, never a
failed `load`.
"""

from __future__ import annotations

import os
import re
import warnings
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

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class CacheWarning(UserWarning):
    """The cache (or one of its entries or settings) could not be used; kernels still run."""


@dataclass(frozen=True)
class CacheConfig:
    """Resolved cache settings."""

    directory: Path
    max_size: int
    disabled: bool
    #: Further directories, looked up after `directory` in this order (see `directories`).
    also: tuple[Path, ...] = ()

    @property
    def directories(self) -> tuple[Path, ...]:
        """Every cache directory, in lookup order."""
        return (self.directory, *self.also)


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


_warned: set[tuple[str, str]] = set()


def setting_warning(name: str, value: str, consequence: str) -> None:
    """Warn once per process about an environment setting that cannot be used as given."""
    if (name, value) not in _warned:
        _warned.add((name, value))
        warnings.warn(f"{name}={value!r} {consequence}", CacheWarning, stacklevel=3)


def env_flag(name: str, default: bool = False) -> bool:
    """A boolean environment variable: 1/0, true/false, yes/no, on/off (any case); unset or empty
    is `default`, anything else is one warning and `default`."""
    raw = os.environ.get(name, "")
    text = raw.strip().lower()
    if not text:
        return default
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    setting_warning(name, raw, f"is not one of {'/'.join(_TRUE)} or {'/'.join(_FALSE)}; ignored ({'on' if default else 'off'})")
    return default


def _max_size() -> int:
    raw = os.environ.get("PORTKERN_CACHE_MAXSIZE", "")
    if not raw.strip():
        return DEFAULT_MAX_SIZE
    try:
        return parse_size(raw)
    except CacheError:
        setting_warning("PORTKERN_CACHE_MAXSIZE", raw, f"is not a size (examples: 2GB, 512MiB, 1000000); using {DEFAULT_MAX_SIZE} bytes")
        return DEFAULT_MAX_SIZE


def _directories(raw: str | None) -> list[Path]:
    if raw is not None and not raw.strip():
        setting_warning("PORTKERN_CACHE_DIR", raw, f"is empty; using the default cache directory {default_directory()}")
    listed = [part for part in (raw or "").split(os.pathsep) if part.strip()]
    return [Path(part) for part in listed] or [default_directory()]


def from_env(directory: str | Path | None = None) -> CacheConfig:
    """Settings from arguments first, then `PORTKERN_CACHE_*`, then defaults. `directory` (or
    `PORTKERN_CACHE_DIR`) may list several directories separated by `os.pathsep`. Never raises:
    unreadable settings warn once and fall back to their defaults."""
    bases = _directories(str(directory)) if directory else _directories(os.environ.get("PORTKERN_CACHE_DIR"))
    first, *rest = (base / LAYOUT for base in bases)
    return CacheConfig(first, _max_size(), env_flag("PORTKERN_CACHE_DISABLE"), tuple(rest))
