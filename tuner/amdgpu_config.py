"""AMD GPU perf configs: IREE's `TileAndFuse` matmul parameters for one dispatch.

String form (8 fields)::

    amdgpu:v1:<workgroup>,<subgroup>,<reduction>,<mma>,<workgroup size>,<subgroup size>,<prefetch>,<waves per EU>
    amdgpu:v1:64x128x0,2x4x0,0x0x16,MFMA_F32_16x16x4_F32,256x1x1,64,2,0

`mma` is an `#iree_gpu.mma_layout` intrinsic or `none`; `waves per EU` 0 leaves
the occupancy hint unset. The tiles map to an `#iree_gpu.lowering_config`; the
sizes, prefetch depth and occupancy hint to the dispatch's `translation_info`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

from portkern.errors import PerfConfigError
from portkern.tuner.perfconfig import (
    VersionedConfig,
    attribute_lists,
    check_tiles,
    expect_fields,
    format_tiles,
    list_text,
    parse_int,
    parse_tiles,
    parse_token,
)

ATTRIBUTE = "#iree_gpu.lowering_config"
TRANSLATION = "#iree_codegen.translation_info"
DEFAULT_PIPELINE = "TileAndFuse"
SUBGROUP_SIZES = (32, 64)
MAX_WORKGROUP_THREADS = 1024
MAX_PREFETCH_STAGES = 8
MAX_WAVES_PER_EU = 10
_MMA_SHAPE = re.compile(r"_(\d+)x(\d+)x(\d+)_")


@dataclass(frozen=True)
class AmdGpuConfig(VersionedConfig):
    """Tiles, matrix intrinsic and launch shape of one AMD GPU dispatch."""

    family: ClassVar[str] = "amdgpu"
    version: ClassVar[int] = 1
    tile_fields: ClassVar[tuple[str, ...]] = ("workgroup", "subgroup", "reduction")

    #: Output tile of one workgroup per loop of the root op (0 on reduction loops).
    workgroup: tuple[int, ...]
    #: Per-subgroup tile, in matrix-intrinsic tiles, per loop (0 on reduction loops).
    subgroup: tuple[int, ...]
    #: Reduction tile per loop (0 on parallel loops).
    reduction: tuple[int, ...]
    #: Matrix intrinsic (`#iree_gpu.mma_layout` name), or "none".
    mma: str
    workgroup_size: tuple[int, int, int]
    #: Wave size: 64 (CDNA) or 32 (RDNA).
    subgroup_size: int
    #: Software pipelining depth of global-to-shared copies (0 or 1: off).
    prefetch_stages: int
    #: `amdgpu-waves-per-eu` occupancy hint; 0 leaves it to the compiler.
    waves_per_eu: int

    def __post_init__(self) -> None:
        self._freeze_tiles()
        parse_token(self.mma, "mma")
        size = check_tiles(self.workgroup_size, "workgroup_size", 3)
        if 0 in size or math.prod(size) > MAX_WORKGROUP_THREADS:
            raise PerfConfigError(f"workgroup_size {format_tiles(size)}: 1 to {MAX_WORKGROUP_THREADS} threads, no zero size")
        object.__setattr__(self, "workgroup_size", size)
        if self.subgroup_size not in SUBGROUP_SIZES:
            raise PerfConfigError(f"subgroup_size {self.subgroup_size!r} is not one of {SUBGROUP_SIZES}")
        if not (isinstance(self.prefetch_stages, int) and 0 <= self.prefetch_stages <= MAX_PREFETCH_STAGES):
            raise PerfConfigError(f"prefetch_stages {self.prefetch_stages!r} is not in [0, {MAX_PREFETCH_STAGES}]")
        if not (isinstance(self.waves_per_eu, int) and 0 <= self.waves_per_eu <= MAX_WAVES_PER_EU):
            raise PerfConfigError(f"waves_per_eu {self.waves_per_eu!r} is not in [0, {MAX_WAVES_PER_EU}]")

    def fields(self) -> list[str]:
        return [
            format_tiles(self.workgroup),
            format_tiles(self.subgroup),
            format_tiles(self.reduction),
            self.mma,
            format_tiles(self.workgroup_size),
            str(self.subgroup_size),
            str(self.prefetch_stages),
            str(self.waves_per_eu),
        ]

    @classmethod
    def from_fields(cls, fields: list[str]) -> "AmdGpuConfig":
        expect_fields("amdgpu", fields, 8)
        return cls(
            parse_tiles(fields[0], "workgroup"),
            parse_tiles(fields[1], "subgroup"),
            parse_tiles(fields[2], "reduction"),
            parse_token(fields[3], "mma"),
            parse_tiles(fields[4], "workgroup_size"),  # type: ignore[arg-type]
            parse_int(fields[5], "subgroup_size"),
            parse_int(fields[6], "prefetch_stages"),
            parse_int(fields[7], "waves_per_eu"),
        )

    def check(self) -> None:
        """Raise PerfConfigError if the launch shape cannot cover the tiles it is given."""
        if self.mma == "none":
            return
        shape = _MMA_SHAPE.search(self.mma)
        dims = [i for i, s in enumerate(self.subgroup) if s]
        if shape is None or len(dims) != 2:
            raise PerfConfigError(f"{self}: expects an MxNxK intrinsic and subgroup tiles on exactly two loops")
        subgroups = 1
        for dim, intrinsic in zip(dims, (int(shape.group(1)), int(shape.group(2)))):
            covered = self.subgroup[dim] * intrinsic
            if self.workgroup[dim] % covered:
                raise PerfConfigError(f"{self}: workgroup tile {self.workgroup[dim]} is not a multiple of {covered}")
            subgroups *= self.workgroup[dim] // covered
        if math.prod(self.workgroup_size) != subgroups * self.subgroup_size:
            raise PerfConfigError(
                f"{self}: the tiles need {subgroups} subgroups of {self.subgroup_size} threads, "
                f"the workgroup has {math.prod(self.workgroup_size)}"
            )

    def lowering_config(self) -> str:
        """The `#iree_gpu.lowering_config<{...}>` attribute text for the root op."""
        entries = []
        if self.mma != "none":
            # IREE's TileAndFuse matmuls stage both operands through shared memory.
            entries += [f"mma_kind = #iree_gpu.mma_layout<{self.mma}>", "promote_operands = [0, 1]"]
        entries += [
            f"reduction = {list_text(self.reduction)}",
            f"subgroup = {list_text(self.subgroup)}",
            f"workgroup = {list_text(self.workgroup)}",
        ]
        return f"{ATTRIBUTE}<{{{', '.join(entries)}}}>"

    def translation_info(self, pipeline: str = DEFAULT_PIPELINE) -> str:
        """The `#iree_codegen.translation_info<...>` attribute text for the dispatch function."""
        options = []
        if self.prefetch_stages:
            options.append(f"gpu_pipeline_options = #iree_gpu.pipeline_options<prefetch_num_stages = {self.prefetch_stages}>")
        if self.waves_per_eu:
            options.append(f'llvm_func_attrs = {{"amdgpu-waves-per-eu" = "{self.waves_per_eu}"}}')
        extra = f", {{{', '.join(options)}}}" if options else ""
        return (
            f"{TRANSLATION}<pipeline = #iree_gpu.pipeline<{parse_token(pipeline, 'pipeline')}> "
            f"workgroup_size = {list_text(self.workgroup_size)} subgroup_size = {self.subgroup_size}{extra}>"
        )

    @classmethod
    def from_attributes(cls, lowering_config: str, translation_info: str) -> "AmdGpuConfig":
        """The config of a root op's printed lowering config and its function's translation_info."""
        if not lowering_config.startswith(ATTRIBUTE + "<") or not translation_info.startswith(TRANSLATION + "<"):
            raise PerfConfigError(f"not an AMD GPU lowering config and translation_info: {lowering_config[:80]!r}")
        lists = {**attribute_lists(translation_info), **attribute_lists(lowering_config)}
        if "workgroup" not in lists or "workgroup_size" not in lists:
            raise PerfConfigError(f"AMD GPU config without workgroup tiles or size: {lowering_config[:120]!r}")
        zeros = (0,) * len(lists["workgroup"])
        mma = re.search(r"mma_layout<(\w+)>", lowering_config)
        subgroup_size = re.search(r"subgroup_size = (\d+)", translation_info)
        prefetch = re.search(r"prefetch_num_stages = (\d+)", translation_info)
        waves = re.search(r'"amdgpu-waves-per-eu" = "(\d+)"', translation_info)
        size = tuple(lists["workgroup_size"]) + (1,) * (3 - len(lists["workgroup_size"]))
        return cls(
            lists["workgroup"],
            lists.get("subgroup", zeros),
            lists.get("reduction", zeros),
            mma.group(1) if mma else "none",
            size,  # type: ignore[arg-type]
            int(subgroup_size.group(1)) if subgroup_size else 64,
            int(prefetch.group(1)) if prefetch else 0,
            int(waves.group(1)) if waves else 0,
        )


def pipeline_of(translation_info: str) -> str:
    """The pipeline name in a printed GPU translation_info (TileAndFuse, VectorDistribute, ...)."""
    match = re.search(r"#iree_gpu\.pipeline<(\w+)>", translation_info)
    return match.group(1) if match else DEFAULT_PIPELINE


def is_root(lowering_config: str) -> bool:
    """Whether a printed GPU lowering config belongs to a dispatch's root op."""
    return lowering_config.startswith(ATTRIBUTE + "<") and "workgroup = " in lowering_config
