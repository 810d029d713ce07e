"""NVIDIA GPU perf configs: IREE's `TileAndFuse` parameters for one `cuda` dispatch.

String form (7 fields; NVIDIA's subgroup (warp) size is always 32)::

    cuda:v1:<workgroup>,<subgroup>,<thread>,<reduction>,<mma>,<workgroup size>,<prefetch>
    cuda:v1:32x128x1,0x0x0,1x16x0,0x0x32,none,32x8x1,0

`mma` is an `#iree_gpu.mma_layout` intrinsic (`NV_MMA_SYNC_...`, `NV_WMMA_...`)
or `none` (SIMT roots, with thread tiles). The fields are `gpu_config.GpuConfig`'s.
"""

from __future__ import annotations

from typing import ClassVar

from portkern.base.records import frozen_record
from portkern.tuner.gpu_config import GpuConfig
from portkern.tuner.perfconfig import expect_fields, parse_int

WARP_SIZE = 32


@frozen_record
class CudaConfig(GpuConfig):
    """Tiles, matrix intrinsic and launch shape of one NVIDIA GPU dispatch."""

    family: ClassVar[str] = "cuda"
    version: ClassVar[int] = 1
    subgroup_sizes: ClassVar[tuple[int, ...]] = (WARP_SIZE,)

    def fields(self) -> list[str]:
        return [*self.shared_fields(), str(self.prefetch_stages)]

    @classmethod
    def from_fields(cls, fields: list[str]) -> "CudaConfig":
        expect_fields("cuda", fields, 7)
        return cls(**cls.parse_shared(fields), subgroup_size=WARP_SIZE, prefetch_stages=parse_int(fields[6], "prefetch_stages"))

    @classmethod
    def from_attributes(cls, lowering_config: str, translation_info: str) -> "CudaConfig":
        """The config of a root op's printed lowering config and its function's translation_info."""
        return cls(**cls.attribute_fields(lowering_config, translation_info))
