"""One dispatch of a kernel as the tuner sees it: plain data (no MLIR objects), built by `analysis`."""

from __future__ import annotations

import math
from dataclasses import field

from portkern.base.records import frozen_record, to_plain, wire
from portkern.tuner.perfconfig import PerfConfig


@frozen_record
class Dispatch:
    """One dispatch of a kernel, as the tuner sees it."""

    index: int
    #: The dispatch function's symbol (e.g. `k_dispatch_0_matmul_256x384x512_f32`).
    name: str
    #: Perf-config family of its target ("cpu", "amdgpu", "cuda"), "" when unknown.
    family: str
    #: The root op's name ("linalg.matmul", "linalg.generic", ...), "" without a root.
    root: str
    #: Static loop ranges of the root op (0 for a dynamic range).
    sizes: tuple[int, ...]
    #: Per loop of the root op: True for parallel, False for reduction.
    parallel: tuple[bool, ...]
    #: Largest element size (bytes) among the root op's operands.
    element_bytes: int
    #: The compiler's own config for the root op, None when it cannot be read.
    default: PerfConfig | None = field(metadata=wire(encode=lambda config: str(config) if config is not None else None))
    #: What the dispatch computes (op kinds, indexing maps, types): the tuning DB's problem key.
    problem: str
    #: The target's native vector width in bytes (CPU), 0 when not stated.
    native_vector_bytes: int
    #: Why the dispatch cannot be tuned; "" when it can.
    reason: str = ""
    #: Some loop range is dynamic: the dispatch is not searched, but takes a config stamped on
    #: it (one tuned on the kernel specialised to a shape bucket's sizes, `tuner.buckets`).
    dynamic: bool = False
    #: GPUs: the `#iree_gpu.target<...>` of its executable target (arch, intrinsics, limits); "" otherwise.
    gpu_target: str = ""
    #: The kernel's author asked for it to be tuned (an OpenCL parameter space): strategies never
    #: leave it at its default as insignificant.
    requested: bool = False
    #: For a space that is a list of built points (OpenCL): every point's perf-config string, the default first.
    points: tuple[str, ...] = ()
    #: The places the module's functions dispatch it (`stream.cmd.dispatch` ops; 0 where not counted).
    sites: int = 0
    #: Only the module's initializers dispatch it: it runs once, when the module is loaded, never
    #: in a call (weights transformed or packed); such a dispatch is not tuned (`reason`).
    at_load: bool = False

    @property
    def tunable(self) -> bool:
        return not self.reason and not self.dynamic

    @property
    def work(self) -> int:
        """Points in the root op's iteration space times the places the module dispatches it
        (a size measure for ranking dispatches)."""
        return math.prod(self.sizes) * max(1, self.sites) if self.sizes else 0

    @property
    def label(self) -> str:
        return f"{self.index}:{self.name}"

    def to_dict(self) -> dict:
        """Plain data (what a worker sends back from its analysis)."""
        return to_plain(self)
