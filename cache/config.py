"""Where the cache lives and how big it may grow, from the settings (`portkern.base.settings`).

Mirrors what users know from CUDA's and AMD's JIT caches:

- `PORTKERN_CACHE_DIR`: the directory (default: the platform's user cache dir), or several
  separated by `os.pathsep` (e.g. a read-only cache baked into an image, then a writable one):
  looked up in order, new entries written to the first writable one.
- `PORTKERN_CACHE_DISABLE=1`: no cache at all; every kernel is finalised anew.
- `PORTKERN_CACHE_MAXSIZE`: size budget, e.g. `2GB` (2*10^9 bytes), `512MiB` (512*2^20),
  `1000000` (bytes); below one entry nothing is kept (and it says so).

A setting that cannot be read costs one `SettingWarning` and its default, never a
failed `load`.
"""

from __future__ import annotations

import os
from pathlib import Path

from portkern.base import settings
from portkern.base.records import frozen_record

DEFAULT_MAX_SIZE = settings.DEFAULT_CACHE_MAXSIZE
#: A layout version in the path, so an incompatible future layout starts afresh.
LAYOUT = "v1"


class CacheWarning(UserWarning):
    """The cache (or one of its entries) could not be used; kernels still run."""


@frozen_record
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


def default_directory() -> Path:
    """The user cache directory (`settings.user_dir`)."""
    return settings.user_dir("cache")


def from_env(directory: str | Path | None = None) -> CacheConfig:
    """Settings from arguments first, then `PORTKERN_CACHE_*`, then defaults. `directory` (or
    `PORTKERN_CACHE_DIR`) may list several directories separated by `os.pathsep`. Never raises:
    unreadable settings warn once and fall back to their defaults."""
    listed = str(directory).split(os.pathsep) if directory else settings.cache_dirs()
    bases = [Path(part) for part in listed if part.strip()] or [default_directory()]
    first, *rest = (base / LAYOUT for base in bases)
    return CacheConfig(first, settings.cache_max_size(), settings.cache_disabled(), tuple(rest))
