"""The search space of a GPU dispatch, from the dispatch and its target's limits (`gpu_target`).

Only IREE's `TileAndFuse` roots with one reduction loop are searched; the
space keeps the default's kind of root (MMA roots stay MMA, SIMT roots stay
SIMT) and every loop the default does not tile at the searched levels. Rules
(docs/tuning.md, "GPU search spaces", says which were measured on IREE 3.13):

- G1: workgroup tiles divide their loop (measured: otherwise "op was not bufferized");
  reduction tiles divide the reduction loop.
- G2: MMA roots use an intrinsic the arch has of the default intrinsic's kind
  and operand and accumulator types (single-block `MxNxK` shapes only).
- G3: a workgroup has 1 to 8 subgroups (MMA) or 64 to 512 threads (SIMT),
  never more than the target's thread limit (a choice that bounds the space:
  16 subgroups of 64 compile too).
- G4: accumulators per thread: 8 to 64 (MMA) or 4 to 64 (SIMT) (a choice: more
  compile, but spill registers).
- G5: MMA roots stage both operand tiles (workgroup tile x reduction tile) in
  shared memory: within the target's limit (measured: IREE refuses more, the
  prefetch depth does not count).
- G6: SIMT workgroup sizes are `[subgroup size, threads / subgroup size, 1]`, as IREE's own
  (a choice; SIMT roots keep the default's prefetch depth, which changes nothing in their code).
- G7: MMA prefetch depth 3 only with at most 256 threads (measured: two 512-thread
  depth-3 configs crashed the compiler on gfx942; crashes are contained by the pool).

The compiler's default is candidate 0 and never among the candidates.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import replace
from typing import Sequence

from portkern.base.errors import PerfConfigError
from portkern.tuner.dispatch import Dispatch
from portkern.tuner.gpu_config import GpuConfig, mma_shape
from portkern.tuner.gpu_target import GpuLimits
from portkern.tuner.space import Stage

MMA_SUBGROUP_TILES = (1, 2, 4, 8)
MMA_SUBGROUPS = (1, 2, 4)
MMA_REDUCTION_TILES = (1, 2, 4, 8, 16)
MMA_ACCUMULATORS = (8, 64)
SIMT_THREAD_TILES_OUTER = (1, 2, 4)
SIMT_THREAD_TILES_INNER = (1, 2, 4, 8, 16)
SIMT_THREADS = (64, 128, 256, 512)
SIMT_REDUCTION_TILES = (8, 16, 32, 64)
SIMT_ACCUMULATORS = (4, 64)
PREFETCH_STAGES = (0, 2, 3)
#: Most threads of an MMA workgroup with a prefetch depth above 2 (G7).
MAX_DEEP_PREFETCH_THREADS = 256
MAX_SUBGROUPS = 8
#: Most candidates `joint` returns (the best by the cost model).
MAX_JOINT = 128
#: Candidates in `quick_candidates`.
QUICK = 8
#: Compute units (CUs, SMs) of a mid-size GPU, for the cost model's occupancy.
COMPUTE_UNITS = 64


def no_space_reason(dispatch: Dispatch, limits: GpuLimits) -> str:
    """Why a GPU dispatch has no search space ("" when it has one)."""
    default = dispatch.default
    if not isinstance(default, GpuConfig):
        return "no GPU default config to search around"
    reductions = [i for i, p in enumerate(dispatch.parallel) if not p]
    if len(reductions) != 1:
        return f"{len(reductions)} reduction loops: the GPU space covers contractions (one reduction loop)"
    if not default.reduction[reductions[0]]:
        return "its reduction loop is not tiled by the default (not a contraction): the GPU space covers contractions"
    if default.mma != "none":
        if mma_shape(default.mma) is None or sum(1 for s in default.subgroup if s) != 2:
            return f"default intrinsic {default.mma}: the GPU space needs a single-block MxNxK intrinsic on two loops"
        if default.subgroup_size not in limits.subgroup_sizes:
            return f"subgroup size {default.subgroup_size} is not one the target offers"
    elif not any(default.thread):
        return "the default config has neither an intrinsic nor thread tiles"
    return ""


def _shape(mma: str) -> tuple[int, int, int]:
    """(M, N, K) of an intrinsic of the space (a config's that passed `GpuConfig.check`, or one of `intrinsics`)."""
    shape = mma_shape(mma)
    if shape is None:
        raise PerfConfigError(f"{mma} is not a single-block MxNxK intrinsic")
    return shape


def _signature(mma: str) -> tuple[str, str, str]:
    """An intrinsic's (kind, accumulator type, operand type): `NV_MMA_SYNC_F32_16x8x16_F16` -> ("NV_MMA_SYNC", "F32", "F16")."""
    match = re.fullmatch(r"(\w*?)_?([A-Z0-9]+)_\d+x\d+x\d+_(\w+)", mma)
    return (match.group(1), match.group(2), match.group(3)) if match else ("", "", mma)


class GpuSpace:
    """The valid GPU perf configs of one dispatch (one stage, ranked on the device's own driver)."""

    stages = (Stage("tiles", "deployed"),)

    def __init__(self, dispatch: Dispatch, config_class: type[GpuConfig], limits: GpuLimits) -> None:
        self.dispatch = dispatch
        self.limits = limits
        self.config_class = config_class
        default = dispatch.default
        if not isinstance(default, GpuConfig):
            raise PerfConfigError(f"dispatch {dispatch.label}: no GPU default config to search around")
        self._default = default
        self.reduction_loop = next(i for i, p in enumerate(dispatch.parallel) if not p)
        tiles = self._default.subgroup if self._default.mma != "none" else self._default.thread
        self.tiled = [i for i, t in enumerate(tiles) if t and dispatch.parallel[i]]
        self._all: list[GpuConfig] | None = None

    @property
    def default(self) -> GpuConfig:
        return self._default

    # --- generation ------------------------------------------------------------

    def intrinsics(self) -> list[str]:
        """The default's intrinsic and the arch's others of its kind, operand and accumulator types (G2)."""
        default = self._default.mma
        same = [m for m in self.limits.mma if m != default and mma_shape(m) and _signature(m) == _signature(default)]
        return [default, *same]

    def _generate(self) -> list[GpuConfig]:
        found: dict[str, GpuConfig] = {}
        for config in self._mma() if self._default.mma != "none" else self._simt():
            if config != self._default and self.prune_reason(config) is None:
                found.setdefault(str(config), config)
        return sorted(found.values(), key=self.score)

    def _with(
        self, workgroup: dict[int, int], inner: dict[int, int], reduction: int, workgroup_size: tuple[int, int, int], mma: str, prefetch: int
    ) -> GpuConfig | None:
        d = self._default
        wg, level = list(d.workgroup), list(d.subgroup if mma != "none" else d.thread)
        for dim, size in workgroup.items():
            wg[dim] = size
        for dim, size in inner.items():
            level[dim] = size
        red = list(d.reduction)
        red[self.reduction_loop] = reduction
        subgroup, thread = (tuple(level), d.thread) if mma != "none" else (d.subgroup, tuple(level))
        try:
            return replace(
                d, workgroup=tuple(wg), subgroup=subgroup, thread=thread, reduction=tuple(red),
                workgroup_size=workgroup_size, mma=mma, prefetch_stages=prefetch,
            )
        except PerfConfigError:  # out of the config's own bounds
            return None

    def _mma(self):
        d, sizes = self._default, self.dispatch.sizes
        m, n = self.tiled
        for mma in self.intrinsics():
            im, in_, _ = _shape(mma)
            for sm, sn, wm, wn, r, prefetch in itertools.product(
                MMA_SUBGROUP_TILES, MMA_SUBGROUP_TILES, MMA_SUBGROUPS, MMA_SUBGROUPS, MMA_REDUCTION_TILES, PREFETCH_STAGES
            ):
                wgm, wgn = wm * sm * im, wn * sn * in_
                if sizes[m] % wgm or sizes[n] % wgn:
                    continue
                size = (wm * wn * d.subgroup_size, 1, 1)
                config = self._with({m: wgm, n: wgn}, {m: sm, n: sn}, r, size, mma, prefetch)
                if config is not None:
                    yield config

    def _simt(self):
        d = self._default
        outer, inner = self.tiled[0], self.tiled[-1]
        for to, ti, threads, r, prefetch in itertools.product(
            SIMT_THREAD_TILES_OUTER, SIMT_THREAD_TILES_INNER, SIMT_THREADS, SIMT_REDUCTION_TILES, (d.prefetch_stages,)
        ):
            for inner_threads in (8, 16, 32, 64):
                outer_threads = threads // inner_threads
                if outer_threads < 1 or outer == inner and outer_threads != 1:
                    continue
                workgroup = {outer: outer_threads * to, inner: inner_threads * ti} if outer != inner else {inner: threads * ti}
                thread = {outer: to, inner: ti}
                size = (d.subgroup_size, threads // d.subgroup_size, 1)
                config = self._with(workgroup, thread, r, size, "none", prefetch)
                if config is not None:
                    yield config

    # --- rules -------------------------------------------------------------------

    def prune_reason(self, config) -> str | None:
        """Why a config is not a candidate (the rule it breaks), None when it is."""
        d, sizes, limits = self._default, self.dispatch.sizes, self.limits
        if not isinstance(config, GpuConfig) or type(config) is not type(d) or config.rank != d.rank:
            return f"not a {type(d).__name__} over {d.rank} loops"
        if (config.mma == "none") != (d.mma == "none"):
            return "the default's kind of root (MMA or SIMT) is kept"
        for dim in range(d.rank):
            if dim != self.reduction_loop and config.workgroup[dim] and sizes[dim] % config.workgroup[dim]:
                return f"G1: workgroup tile {config.workgroup[dim]} does not divide loop {dim} ({sizes[dim]})"
        try:
            config.check()
        except PerfConfigError as exc:  # tiles and launch shape disagree
            return f"launch shape: {exc}"
        k_step = _shape(config.mma)[2] if config.mma != "none" else 1
        k_tile = config.reduction[self.reduction_loop] * k_step
        if not k_tile or sizes[self.reduction_loop] % k_tile:
            return f"G1: reduction tile {k_tile} does not divide the reduction loop ({sizes[self.reduction_loop]})"
        if config.threads > limits.max_threads or any(s > m for s, m in zip(config.workgroup_size, limits.max_workgroup_sizes)):
            return f"G3: {config.threads} threads exceed the target's limits"
        if config.mma != "none":
            if config.mma not in self.intrinsics():
                return f"G2: {config.mma} is not an intrinsic of {limits.arch} for these types"
            if config.subgroup_size not in limits.subgroup_sizes:
                return f"G3: subgroup size {config.subgroup_size} is not one {limits.arch} offers"
            if config.threads // config.subgroup_size > MAX_SUBGROUPS:
                return f"G3: more than {MAX_SUBGROUPS} subgroups"
            accumulators = self._accumulators(config)
            if not MMA_ACCUMULATORS[0] <= accumulators <= MMA_ACCUMULATORS[1]:
                return f"G4: {accumulators} accumulators per thread, outside {MMA_ACCUMULATORS}"
            memory = self.shared_memory(config)
            if memory > limits.max_workgroup_memory:
                return f"G5: {memory} bytes of shared memory, {limits.arch} has {limits.max_workgroup_memory}"
            if config.prefetch_stages > 2 and config.threads > MAX_DEEP_PREFETCH_THREADS:
                return f"G7: prefetch depth {config.prefetch_stages} with more than {MAX_DEEP_PREFETCH_THREADS} threads"
        else:
            if config.threads not in SIMT_THREADS or config.threads % d.subgroup_size:
                return f"G3: {config.threads} threads, SIMT workgroups have one of {SIMT_THREADS}"
            if config.workgroup_size != (d.subgroup_size, config.threads // d.subgroup_size, 1):
                return f"G6: workgroup size {config.workgroup_size} is not [subgroup size, threads / subgroup size, 1]"
            accumulators = self._accumulators(config)
            if not SIMT_ACCUMULATORS[0] <= accumulators <= SIMT_ACCUMULATORS[1]:
                return f"G4: {accumulators} accumulators per thread, outside {SIMT_ACCUMULATORS}"
        return None

    def _accumulators(self, config: GpuConfig) -> int:
        if config.mma == "none":
            return math.prod(t for t in config.thread if t)
        im, in_, _ = _shape(config.mma)
        m, n = self.tiled
        return config.subgroup[m] * config.subgroup[n] * im * in_ // config.subgroup_size

    def shared_memory(self, config: GpuConfig) -> int:
        """Bytes of operand tiles an MMA config stages in shared memory (G5)."""
        m, n = self.tiled
        k_tile = config.reduction[self.reduction_loop] * _shape(config.mma)[2]
        return (config.workgroup[m] + config.workgroup[n]) * k_tile * self.dispatch.element_bytes

    # --- the Space protocol ----------------------------------------------------------

    def joint(self) -> list[GpuConfig]:
        """Every valid candidate (at most `MAX_JOINT`, the best by the cost model)."""
        if self._all is None:
            self._all = self._generate()
        return self._all[:MAX_JOINT]

    def stage_candidates(self, stage: int, bases: Sequence[GpuConfig]) -> list[GpuConfig]:
        return self.joint()

    def quick_candidates(self, stage: int, bases: Sequence[GpuConfig]) -> list[GpuConfig]:
        return self.joint()[:QUICK]

    def score(self, config: GpuConfig) -> float:
        """Cost-model estimate of relative time: operand traffic per output, times the waves of
        workgroups the parallel loops make on `COMPUTE_UNITS` compute units against a perfect fill."""
        sizes, parallel = self.dispatch.sizes, self.dispatch.parallel
        m, n = self.tiled[0], self.tiled[-1]
        wgm, wgn = config.workgroup[m] or 1, config.workgroup[n] or 1
        traffic = 1.0 / wgm + 1.0 / wgn  # global loads per output element
        workgroups = max(1, math.prod(s // w for s, w, p in zip(sizes, config.workgroup, parallel) if w and p))
        waves = math.ceil(workgroups / COMPUTE_UNITS) * COMPUTE_UNITS / workgroups  # 1.0: every unit busy to the end
        return traffic * waves + 0.01 * abs(config.prefetch_stages - self._default.prefetch_stages)

    def neighbors(self, config: GpuConfig, pool: Sequence[GpuConfig]) -> list[GpuConfig]:
        """Candidates of `pool` that differ from `config` in one field."""
        mine = config.fields()
        return [c for c in pool if sum(a != b for a, b in zip(c.fields(), mine)) == 1]
