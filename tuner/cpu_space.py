"""The CPU search space of one dispatch, generated from the dispatch itself.

Candidates come from the root op's loop ranges, loop kinds and element size
and from the target's vector width; rules measured on IREE 3.13 (AVX-512,
f32) keep out candidates that cannot compile or cannot be better:

- P1: a vector op of `native_vector_size x 512` bytes or more fails to compile
  (LLVMCPUVerifyVectorSizeLegality); a 0 tile means the enclosing tile.
- P2: vector tiles of parallel levels are 0 on reduction loops and vice versa
  (a parallel vector tile on a reduction loop compiles to wrong results).
- P3: a vector tile larger than its distribution tile is clamped to it, a
  duplicate of a smaller candidate.
- P4: on contractions, the lane loop's vector tile is a multiple of the lanes
  and the accumulator tile takes 1/4 to all of the vector registers; other
  vector tiles stay at most 16; distribution tiles divide their loop, are
  multiples of its vector tile and leave at least two workgroups per thread.
- P5: a loop the compiler's default leaves at vector tile 1 (other than the
  lane loop) stays at 1: the pipelines that choose it rely on it (a
  convolution's output rows and window loops are decomposed one at a time).
- P6: attention (`iree_linalg_ext.online_attention`) is two contractions,
  Q.K^T over the head dim (a reduction the default leaves untiled) and then
  .V over the keys (the tiled reduction); P1 holds for the larger one, rows x
  keys x max(lane tile, head dim). Measured on a 8x8x128x32 attention
  (AVX-512): the lane loop whole (the value head dim, 32) and 8 rows ran 1.8x
  faster than the default 8x16; keys tiles of 8-16 beat 1-4. Where the
  default leaves the rows at 1 (AVX2, 16 vector registers), P5 keeps them at
  1 and `quick` varies the keys tiles with the lane loop whole.
- P7: a data-tiled matmul (`linalg.mmt4d`, `linalg.batch_mmt4d`) loops over
  outer tiles (M1, N1, K1) whose inner sizes (M0, N0, K0) the operands'
  encoding fixes. Its vector tiles are the encoding's and stay (an inner tile
  of 4 in an 8x8 encoding fails to compile); its distribution tiles count
  outer tiles, so points, aspect and the cost model take them times the inner
  sizes, over a smaller range of output elements than other roots' (IREE's
  larger defaults ran slower: docs/tuning.md).

The lane loop is the innermost parallel loop whose default vector tile is a
multiple of the lanes, else (reductions such as row sums) such a reduction
loop, else (convolutions tiled below the lane count) the innermost parallel
loop with the largest default vector tile; a root without any vectorised loop
has a distribution-only space.

Search runs in two stages: vector and reduction tiles at the default
distribution (ranked single-threaded, where they decide the speed), then
distribution tiles for the best of those (ranked on the deployed driver).
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

from portkern.base.errors import PerfConfigError
from portkern.base.records import frozen_record
from portkern.tuner.cpu_config import CpuConfig
from portkern.tuner.dispatch import Dispatch
from portkern.tuner.space import Stage

VECTOR_LIMIT_NATIVE_VECTORS = 512
SMALL_TILES = (1, 2, 4, 8, 16)
REDUCTION_TILES = (1, 4, 8, 16, 32)
LANE_MULTIPLES = (1, 2, 4)
MIN_WORKGROUPS_PER_THREAD = 2
#: Distribution tiles cover between 2^11 and 2^15 output points, aspect ratio at most 8.
MIN_TILE_POINTS, MAX_TILE_POINTS, MAX_ASPECT = 1 << 11, 1 << 15, 8
#: Known-good vector shapes for `quick`, as (rows, lane vectors), and reduction tiles.
QUICK_SHAPES = ((8, 2), (4, 4), (16, 1), (16, 2), (8, 4))
QUICK_REDUCTION = (1, 4)
QUICK_DISTRIBUTIONS = 4
#: IREE's attention ops (P6).
ATTENTION_ROOTS = ("iree_linalg_ext.online_attention", "iree_linalg_ext.attention")
#: Data-tiled matmuls (P7): their loop count and the positions of their outer and inner (M, N) loops.
MMT4D_LOOPS = {"linalg.mmt4d": (6, (0, 1), (3, 4)), "linalg.batch_mmt4d": (7, (1, 2), (4, 5))}
#: Their distribution tiles cover between 2^8 and 2^11 output elements (P7).
MMT4D_TILE_POINTS = (1 << 8, 1 << 11)
#: Known-good output tiles (M, N elements) of their distributions for `quick` (P7).
MMT4D_QUICK_TILES = ((16, 24), (16, 48), (32, 48), (32, 24))
#: Known-good attention tiles for `quick`: rows and keys tiles, with the lane loop whole (P6).
ATTENTION_QUICK_ROWS = (8, 4, 16)
ATTENTION_QUICK_KEYS = (8, 16)
L2_BYTES = 1 << 20
REREAD_WEIGHT = 10
ROW_WEIGHT, VECTOR_WEIGHT, SPILL_WEIGHT = 2.3, 0.45, 1.5
REDUCTION_COST = {8: 1.02, 16: 1.04, 32: 1.08}

STAGES = (Stage("vector", "single"), Stage("distribution", "deployed"))


@frozen_record
class CpuSpace:
    """Valid CPU configs of one dispatch; `default` is the compiler's own."""

    dispatch: Dispatch
    threads: int

    stages = STAGES

    @property
    def default(self) -> CpuConfig:
        default = self.dispatch.default
        if not isinstance(default, CpuConfig):
            raise PerfConfigError(f"dispatch {self.dispatch.label}: no CPU default config to search around")
        return default

    @property
    def lanes(self) -> int:
        return max(1, (self.dispatch.native_vector_bytes or 16) // self.dispatch.element_bytes)

    @property
    def registers(self) -> int:
        return 32 if self.dispatch.native_vector_bytes >= 64 else 16

    @functools.cached_property
    def contraction(self) -> bool:
        """A root with reduction loops, a lane loop and at least two vectorised parallel loops (a GEMM,
        a convolution)."""
        d = self.dispatch
        vectorised = [i for i, p in enumerate(d.parallel) if p and self.default.vector_parallel[i]]
        return not all(d.parallel) and len(vectorised) >= 2 and self.lane is not None

    @functools.cached_property
    def attention(self) -> bool:
        """An attention root (P6)."""
        return self.dispatch.root in ATTENTION_ROOTS and self.lane is not None

    @functools.cached_property
    def mmt4d(self) -> bool:
        """A data-tiled matmul root (P7)."""
        loops = MMT4D_LOOPS.get(self.dispatch.root)
        return loops is not None and len(self.dispatch.sizes) == loops[0]

    def _in_elements(self, distribution: Sequence[int]) -> list[int]:
        """The distribution with a data-tiled matmul's outer M and N tiles times the encoding's
        inner sizes, so counted in output elements (P7); other distributions as they are."""
        tiles = list(distribution)
        if self.mmt4d:
            _, outer, inner = MMT4D_LOOPS[self.dispatch.root]
            for o, i in zip(outer, inner):
                tiles[o] *= self.dispatch.sizes[i]
        return tiles

    def _extents(self, distribution: Sequence[int]) -> list[int]:
        """The nonzero distribution tiles in output elements."""
        return [t for t in self._in_elements(distribution) if t]

    def _sides(self, distribution: Sequence[int]) -> list[int]:
        """The extents whose aspect ratio is bounded and whose operands are re-read: a data-tiled
        matmul's M and N in elements (P7), else every nonzero tile."""
        if self.mmt4d:
            tiles = self._in_elements(distribution)
            return [tiles[o] for o in MMT4D_LOOPS[self.dispatch.root][1]]
        return [t for t in distribution if t]

    @functools.cached_property
    def lane(self) -> int | None:
        """The loop vectorised across lanes (see the module docstring), None when no loop is vectorised."""
        d, default = self.dispatch, self.default
        tiles = [default.vector_parallel[i] if p else default.vector_reduction[i] for i, p in enumerate(d.parallel)]
        for wanted in (True, False):
            multiples = [i for i, p in enumerate(d.parallel) if p == wanted and tiles[i] and tiles[i] % self.lanes == 0]
            if multiples:
                return multiples[-1]
        widest = max((tiles[i] for i, p in enumerate(d.parallel) if p), default=0)
        if widest > 1:
            return max(i for i, p in enumerate(d.parallel) if p and tiles[i] == widest)
        return None

    def _lane_dims(self) -> list[int]:
        return [] if self.lane is None else [self.lane]

    def _tile_choices(self, dim: int) -> list[int]:
        d, default = self.dispatch, self.default
        current = default.vector_parallel[dim] if d.parallel[dim] else default.vector_reduction[dim]
        if not current:
            return [0]
        if self.mmt4d:
            return [current]  # P7
        if current == 1 and dim != self.lane:
            return [1]  # P5
        if dim == self.lane:
            values = [self.lanes * k for k in LANE_MULTIPLES] + ([d.sizes[dim]] if self.attention else [])
        elif d.parallel[dim]:
            values = list(SMALL_TILES)
        else:
            values = list(REDUCTION_TILES)
        return sorted({min(v, d.sizes[dim]) for v in values + [current]})

    # --- validity ---------------------------------------------------------

    def prune_reason(self, config: CpuConfig) -> str | None:
        """Why a config is left out (rules P1-P4), None when it is a candidate."""
        d = self.dispatch
        if config.rank != len(d.sizes):
            return "wrong rank"
        for i, parallel in enumerate(d.parallel):
            if parallel and config.vector_reduction[i] or not parallel and (config.vector_parallel[i] or config.distribution[i]):
                return "P2: tile on a loop of the other kind"
            if parallel and config.distribution[i] and config.vector_parallel[i] > config.distribution[i]:
                return "P3: vector tile larger than its distribution tile"
        limit = (d.native_vector_bytes or 16) * VECTOR_LIMIT_NATIVE_VECTORS
        vector = self._vector_elements(config) * d.element_bytes
        if vector >= limit:
            return f"{'P6' if self.attention else 'P1'}: vector of {vector} bytes >= {limit}"
        if self.contraction and not self.mmt4d:  # P7: a data-tiled matmul's register tile is its encoding's
            lane = self._lane_dims()
            vectors = [config.vector_parallel[i] for i, p in enumerate(d.parallel) if p and config.vector_parallel[i]]
            if any(config.vector_parallel[i] % self.lanes for i in lane if config.vector_parallel[i] < d.sizes[i]):
                return "P4: lane tile is not a multiple of the vector lanes"
            accumulators = math.prod(vectors) / self.lanes
            if not self.registers / 4 <= accumulators <= self.registers:
                return f"P4: {accumulators:g} accumulator registers of {self.registers}"
            if any(config.vector_parallel[i] > max(SMALL_TILES) for i in range(len(d.sizes)) if d.parallel[i] and i not in lane):
                return "P4: row tile above 16"
        return self._distribution_reason(config)

    def _vector_elements(self, config: CpuConfig) -> int:
        """Elements of the largest vector op a config makes (P1; for attention, its larger contraction, P6)."""
        d = self.dispatch
        effective = [
            (config.vector_parallel[i] or config.distribution[i] or size) if parallel else (config.vector_reduction[i] or size)
            for i, (size, parallel) in enumerate(zip(d.sizes, d.parallel))
        ]
        lane = self.lane
        if not self.attention or lane is None:  # attention has a lane loop
            return math.prod(effective)
        rows = math.prod(e for i, e in enumerate(effective) if d.parallel[i] and i != lane)
        untiled = [i for i, p in enumerate(d.parallel) if not p and not self.default.vector_reduction[i]]
        keys = math.prod(e for i, e in enumerate(effective) if not d.parallel[i] and i not in untiled)
        head = math.prod(d.sizes[i] for i in untiled)
        return rows * keys * max(effective[lane], head)

    def _distribution_reason(self, config: CpuConfig) -> str | None:
        d = self.dispatch
        if config.distribution == self.default.distribution:
            return None
        for i, tile in enumerate(config.distribution):
            vector = config.vector_parallel[i] or 1
            if tile and (d.sizes[i] % tile or tile % vector):
                return "P4: distribution tile does not divide its loop or its vector tile does not divide it"
        if self.workgroups(config) < min(MIN_WORKGROUPS_PER_THREAD * self.threads, self._max_workgroups(config)):
            return "P4: too few workgroups for the threads"
        return None

    def workgroups(self, config: CpuConfig) -> int:
        return math.prod(math.ceil(s / t) for s, t in zip(self.dispatch.sizes, config.distribution) if t)

    def _max_workgroups(self, config: CpuConfig) -> int:
        return math.prod(s // (v or 1) for s, t, v in zip(self.dispatch.sizes, config.distribution, config.vector_parallel) if t)

    # --- candidates -------------------------------------------------------

    def _vector_configs(self, distribution: tuple[int, ...]) -> list[CpuConfig]:
        d = self.dispatch
        choices = [self._tile_choices(i) for i in range(len(d.sizes))]
        configs = []
        for tiles in _product(choices):
            vector = tuple(t if p else 0 for t, p in zip(tiles, d.parallel))
            reduction = tuple(0 if p else t for t, p in zip(tiles, d.parallel))
            configs.append(CpuConfig(distribution, vector, reduction))
        return self._valid(configs)

    def _valid(self, configs: Sequence[CpuConfig]) -> list[CpuConfig]:
        seen, kept = {self.default}, []
        for config in configs:
            if config not in seen and self.prune_reason(config) is None:
                seen.add(config)
                kept.append(config)
        return kept

    def distributions(self, base: CpuConfig) -> list[CpuConfig]:
        """Every valid distribution for the vector and reduction tiles of `base`."""
        d = self.dispatch
        choices = []
        for i, size in enumerate(d.sizes):
            if not self.default.distribution[i]:
                choices.append([0])
                continue
            step = base.vector_parallel[i] or 1
            choices.append([t for t in range(step, size + 1, step) if size % t == 0])
        least, most = MMT4D_TILE_POINTS if self.mmt4d else (MIN_TILE_POINTS, MAX_TILE_POINTS)
        configs = []
        for tiles in _product(choices):
            points = math.prod(self._extents(tiles))
            sides = self._sides(tiles)
            if not least <= points <= most and tuple(tiles) != self.default.distribution:
                continue
            if len(sides) > 1 and max(sides) > MAX_ASPECT * min(sides):
                continue
            configs.append(CpuConfig(tuple(tiles), base.vector_parallel, base.vector_reduction))
        return self._valid(configs)

    def stage_candidates(self, stage: int, bases: Sequence[CpuConfig]) -> list[CpuConfig]:
        """Every valid candidate of a stage (stage 1 varies the distribution of `bases`)."""
        if stage == 0:
            return self._vector_configs(self.default.distribution)
        return _unique(c for base in bases for c in self.distributions(base))

    def quick_candidates(self, stage: int, bases: Sequence[CpuConfig]) -> list[CpuConfig]:
        """A short list of known-good candidates of a stage."""
        if stage == 1:
            rank = self._mmt4d_quick_rank if self.mmt4d else self.score
            return _unique(c for base in bases for c in sorted(self.distributions(base), key=rank)[:QUICK_DISTRIBUTIONS])
        every = self.stage_candidates(0, ())
        lane = self.lane
        if self.attention and lane is not None:  # attention has a lane loop
            whole = self.dispatch.sizes[lane]
            return _unique(c for rows in self._attention_quick_rows() for keys in ATTENTION_QUICK_KEYS
                           for c in every if self._shape(c, lane) == (rows, whole, keys))
        if not self.contraction or lane is None:  # a contraction has a lane loop
            return sorted(every, key=self._distance)[: len(QUICK_SHAPES)]
        wanted = []
        for rows, vectors in QUICK_SHAPES:
            for k in QUICK_REDUCTION:
                wanted += [c for c in every if self._shape(c, lane) == (rows, vectors * self.lanes, k)]
        return _unique(wanted)

    def _mmt4d_quick_rank(self, config: CpuConfig) -> tuple[float, float]:
        """How far a data-tiled matmul's output tile is from the nearest of MMT4D_QUICK_TILES (in
        powers of two), then its score."""
        sides = self._sides(config.distribution)
        near = min(sum(abs(math.log2(side / good)) for side, good in zip(sides, tile)) for tile in MMT4D_QUICK_TILES)
        return (near, self.score(config))

    def _attention_quick_rows(self) -> tuple[int, ...]:
        """Rows tiles of `quick` attention candidates: ATTENTION_QUICK_ROWS, or 1 where the default
        leaves every rows loop at 1 (P5; IREE does on AVX2), the lane loop whole and the keys tiles still varied."""
        rows = [i for i, p in enumerate(self.dispatch.parallel) if p and i != self.lane]
        if all(self._tile_choices(i) == [1] for i in rows):
            return (1,)
        return ATTENTION_QUICK_ROWS

    def _shape(self, config: CpuConfig, lane: int) -> tuple[int, int, int]:
        """(accumulator rows, lane-loop tile, innermost reduction tile) of a contraction's register tile."""
        rows = math.prod(v for i, v in enumerate(config.vector_parallel) if v and i != lane)
        reduction = [v for v in config.vector_reduction if v]
        return (rows, config.vector_parallel[lane], reduction[-1] if reduction else 0)

    def joint(self) -> list[CpuConfig]:
        """Every valid candidate, vector and distribution tiles varied together."""
        return _unique(c for base in [self.default, *self.stage_candidates(0, ())] for c in [base, *self.distributions(base)] if c != self.default)

    def neighbors(self, config: CpuConfig, pool: Sequence[CpuConfig]) -> list[CpuConfig]:
        """Candidates of `pool` that differ from `config` in one tile, by one step among that
        tile's values in the joint space."""
        steps = self._tile_values
        mine = _tiles(config)
        found = []
        for candidate in pool:
            changed = [(i, a, b) for i, (a, b) in enumerate(zip(_tiles(candidate), mine)) if a != b]
            if len(changed) == 1:
                i, a, b = changed[0]
                if a in steps[i] and b in steps[i] and abs(steps[i].index(a) - steps[i].index(b)) == 1:
                    found.append(candidate)
        return found

    @functools.cached_property
    def _tile_values(self) -> list[list[int]]:
        """Per tile position, the sorted values it takes across the joint space."""
        return [sorted(set(values)) for values in zip(*(_tiles(c) for c in [self.default, *self.joint()]))]

    # --- cost model -------------------------------------------------------

    def score(self, config: CpuConfig) -> float:
        """Estimated relative time (lower is better): register-tile efficiency times load balance."""
        return self._vector_cost(config) * self._parallel_cost(config)

    def _vector_cost(self, config: CpuConfig) -> float:
        """Register-tile cost: rows amortise the B-vector loads, lane vectors amortise the A
        broadcasts, and a tile needing more registers than there are spills. The weights fit
        a single-thread sweep of a 256x384x512 f32 GEMM on AVX-512 to within ~5%."""
        lane = self.lane
        if not self.contraction or lane is None:  # a contraction has a lane loop
            return 1.0 + 0.1 * self._distance(config)
        rows, width, k = self._shape(config, lane)
        vectors = math.ceil(width / self.lanes)
        cost = 1 + ROW_WEIGHT / rows + VECTOR_WEIGHT / vectors
        needed = rows * vectors + vectors + 1
        if needed > self.registers:
            cost *= 1 + SPILL_WEIGHT * (needed - self.registers) / self.registers
        return cost * REDUCTION_COST.get(k, REDUCTION_COST[max(REDUCTION_COST)] if k > max(REDUCTION_COST) else 1.0)

    def _parallel_cost(self, config: CpuConfig) -> float:
        """Load balance over the threads, operand re-reads (smaller tiles re-read more) and
        too few workgroups to even out a busy core."""
        d = self.dispatch
        groups = self.workgroups(config)
        balance = groups / (math.ceil(groups / self.threads) * self.threads)
        tiles = self._sides(config.distribution)
        reuse = 1 + REREAD_WEIGHT * sum(1 / t for t in tiles)
        reduction = math.prod(s for s, p in zip(d.sizes, d.parallel) if not p)
        footprint = (sum(tiles) * reduction + math.prod(tiles)) * d.element_bytes
        return reuse * (1 + 0.25 * self.threads / groups) * (1.2 if footprint > L2_BYTES else 1.0) / balance

    def _distance(self, config: CpuConfig) -> float:
        """How far a config's tiles are from the default's, in powers of two."""
        total = 0.0
        for new, old in zip((*config.vector_parallel, *config.vector_reduction, *config.distribution),
                            (*self.default.vector_parallel, *self.default.vector_reduction, *self.default.distribution)):
            if new and old:
                total += abs(math.log2(new / old))
        return total


def _product(choices: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    import itertools

    return list(itertools.product(*choices))


def _tiles(config: CpuConfig) -> tuple[int, ...]:
    return (*config.distribution, *config.vector_parallel, *config.vector_reduction)


def _unique(configs) -> list:
    return list(dict.fromkeys(configs))

