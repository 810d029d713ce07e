"""The CPU (`llvm-cpu`) family: `CpuConfig`, roots with distribution tiles, fused ops follow the root's vector tile."""

from __future__ import annotations

from portkern.base.errors import PerfConfigError
from portkern.tuner import cpu_config
from portkern.tuner.cpu_config import CpuConfig
from portkern.tuner.cpu_space import CpuSpace
from portkern.tuner.dispatch import Dispatch
from portkern.tuner.family import Family
from portkern.tuner.perfconfig import PerfConfig


class CpuFamily(Family):
    name = "cpu"
    config = CpuConfig

    def is_root(self, lowering_config: str) -> bool:
        return cpu_config.is_root(lowering_config)

    def claims(self, target: str, lowering_configs: list[str]) -> bool:
        return any(c.startswith(cpu_config.ATTRIBUTE + "<") for c in lowering_configs)

    def default_config(self, root_config: str, translation_info: str) -> CpuConfig:
        return CpuConfig.from_lowering_config(root_config)

    def follower_config(self, follower: str, dispatch: Dispatch, config: PerfConfig) -> str | None:
        default = dispatch.default
        if not isinstance(default, CpuConfig) or not isinstance(config, CpuConfig):
            raise PerfConfigError(f"dispatch {dispatch.label}: {config} and its default {default} are not both CPU configs")
        parallel = [i for i, p in enumerate(dispatch.parallel) if p]
        return cpu_config.follow_root(follower, default, config, parallel)

    def space(self, dispatch: Dispatch, threads: int) -> CpuSpace:
        return CpuSpace(dispatch, threads)


FAMILY = CpuFamily()
