"""What the tuner needs to know about one target family: the contract every family module fills.

A family (CPU, AMD GPU, ...) names its perf-config class, says which printed
lowering configs belong to a dispatch's root op, reads the compiler's default
config, rewrites the ops fused with the root (its followers) and the dispatch's
translation info for a new config, and generates the search space. A family
may instead tune whole kernels that are not IREE modules (`claims_kernel`,
`kernel_tuning`: OpenCL kernels with a parameter space). Families are listed
in `registry`; nothing else branches on them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from portkern.jit.target import Target
from portkern.portable.bundle import KernelRecord
from portkern.tuner.dispatch import Dispatch
from portkern.tuner.perfconfig import PerfConfig
from portkern.tuner.space import Space


class Family:
    """Base of the per-family descriptions (one module each, one instance in `registry.FAMILIES`)."""

    #: The family name, as in perf-config strings (`<name>:v<version>:...`).
    name: ClassVar[str]
    #: The perf-config class of this family.
    config: ClassVar[type[PerfConfig]]

    def is_root(self, lowering_config: str) -> bool:
        """Whether a printed lowering config is the one of a dispatch's root op."""
        raise NotImplementedError

    def claims(self, target: str, lowering_configs: list[str]) -> bool:
        """Whether a dispatch of this printed executable target, with these lowering configs, is ours."""
        raise NotImplementedError

    def default_config(self, root_config: str, translation_info: str) -> PerfConfig:
        """The compiler's own config, from the root's printed lowering config and the function's translation info."""
        raise NotImplementedError

    def root_config(self, current: str, config: PerfConfig) -> str:
        """The root op's new lowering config for `config` (its printed current one is `current`)."""
        return config.lowering_config()

    def follower_config(self, follower: str, dispatch: Dispatch, config: PerfConfig) -> str | None:
        """A fused op's new lowering config when the root takes `config`, None to keep its own."""
        return None

    def translation_info(self, translation_info: str, config: PerfConfig) -> str | None:
        """The dispatch function's new translation info for `config`, None to keep it."""
        return None

    def space(self, dispatch: Dispatch, threads: int) -> Space[Any] | None:
        """The search space of a dispatch on a device with `threads` worker threads, None if there is none."""
        return None

    def no_space_reason(self, dispatch: Dispatch) -> str:
        """Why `space` gave None for this dispatch."""
        return f"no {self.name} search space"

    def claims_kernel(self, record: KernelRecord) -> bool:
        """Whether this family tunes the kernel as a whole (`kernel_tuning`) instead of through
        the analysis of its IREE dispatches."""
        return False

    def kernel_tuning(self, natives: Any, record: KernelRecord, target: Target) -> tuple[list[Dispatch], Any]:
        """For a kernel this family claims (of the bundle the `jit.native.NativeCode` `natives`
        serves): its dispatches, and how its configs are compiled and run (a `tuner.evaluate.Candidates`)."""
        raise NotImplementedError
