"""NVIDIA GPU perf configs: IREE's `TileAndFuse` parameters for one `cuda` dispatch.

String form (7 fields; NVIDIA's subgroup (warp) size is always 32)::

    cuda:v1:<workgroup>,<subgroup>,<thread>,<reduction>,<mma>,<workgroup size>,<prefetch>
    cuda:v1:32x128x1,0x0x0,1x16x0,0x0x32,none,32x8x1,0

`mma` is an `#iree_gpu.mma_layout` intrinsic (`NV_MMA_SYNC_...`, `NV_WMMA_...`)
or `none` (SIMT roots, with thread tiles). The fields are `gpu_config.GpuConfig`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from portkern.tuner.gpu_config import GpuConfig
from portkern.tuner.perfconfig import expect_fields, format_tiles, parse_int, parse_tiles, parse_token

WARP_SIZE = 32


@dataclass(frozen=True)
class CudaConfig(GpuConfig):
    """Tiles, matrix intrinsic and launch shape of one NVIDIA GPU dispatch."""

    family: ClassVar[str] = "cuda"
    version: ClassVar[int] = 1
    subgroup_sizes: ClassVar[tuple[int, ...]] = (WARP_SIZE,)

    def fields(self) -> list[str]:
        return [
            format_tiles(self.workgroup), format_tiles(self.subgroup), format_tiles(self.thread), format_tiles(self.reduction),
            self.mma, format_tiles(self.workgroup_size), str(self.prefetch_stages),
        ]

    @classmethod
    def from_fields(cls, fields: list[str]) -> "CudaConfig":
        expect_fields("cuda", fields, 7)
        return cls(
            parse_tiles(fields[0], "workgroup"),
            parse_tiles(fields[1], "subgroup"),
            parse_tiles(fields[2], "thread"),
            parse_tiles(fields[3], "reduction"),
            parse_token(fields[4], "mma"),
            parse_tiles(fields[5], "workgroup_size"),  # type: ignore[arg-type]
            WARP_SIZE,
            parse_int(fields[6], "prefetch_stages"),
        )

    @classmethod
    def from_attributes(cls, lowering_config: str, translation_info: str) -> "CudaConfig":
        """The config of a root op's printed lowering config and its function's translation_info."""
        return cls(**cls.attribute_fields(lowering_config, translation_info))
