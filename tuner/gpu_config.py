"""GPU perf configs: IREE's `TileAndFuse` parameters for one dispatch, shared by the GPU families.

IREE configures a GPU dispatch's root op with an `#iree_gpu.lowering_config`
and the dispatch function with an `#iree_codegen.translation_info`. Two kinds
of root config occur:

- matrix-intrinsic (MMA) roots: `mma_kind`, `promote_operands`, `workgroup`,
  `subgroup` (in intrinsic tiles) and `reduction` (in intrinsic K steps) tiles;
- SIMT roots (no intrinsic for the operand types): `workgroup`, `thread` and
  `reduction` (in elements) tiles.

`GpuConfig` holds both (unused tile levels are all 0) plus the launch shape and
prefetch depth; each family (`amdgpu_config`, `cuda_config`) fixes its string
form. Writing a config replaces only the entries it owns: the other entries
of the compiler's attributes (e.g. `convert_acc_gemm`,
`no_reduce_shared_memory_bank_conflicts`) are kept.
"""

from __future__ import annotations

import math
import re
from typing import ClassVar

from portkern.base.errors import PerfConfigError
from portkern.base.records import frozen_record
from portkern.tuner.perfconfig import VersionedConfig, attribute_lists, check_tiles, format_tiles, list_text, parse_tiles, parse_token

ATTRIBUTE = "#iree_gpu.lowering_config"
TRANSLATION = "#iree_codegen.translation_info"
DEFAULT_PIPELINE = "TileAndFuse"
MAX_WORKGROUP_THREADS = 1024
MAX_PREFETCH_STAGES = 8
#: Lowering-config entries a GPU config writes (others of the compiler's attribute are kept).
OWNED_ENTRIES = ("mma_kind", "promote_operands", "reduction", "subgroup", "thread", "workgroup")
_MMA_SHAPE = re.compile(r"_(\d+)x(\d+)x(\d+)_")


def mma_shape(mma: str) -> tuple[int, int, int] | None:
    """(M, N, K) of a single-block intrinsic name such as `MFMA_F32_16x16x4_F32`, None otherwise."""
    match = _MMA_SHAPE.search(f"{mma}_")
    if match is None or re.search(r"x\d+B_", mma):
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


@frozen_record
class GpuConfig(VersionedConfig):
    """Tiles, matrix intrinsic and launch shape of one GPU dispatch (a family's subclass fixes the strings)."""

    tile_fields: ClassVar[tuple[str, ...]] = ("workgroup", "subgroup", "thread", "reduction")
    subgroup_sizes: ClassVar[tuple[int, ...]] = (32, 64)

    #: Tile of one workgroup per loop of the root op.
    workgroup: tuple[int, ...]
    #: MMA roots: per-subgroup tile in intrinsic tiles per loop (0: not tiled); zeros for SIMT roots.
    subgroup: tuple[int, ...]
    #: SIMT roots: per-thread tile in elements per loop (0: not tiled); zeros for MMA roots.
    thread: tuple[int, ...]
    #: Reduction tile per loop (0 on parallel loops): intrinsic K steps for MMA roots, elements for SIMT roots.
    reduction: tuple[int, ...]
    #: Matrix intrinsic (`#iree_gpu.mma_layout` name), or "none" for SIMT roots.
    mma: str
    workgroup_size: tuple[int, int, int]
    subgroup_size: int
    #: Software pipelining depth of global-to-shared copies (0: not stated, the compiler's choice).
    prefetch_stages: int

    def __post_init__(self) -> None:
        self._freeze_tiles()
        parse_token(self.mma, "mma")
        size = check_tiles(self.workgroup_size, "workgroup_size", 3)
        if 0 in size or math.prod(size) > MAX_WORKGROUP_THREADS:
            raise PerfConfigError(f"workgroup_size {format_tiles(size)}: 1 to {MAX_WORKGROUP_THREADS} threads, no zero size")
        object.__setattr__(self, "workgroup_size", size)
        if self.subgroup_size not in self.subgroup_sizes:
            raise PerfConfigError(f"subgroup_size {self.subgroup_size!r} is not one of {self.subgroup_sizes}")
        if not (isinstance(self.prefetch_stages, int) and 0 <= self.prefetch_stages <= MAX_PREFETCH_STAGES):
            raise PerfConfigError(f"prefetch_stages {self.prefetch_stages!r} is not in [0, {MAX_PREFETCH_STAGES}]")
        if self.mma != "none" and any(self.thread):
            raise PerfConfigError(f"{self.mma}: an MMA config has subgroup tiles, not thread tiles")

    @classmethod
    def from_fields(cls, fields: list[str]) -> GpuConfig:
        """A config from the fields of its string form (each family's subclass reads its own)."""
        raise NotImplementedError

    @classmethod
    def from_attributes(cls, lowering_config: str, translation_info: str) -> GpuConfig:
        """The config of a root op's printed lowering config and its function's translation_info."""
        raise NotImplementedError

    def shared_fields(self) -> list[str]:
        """The string fields every GPU family starts with: tiles, intrinsic, workgroup size."""
        return [*(format_tiles(getattr(self, name)) for name in self.tile_fields), self.mma, format_tiles(self.workgroup_size)]

    @classmethod
    def parse_shared(cls, fields: list[str]) -> dict:
        """`shared_fields`' values from their strings (the first six fields)."""
        tiles = {name: parse_tiles(text, name) for name, text in zip(cls.tile_fields, fields)}
        return {**tiles, "mma": parse_token(fields[4], "mma"), "workgroup_size": parse_tiles(fields[5], "workgroup_size")}

    @property
    def threads(self) -> int:
        return math.prod(self.workgroup_size)

    def check(self) -> None:
        """Raise PerfConfigError if the launch shape cannot cover the tiles it is given."""
        if self.mma == "none":
            dims = [i for i, t in enumerate(self.thread) if t]
            if not dims:
                raise PerfConfigError(f"{self}: a SIMT config needs thread tiles")
            threads = 1
            for dim in dims:
                if self.workgroup[dim] % self.thread[dim]:
                    raise PerfConfigError(f"{self}: workgroup tile {self.workgroup[dim]} is not a multiple of thread tile {self.thread[dim]}")
                threads *= self.workgroup[dim] // self.thread[dim]
            if threads != self.threads:
                raise PerfConfigError(f"{self}: the tiles need {threads} threads, the workgroup has {self.threads}")
            return
        shape = mma_shape(self.mma)
        dims = [i for i, s in enumerate(self.subgroup) if s]
        if shape is None or len(dims) != 2:
            raise PerfConfigError(f"{self}: expects an MxNxK intrinsic and subgroup tiles on exactly two loops")
        subgroups = 1
        for dim, intrinsic in zip(dims, shape[:2]):
            covered = self.subgroup[dim] * intrinsic
            if self.workgroup[dim] % covered:
                raise PerfConfigError(f"{self}: workgroup tile {self.workgroup[dim]} is not a multiple of {covered}")
            subgroups *= self.workgroup[dim] // covered
        if self.threads != subgroups * self.subgroup_size:
            raise PerfConfigError(f"{self}: the tiles need {subgroups} subgroups of {self.subgroup_size} threads, the workgroup has {self.threads}")

    # --- MLIR attributes -----------------------------------------------------------

    def lowering_config(self, current: str = "") -> str:
        """The root op's `#iree_gpu.lowering_config<{...}>`; entries of `current` this config does not own are kept."""
        entries = {k: v for k, v in _dict_entries(_body(current, ATTRIBUTE)).items() if k not in OWNED_ENTRIES}
        if self.mma != "none":
            entries["mma_kind"] = f"#iree_gpu.mma_layout<{self.mma}>"
            entries["promote_operands"] = "[0, 1]"  # TileAndFuse matmuls stage both operands through shared memory
        entries["reduction"] = list_text(self.reduction)
        if self.mma != "none":
            entries["subgroup"] = list_text(self.subgroup)
        else:
            entries["thread"] = list_text(self.thread)
        entries["workgroup"] = list_text(self.workgroup)
        return f"{ATTRIBUTE}<{{{', '.join(k if v is None else f'{k} = {v}' for k, v in sorted(entries.items()))}}}>"

    def function_attributes(self) -> dict[str, str]:
        """Entries this config adds to the translation info's dictionary (a family's extra hints)."""
        return {}

    def translation_info(self, current: str = "") -> str:
        """The dispatch function's `#iree_codegen.translation_info<...>`: `current`'s pipeline and
        pipeline options, with this config's launch shape and prefetch depth."""
        options = {}
        match = re.search(r"#iree_gpu\.pipeline_options<([^<>]*)>", current)
        if match:
            options = {k: v for k, v in _dict_entries(match.group(1)).items() if k != "prefetch_num_stages"}
        if self.prefetch_stages:
            options = {"prefetch_num_stages": str(self.prefetch_stages), **options}
        extra = {}
        if options:
            extra["gpu_pipeline_options"] = f"#iree_gpu.pipeline_options<{', '.join(f'{k} = {v}' for k, v in options.items())}>"
        extra.update(self.function_attributes())
        tail = f", {{{', '.join(f'{k} = {v}' for k, v in extra.items())}}}" if extra else ""
        return (
            f"{TRANSLATION}<pipeline = #iree_gpu.pipeline<{parse_token(pipeline_of(current), 'pipeline')}> "
            f"workgroup_size = {list_text(self.workgroup_size)} subgroup_size = {self.subgroup_size}{tail}>"
        )

    @classmethod
    def attribute_fields(cls, lowering_config: str, translation_info: str) -> dict:
        """The shared fields of a root op's printed lowering config and its function's translation info."""
        if not lowering_config.startswith(ATTRIBUTE + "<") or not translation_info.startswith(TRANSLATION + "<"):
            raise PerfConfigError(f"not a GPU lowering config and translation_info: {lowering_config[:80]!r}")
        lists = {**attribute_lists(translation_info), **attribute_lists(lowering_config)}
        if "workgroup" not in lists or "workgroup_size" not in lists:
            raise PerfConfigError(f"GPU config without workgroup tiles or size: {lowering_config[:120]!r}")
        zeros = (0,) * len(lists["workgroup"])
        mma = re.search(r"mma_layout<(\w+)>", lowering_config)
        subgroup_size = re.search(r"subgroup_size = (\d+)", translation_info)
        prefetch = re.search(r"prefetch_num_stages = (\d+)", translation_info)
        return dict(
            workgroup=lists["workgroup"],
            subgroup=lists.get("subgroup", zeros),
            thread=lists.get("thread", zeros),
            reduction=lists.get("reduction", zeros),
            mma=mma.group(1) if mma else "none",
            workgroup_size=tuple(lists["workgroup_size"]) + (1,) * (3 - len(lists["workgroup_size"])),
            subgroup_size=int(subgroup_size.group(1)) if subgroup_size else cls.subgroup_sizes[-1],
            prefetch_stages=int(prefetch.group(1)) if prefetch else 0,
        )


def pipeline_of(translation_info: str) -> str:
    """The pipeline name in a printed GPU translation_info (TileAndFuse, VectorDistribute, ...)."""
    match = re.search(r"#iree_gpu\.pipeline<(\w+)>", translation_info)
    return match.group(1) if match else DEFAULT_PIPELINE


def is_root(lowering_config: str) -> bool:
    """Whether a printed GPU lowering config belongs to a dispatch's root op."""
    return lowering_config.startswith(ATTRIBUTE + "<") and "workgroup = " in lowering_config


def _body(text: str, attribute: str) -> str:
    """The `{...}` dictionary body of a printed `attribute<{...}>` ("" when `text` is not one)."""
    prefix = attribute + "<{"
    return text[len(prefix):-2] if text.startswith(prefix) and text.endswith("}>") else ""


def _dict_entries(body: str) -> dict[str, str | None]:
    """`a = 1, b = [2, 3], unit` -> {"a": "1", "b": "[2, 3]", "unit": None}: top-level entries of an
    attribute dictionary body, in order."""
    entries: dict[str, str | None] = {}
    depth, start = 0, 0
    for position, char in enumerate(body + ","):
        if char in "<[({":
            depth += 1
        elif char in ">])}":
            depth -= 1
        elif char == "," and depth == 0:
            item = body[start:position].strip()
            start = position + 1
            if item:
                name, sep, value = item.partition(" = ")
                entries[name.strip()] = value.strip() if sep else None
    return entries
