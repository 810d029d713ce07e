"""The dispatches of a configured module: what each computes, its default config, stamping.

A module lowered to `executable-configurations` holds one function per
dispatch with a `translation_info`; inside it, the root op carries the
lowering config that decides the tiling and the ops fused with it carry
configs derived from the root's. This module reads those (shapes, loop kinds,
element sizes, the compiler's default config, a problem key) and writes new
ones on a clone (`stamp`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from portkern.errors import PerfConfigError
from portkern.portable.compiler import operations
from portkern.tuner import amdgpu_config, cpu_config
from portkern.tuner.amdgpu_config import AmdGpuConfig
from portkern.tuner.cpu_config import CpuConfig
from portkern.tuner.kernel_config import KernelConfig
from portkern.tuner.perfconfig import PerfConfig

if TYPE_CHECKING:
    from iree.compiler import ir

PROBLEM_VERSION = 1


@dataclass(frozen=True)
class Dispatch:
    """One dispatch of a kernel, as the tuner sees it."""

    index: int
    #: The dispatch function's symbol (e.g. `k_dispatch_0_matmul_256x384x512_f32`).
    name: str
    #: Perf-config family of its target ("cpu", "amdgpu"), "" when unknown.
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
    default: PerfConfig | None
    #: What the dispatch computes (op kinds, indexing maps, types): the tuning DB's problem key.
    problem: str
    #: The target's native vector width in bytes (CPU), 0 when not stated.
    native_vector_bytes: int
    #: Why the dispatch cannot be tuned; "" when it can.
    reason: str = ""
    #: Some loop range is dynamic: the dispatch is not searched, but takes a config stamped on
    #: it (one tuned on the kernel specialised to a shape bucket's sizes, `tuner.buckets`).
    dynamic: bool = False

    @property
    def tunable(self) -> bool:
        return not self.reason and not self.dynamic

    @property
    def work(self) -> int:
        """Points in the root op's iteration space (a size measure for ranking dispatches)."""
        return math.prod(self.sizes) if self.sizes else 0

    @property
    def label(self) -> str:
        return f"{self.index}:{self.name}"


def _functions(module) -> Iterator[tuple[object, str]]:
    """(dispatch function, printed executable target) pairs in module order."""
    target = ""
    for op in operations(module):
        if op.name == "hal.executable.variant":
            target = str(op.attributes["target"]) if "target" in op.attributes else ""
        elif op.name == "func.func" and "translation_info" in op.attributes:
            yield op, target


def _configured_ops(function) -> list:
    return [op for op in operations(function) if "lowering_config" in op.attributes]


def _is_root(text: str) -> bool:
    return cpu_config.is_root(text) or amdgpu_config.is_root(text)


def _family(target: str, configs: list[str]) -> str:
    if any(c.startswith(cpu_config.ATTRIBUTE + "<") for c in configs):
        return "cpu"
    if any(c.startswith(amdgpu_config.ATTRIBUTE + "<") for c in configs) and '"rocm"' in target:
        return "amdgpu"
    return ""


def _symbol(function) -> str:
    return str(function.attributes["sym_name"]).strip('"')


def _loops(op) -> tuple[tuple[int, ...], tuple[bool, ...], int]:
    """Loop ranges (0 where dynamic), loop kinds and largest element size of a linalg op, from its indexing maps."""
    from iree.compiler import ir
    from iree.compiler.dialects import linalg

    maps = [ir.AffineMapAttr(m).value if not isinstance(m, ir.AffineMap) else m for m in linalg.get_indexing_maps(op)]
    operands = list(op.operands)
    if not maps or len(maps) != len(operands):
        raise PerfConfigError(f"{op.name}: indexing maps do not match its operands")
    rank = maps[0].n_dims
    sizes: list[int | None] = [None] * rank
    in_output = [False] * rank
    element_bytes = 1
    outputs = len(op.results)
    for position, (amap, operand) in enumerate(zip(maps, operands)):
        shaped = operand.type
        if not isinstance(shaped, ir.ShapedType):
            continue
        element_bytes = max(element_bytes, (getattr(shaped.element_type, "width", 32) + 7) // 8)
        for expr, extent in zip(amap.results, shaped.shape):
            if isinstance(expr, ir.AffineDimExpr):
                static = extent != ir.ShapedType.get_dynamic_size()
                sizes[expr.position] = max(sizes[expr.position] or 0, extent if static else 0)
                if position >= len(operands) - outputs:
                    in_output[expr.position] = True
    if any(s is None for s in sizes):
        raise PerfConfigError(f"{op.name}: a loop range is not given by any operand")
    return tuple(sizes), tuple(in_output), element_bytes  # type: ignore[arg-type]


def _describe(op) -> str:
    from iree.compiler.dialects import linalg

    try:
        maps = ",".join(str(m) for m in linalg.get_indexing_maps(op))
    except Exception:  # noqa: BLE001 - not a linalg op: its types still describe it
        maps = ""
    types = ",".join(str(o.type) for o in op.operands)
    results = ",".join(str(r.type) for r in op.results)
    return f"{op.name}[{maps}]({types})->({results})"


def _native_vector_bytes(target: str) -> int:
    match = re.search(r"native_vector_size = (\d+)", target)
    return int(match.group(1)) if match else 0


def _default_config(family: str, root_text: str, translation: str) -> PerfConfig:
    if family == "cpu":
        return CpuConfig.from_lowering_config(root_text)
    return AmdGpuConfig.from_attributes(root_text, translation)


def dispatches(module) -> list[Dispatch]:
    """The dispatches of a module at `executable-configurations`, in module order."""
    found = []
    for index, (function, target) in enumerate(_functions(module)):
        ops = _configured_ops(function)
        texts = [str(op.attributes["lowering_config"]) for op in ops]
        is_root = [_is_root(text) for text in texts]
        roots = [op for op, flag in zip(ops, is_root) if flag]
        family = _family(target, texts)
        problem = f"dispatch/v{PROBLEM_VERSION} " + " ; ".join(
            ("*" if flag else "") + _describe(op) for op, flag in zip(ops, is_root)
        )
        fields = dict(
            index=index, name=_symbol(function), family=family, root="", sizes=(), parallel=(), element_bytes=4,
            default=None, problem=problem, native_vector_bytes=_native_vector_bytes(target),
        )
        if not family:
            found.append(Dispatch(**fields, reason="no lowering config of a family the tuner knows"))
            continue
        if len(roots) != 1:
            found.append(Dispatch(**fields, reason=f"{len(roots)} root ops (expected one)"))
            continue
        root = roots[0]
        try:
            sizes, parallel, element_bytes = _loops(root)
            default = _default_config(family, str(root.attributes["lowering_config"]), str(function.attributes["translation_info"]))
            if default.rank != len(sizes):
                raise PerfConfigError(f"default config has {default.rank} loops, the root op {len(sizes)}")
        except PerfConfigError as exc:
            found.append(Dispatch(**{**fields, "root": root.name}, reason=str(exc)))
            continue
        found.append(
            Dispatch(**{**fields, "root": root.name, "sizes": sizes, "parallel": parallel, "element_bytes": element_bytes, "default": default,
                        "dynamic": 0 in sizes})
        )
    return found


def stamp(module, config: KernelConfig, context: "ir.Context"):
    """A clone of `module` with `config` written on its dispatches (the module is not changed)."""
    from iree.compiler import ir

    clone = getattr(module, "operation", module).clone()
    if config.is_default:
        return clone
    found = {d.index: d for d in dispatches(clone)}
    functions = [function for function, _ in _functions(clone)]
    for index, perf in config:
        dispatch = found.get(index)
        if dispatch is None:
            raise PerfConfigError(f"config names dispatch {index}, the kernel has {len(functions)}")
        if dispatch.reason:
            raise PerfConfigError(f"dispatch {dispatch.label} cannot take a config: {dispatch.reason}")
        if perf.family != dispatch.family or perf.rank != len(dispatch.sizes):
            raise PerfConfigError(
                f"dispatch {dispatch.label} needs a {dispatch.family} config over {len(dispatch.sizes)} loops, got {perf}"
            )
        function = functions[index]
        try:
            _write(function, dispatch, perf, context, ir)
        except ir.MLIRError as exc:
            raise PerfConfigError(f"dispatch {dispatch.label}: the compiler rejects {perf}: {exc}") from None
    return clone


def _write(function, dispatch: Dispatch, perf: PerfConfig, context, ir) -> None:
    for op in _configured_ops(function):
        text = str(op.attributes["lowering_config"])
        if _is_root(text):
            new = perf.lowering_config()
        elif isinstance(perf, CpuConfig):
            parallel = [i for i, p in enumerate(dispatch.parallel) if p]
            new = cpu_config.follow_root(text, dispatch.default, perf, parallel)
        else:
            new = None
        if new is not None:
            op.attributes["lowering_config"] = ir.Attribute.parse(new, context)
    if isinstance(perf, AmdGpuConfig):
        translation = str(function.attributes["translation_info"])
        pipeline = amdgpu_config.pipeline_of(translation)
        function.attributes["translation_info"] = ir.Attribute.parse(perf.translation_info(pipeline), context)
