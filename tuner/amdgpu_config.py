"""AMD GPU perf configs: IREE's `TileAndFuse` parameters for one `rocm` dispatch.

String form (9 fields)::

    amdgpu:v2:<workgroup>,<subgroup>,<thread>,<reduction>,<mma>,<workgroup size>,<subgroup size>,<prefetch>,<waves per EU>
    amdgpu:v2:64x128x0,2x4x0,0x0x0,0x0x16,MFMA_F32_16x16x4_F32,256x1x1,64,2,0

`mma` is an `#iree_gpu.mma_layout` intrinsic or `none` (SIMT roots, with thread
tiles); `waves per EU` 0 leaves the occupancy hint unset. The shared fields are
`gpu_config.GpuConfig`'s; v1 (without thread tiles) is no longer read.
"""

from __future__ import annotations

import re
from typing import ClassVar

from portkern.base.errors import PerfConfigError
from portkern.base.records import frozen_record
from portkern.tuner.gpu_config import GpuConfig
from portkern.tuner.perfconfig import expect_fields, parse_int

MAX_WAVES_PER_EU = 10


@frozen_record
class AmdGpuConfig(GpuConfig):
    """Tiles, matrix intrinsic, launch shape and occupancy hint of one AMD GPU dispatch."""

    family: ClassVar[str] = "amdgpu"
    version: ClassVar[int] = 2
    subgroup_sizes: ClassVar[tuple[int, ...]] = (32, 64)

    #: `amdgpu-waves-per-eu` occupancy hint; 0 leaves it to the compiler.
    waves_per_eu: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (isinstance(self.waves_per_eu, int) and 0 <= self.waves_per_eu <= MAX_WAVES_PER_EU):
            raise PerfConfigError(f"waves_per_eu {self.waves_per_eu!r} is not in [0, {MAX_WAVES_PER_EU}]")

    def fields(self) -> list[str]:
        return [*self.shared_fields(), str(self.subgroup_size), str(self.prefetch_stages), str(self.waves_per_eu)]

    @classmethod
    def from_fields(cls, fields: list[str]) -> "AmdGpuConfig":
        expect_fields("amdgpu", fields, 9)
        return cls(
            **cls.parse_shared(fields),
            subgroup_size=parse_int(fields[6], "subgroup_size"),
            prefetch_stages=parse_int(fields[7], "prefetch_stages"),
            waves_per_eu=parse_int(fields[8], "waves_per_eu"),
        )

    def function_attributes(self) -> dict[str, str]:
        return {"llvm_func_attrs": f'{{"amdgpu-waves-per-eu" = "{self.waves_per_eu}"}}'} if self.waves_per_eu else {}

    @classmethod
    def from_attributes(cls, lowering_config: str, translation_info: str) -> "AmdGpuConfig":
        """The config of a root op's printed lowering config and its function's translation_info."""
        fields = cls.attribute_fields(lowering_config, translation_info)
        waves = re.search(r'"amdgpu-waves-per-eu" = "(\d+)"', translation_info)
        return cls(**fields, waves_per_eu=int(waves.group(1)) if waves else 0)
