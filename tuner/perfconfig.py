"""Perf configs: what the code generator is told for one dispatch, as data and as a string.

Every family (CPU, AMD GPU, ...) has one frozen dataclass whose string form is
`<family>:v<version>:<field>,<field>,...` (like rocMLIR's `v3:...`): it prints
and parses losslessly, and a wrong field count, unknown family or unknown
version is a `PerfConfigError`. Tile lists print as `64x64x0`.
"""

from __future__ import annotations

import re
from typing import ClassVar, Protocol, Sequence, runtime_checkable

from portkern.base.errors import PerfConfigError

#: Longest perf-config string accepted (they come from caches and command lines).
MAX_CONFIG_CHARS = 1024
#: Largest tile or size value accepted in a config.
MAX_TILE = 1 << 20
#: Most dimensions a tile list may have.
MAX_RANK = 8

_INT = re.compile(r"0|[1-9][0-9]{0,7}")
_TOKEN = re.compile(r"[A-Za-z0-9_]{1,64}")


@runtime_checkable
class PerfConfig(Protocol):
    """A perf config of one target family (`registry.FAMILIES` lists them; `registry.parse` reads the string form)."""

    family: ClassVar[str]
    version: ClassVar[int]

    @property
    def rank(self) -> int:
        """Loops of the root op the config tiles."""
        ...

    def fields(self) -> list[str]: ...

    @classmethod
    def from_fields(cls, fields: list[str]) -> "PerfConfig": ...

    def lowering_config(self) -> str:
        """The root op's lowering-config attribute, as MLIR text."""
        ...


class VersionedConfig:
    """Base of the per-family config dataclasses: `str()` gives the versioned string form."""

    family: ClassVar[str]
    version: ClassVar[int]
    #: The fields holding one tile size per loop of the root op (all of one rank).
    tile_fields: ClassVar[tuple[str, ...]]

    @property
    def rank(self) -> int:
        return len(getattr(self, self.tile_fields[0]))

    def _freeze_tiles(self) -> None:
        """Check the tile fields (bounded, of one rank) and store them as tuples."""
        rank = None
        for name in self.tile_fields:
            tiles = check_tiles(getattr(self, name), name, rank)
            rank = len(tiles)
            object.__setattr__(self, name, tiles)

    def fields(self) -> list[str]:
        raise NotImplementedError

    def __str__(self) -> str:
        return to_string(self)


def to_string(config: PerfConfig | VersionedConfig) -> str:
    """The versioned string form of a perf config."""
    return f"{config.family}:v{config.version}:{','.join(config.fields())}"


def expect_fields(family: str, fields: Sequence[str], count: int) -> None:
    if len(fields) != count:
        raise PerfConfigError(f"{family} perf config needs {count} fields, got {len(fields)}: {','.join(fields)!r}")


def parse_int(text: str, what: str, low: int = 0) -> int:
    if not _INT.fullmatch(text) or not low <= int(text) <= MAX_TILE:
        raise PerfConfigError(f"{what}: {text!r} is not an integer in [{low}, {MAX_TILE}]")
    return int(text)


def parse_tiles(text: str, what: str) -> tuple[int, ...]:
    """`"64x64x0"` -> (64, 64, 0)."""
    parts = text.split("x")
    if not text or len(parts) > MAX_RANK:
        raise PerfConfigError(f"{what}: {text!r} is not a tile list such as 64x64x0 (at most {MAX_RANK} sizes)")
    return tuple(parse_int(p, what) for p in parts)


def format_tiles(tiles: Sequence[int]) -> str:
    return "x".join(str(t) for t in tiles)


def parse_token(text: str, what: str) -> str:
    if not _TOKEN.fullmatch(text):
        raise PerfConfigError(f"{what}: {text!r} is not a name of letters, digits and underscores")
    return text


def check_tiles(tiles: Sequence[int], what: str, rank: int | None = None) -> tuple[int, ...]:
    """Validated tile sizes as a tuple (non-negative, bounded, of the given rank)."""
    values = tuple(tiles)
    if not values or len(values) > MAX_RANK or any(
        isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TILE for v in values
    ):
        raise PerfConfigError(f"{what}: {values!r} must be 1 to {MAX_RANK} integers in [0, {MAX_TILE}]")
    if rank is not None and len(values) != rank:
        raise PerfConfigError(f"{what}: {format_tiles(values)} has {len(values)} sizes, expected {rank}")
    return values


def attribute_lists(text: str) -> dict[str, tuple[int, ...]]:
    """The `name = [1, 2, 3]` integer lists of a printed MLIR attribute."""
    found = {}
    for name, body in re.findall(r"(\w+)\s*=\s*\[([^\[\]]*)\]", text):
        items = [item.strip() for item in body.split(",") if item.strip()]
        if all(re.fullmatch(r"\d+", item) for item in items):
            found[name] = tuple(int(item) for item in items)
    return found


def list_text(values: Sequence[int]) -> str:
    return f"[{', '.join(str(v) for v in values)}]"
