"""CPU perf configs: IREE `llvm-cpu` tile sizes for one dispatch's root op.

String form `cpu:v1:<distribution>,<vector parallel>,<vector reduction>`, e.g.
`cpu:v1:64x64x0,8x32x0,0x0x4`, one size per loop of the root op (0: not tiled
at that level). It maps to
`#iree_cpu.lowering_config<distribution = [...], vector_common_parallel = [...], vector_reduction = [...]>`.
"""

from __future__ import annotations

from typing import ClassVar, Sequence

from portkern.base.errors import PerfConfigError
from portkern.base.records import frozen_record
from portkern.tuner.perfconfig import (
    VersionedConfig,
    attribute_lists,
    expect_fields,
    format_tiles,
    list_text,
    parse_tiles,
)

#: How a CPU lowering config prints: the dialect attribute the tuner reads and writes.
ATTRIBUTE = "#iree_cpu.lowering_config"
_LEVELS = ("distribution", "vector_common_parallel", "vector_reduction")


@frozen_record
class CpuConfig(VersionedConfig):
    """Tile sizes per loop of a dispatch's root op, at IREE's three CPU tiling levels."""

    family: ClassVar[str] = "cpu"
    version: ClassVar[int] = 1
    tile_fields: ClassVar[tuple[str, ...]] = ("distribution", "vector_parallel", "vector_reduction")

    #: Workgroup tile: the slice of the iteration space one thread task computes.
    distribution: tuple[int, ...]
    #: Vector tile of the parallel loops (0 on reduction loops).
    vector_parallel: tuple[int, ...]
    #: Vector tile of the reduction loops (0 on parallel loops).
    vector_reduction: tuple[int, ...]

    def __post_init__(self) -> None:
        self._freeze_tiles()

    def fields(self) -> list[str]:
        return [format_tiles(self.distribution), format_tiles(self.vector_parallel), format_tiles(self.vector_reduction)]

    @classmethod
    def from_fields(cls, fields: list[str]) -> "CpuConfig":
        expect_fields("cpu", fields, 3)
        return cls(*(parse_tiles(f, level) for f, level in zip(fields, _LEVELS)))

    def lowering_config(self) -> str:
        """The `#iree_cpu.lowering_config<...>` attribute text for the root op."""
        parts = [f"{name} = {list_text(tiles)}" for name, tiles in zip(_LEVELS, self._levels())]
        return f"{ATTRIBUTE}<{', '.join(parts)}>"

    def _levels(self) -> tuple[tuple[int, ...], ...]:
        return (self.distribution, self.vector_parallel, self.vector_reduction)

    @classmethod
    def from_lowering_config(cls, text: str) -> "CpuConfig":
        """The config of a root op's printed `#iree_cpu.lowering_config` (missing levels: zeros)."""
        if not text.startswith(ATTRIBUTE + "<"):
            raise PerfConfigError(f"not a CPU lowering config: {text[:80]!r}")
        lists = attribute_lists(text)
        if "distribution" not in lists:
            raise PerfConfigError(f"CPU lowering config without integer distribution tiles: {text[:120]!r}")
        rank = len(lists["distribution"])
        zeros = (0,) * rank
        return cls(*(lists.get(level, zeros) for level in _LEVELS))


def is_root(lowering_config: str) -> bool:
    """Whether a printed CPU lowering config belongs to a dispatch's root op."""
    return lowering_config.startswith(ATTRIBUTE + "<") and "distribution = " in lowering_config


def follow_root(consumer: str, root_default: CpuConfig, root: CpuConfig, parallel: Sequence[int]) -> str | None:
    """A consumer op's lowering config retiled to follow a new root config, or None to keep it.

    IREE gives the ops fused with the root (fills, epilogues) vector tiles that
    repeat the root's; they follow the new root when they repeat the root's
    default exactly, either over the root's loops or over its parallel loops
    (`parallel`: their indices) only. Their cache-level tiles (`cache_parallel`,
    which IREE adds on AVX2 targets) are dropped with the root's: a written root
    config has none.
    """
    lists = attribute_lists(consumer)
    if set(lists) - {"vector_common_parallel", "vector_reduction", "cache_parallel"} or not consumer.startswith(ATTRIBUTE + "<"):
        return None
    projected_default = tuple(root_default.vector_parallel[i] for i in parallel)
    projected = tuple(root.vector_parallel[i] for i in parallel)
    vector = lists.get("vector_common_parallel")
    if vector == root_default.vector_parallel and lists.get("vector_reduction") in (None, root_default.vector_reduction):
        new = {"vector_common_parallel": root.vector_parallel}
        if "vector_reduction" in lists:
            new["vector_reduction"] = root.vector_reduction
    elif vector == projected_default and "vector_reduction" not in lists:
        new = {"vector_common_parallel": projected}
    else:
        return None
    return f"{ATTRIBUTE}<{', '.join(f'{k} = {list_text(v)}' for k, v in new.items())}>"
