"""The dispatches of a configured module: what each computes, its default config, stamping.

A module lowered to `executable-configurations` holds one function per
dispatch with a `translation_info`; inside it, the root op carries the
lowering config that decides the tiling and the ops fused with it carry
configs derived from the root's. This module reads those (shapes, loop kinds,
element sizes, the compiler's default config, a problem key) into `Dispatch`
records and writes new configs on a clone (`stamp`); what is family-specific
comes from the family `registry`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Iterator

from portkern.base.errors import PerfConfigError
from portkern.portable.compiler import operations
from portkern.tuner import gpu_target, registry
from portkern.tuner.dispatch import Dispatch
from portkern.tuner.kernel_config import KernelConfig
from portkern.tuner.perfconfig import PerfConfig

if TYPE_CHECKING:
    from iree.compiler import ir

PROBLEM_VERSION = 1
#: How a problem key joins its ops' descriptions, and marks the root op's.
_OPS, _ROOT = " ; ", "*"


def _functions(module) -> Iterator[tuple[ir.Operation, str]]:
    """(dispatch function, printed executable target) pairs in module order."""
    target = ""
    for op in operations(module):
        if op.name == "hal.executable.variant":
            target = str(op.attributes["target"]) if "target" in op.attributes else ""
        elif op.name == "func.func" and "translation_info" in op.attributes:
            yield op, target


def _configured_ops(function) -> list:
    return [op for op in operations(function) if "lowering_config" in op.attributes]


def _symbol(function) -> str:
    return str(function.attributes["sym_name"]).strip('"')


def _indexing_maps(op) -> list:
    """The root op's indexing maps (PerfConfigError when it has none, as `linalg.softmax` has not)."""
    from iree.compiler import ir
    from iree.compiler.dialects import linalg

    try:
        maps = list(linalg.get_indexing_maps(op))
    except (TypeError, ValueError):  # the binding's answer for ops without linalg maps (None: a TypeError)
        if "indexing_maps" not in op.attributes:
            raise PerfConfigError(f"{op.name}: the root op has no indexing maps (not a structured linalg op)") from None
        try:
            maps = list(ir.ArrayAttr(op.attributes["indexing_maps"]))
        except (TypeError, ValueError):
            raise PerfConfigError(f"{op.name}: the root op's indexing maps cannot be read") from None
    try:
        return [m if isinstance(m, ir.AffineMap) else ir.AffineMapAttr(m).value for m in maps]
    except (TypeError, ValueError):
        raise PerfConfigError(f"{op.name}: the root op's indexing maps are not affine maps") from None


def _output_count(op) -> int:
    """How many of the op's operands are outputs (its DPS inits; on buffers the op has no results)."""
    if "operandSegmentSizes" in op.attributes:
        sizes = re.findall(r"-?\d+", str(op.attributes["operandSegmentSizes"]).partition(":")[2])
        if sizes:
            return int(sizes[-1])
    return len(op.results)


def _loop_kinds(op, rank: int, in_output: list[bool]) -> tuple[bool, ...]:
    """Per loop, parallel (True) or reduction: the op's `iterator_types` when it states them,
    else whether the loop indexes an output."""
    if "iterator_types" in op.attributes:
        kinds = re.findall(r"parallel|reduction|window", str(op.attributes["iterator_types"]))
        if len(kinds) == rank:
            return tuple(kind == "parallel" for kind in kinds)
    return tuple(in_output)


def _loops(op) -> tuple[tuple[int, ...], tuple[bool, ...], int]:
    """Loop ranges (0 where dynamic), loop kinds and largest element size of a linalg op, from its indexing maps."""
    from iree.compiler import ir

    maps = _indexing_maps(op)
    operands = list(op.operands)
    if not maps or len(maps) != len(operands):
        raise PerfConfigError(f"{op.name}: indexing maps do not match its operands")
    rank = maps[0].n_dims
    sizes: list[int | None] = [None] * rank
    in_output = [False] * rank
    element_bytes = 1
    outputs = _output_count(op)
    for position, (amap, operand) in enumerate(zip(maps, operands)):
        shaped = operand.type
        if not isinstance(shaped, ir.ShapedType):
            continue
        element_bytes = max(element_bytes, (getattr(shaped.element_type, "width", 32) + 7) // 8)
        for expr, extent in zip(amap.results, shaped.shape):
            if isinstance(expr, ir.AffineDimExpr):
                if extent == ir.ShapedType.get_dynamic_size():
                    sizes[expr.position] = sizes[expr.position] or 0  # dynamic: 0 unless an operand fixes it
                elif not sizes[expr.position] or position >= len(operands) - outputs:
                    sizes[expr.position] = extent
                if position >= len(operands) - outputs:
                    in_output[expr.position] = True
    ranges = tuple(s for s in sizes if s is not None)
    if len(ranges) != rank:
        raise PerfConfigError(f"{op.name}: a loop range is not given by any operand")
    return ranges, _loop_kinds(op, rank, in_output), element_bytes


def _describe(op) -> str:
    try:
        maps = ",".join(str(m) for m in _indexing_maps(op))
    except PerfConfigError:  # not a linalg op: its types still describe it
        maps = ""
    types = ",".join(str(o.type) for o in op.operands)
    results = ",".join(str(r.type) for r in op.results)
    return f"{op.name}[{maps}]({types})->({results})"


def _native_vector_bytes(target: str) -> int:
    match = re.search(r"native_vector_size = (\d+)", target)
    return int(match.group(1)) if match else 0


def dispatches(module) -> list[Dispatch]:
    """The dispatches of a module at `executable-configurations`, in module order."""
    found = []
    sites, at_load = dispatch_sites(module)
    for index, (function, target) in enumerate(_functions(module)):
        ops = _configured_ops(function)
        texts = [str(op.attributes["lowering_config"]) for op in ops]
        is_root = [registry.is_root(text) for text in texts]
        roots = [op for op, flag in zip(ops, is_root) if flag]
        family = registry.family_of(target, texts)
        problem = f"dispatch/v{PROBLEM_VERSION} " + _OPS.join(
            (_ROOT if flag else "") + _describe(op) for op, flag in zip(ops, is_root)
        )
        name = _symbol(function)
        loaded_only = name in at_load and name not in sites
        unanalysed = Dispatch(
            index=index, name=name, family=family.name if family else "", root="", sizes=(), parallel=(),
            element_bytes=4, default=None, problem=problem, native_vector_bytes=_native_vector_bytes(target),
            gpu_target=gpu_target.target_info(target), sites=sites.get(name, 0),
            at_load=loaded_only, reason=AT_LOAD_REASON if loaded_only else "",
        )
        if family is None:
            found.append(replace(unanalysed, reason="no lowering config of a family the tuner knows"))
            continue
        if len(roots) != 1:
            found.append(replace(unanalysed, reason=f"{len(roots)} root ops (expected one)"))
            continue
        root = roots[0]
        try:
            sizes, parallel, element_bytes = _loops(root)
            default = family.default_config(str(root.attributes["lowering_config"]), str(function.attributes["translation_info"]))
            if default.rank != len(sizes):
                raise PerfConfigError(f"default config has {default.rank} loops, the root op {len(sizes)}")
        except PerfConfigError as exc:
            found.append(replace(unanalysed, root=root.name, reason=str(exc)))
            continue
        found.append(
            replace(unanalysed, root=root.name, sizes=sizes, parallel=parallel, element_bytes=element_bytes, default=default, dynamic=0 in sizes)
        )
    return found


#: Why a dispatch that only the module's initializers run is not tuned.
AT_LOAD_REASON = "runs once, when the module is loaded (only its initializer dispatches it), never in a call: not tuned"


def dispatch_sites(module) -> tuple[dict[str, int], set[str]]:
    """Per dispatch function (export) name, the `stream.cmd.dispatch` ops of the module's functions
    that name it (what a call runs); and the names its initializers (`util.initializer`, run once
    when the module is loaded) dispatch."""
    sites: dict[str, int] = {}
    at_load: set[str] = set()
    for op in operations(module):
        if op.name == "stream.cmd.dispatch" and "entry_points" in op.attributes:
            exports = set(re.findall(r"::@([\w$.\-]+)(?=[\],\s]|$)", str(op.attributes["entry_points"])))
            if _in_initializer(op):
                at_load |= exports
                continue
            for export in exports:
                sites[export] = sites.get(export, 0) + 1
    return sites, at_load


def _in_initializer(op) -> bool:
    """Whether an op is inside a `util.initializer` (code the module runs once, when it is loaded)."""
    parent = op.parent
    while parent is not None and parent.name != "builtin.module":
        if parent.name == "util.initializer":
            return True
        parent = parent.parent
    return False


def root_problem(problem: str) -> str:
    """The root op's part of a dispatch's problem key (what it computes, whatever is fused with it)."""
    return next((part for part in problem.split(_OPS) if part.startswith(_ROOT)), problem)


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
    family = registry.family(dispatch.family)
    for op in _configured_ops(function):
        text = str(op.attributes["lowering_config"])
        new = family.root_config(text, perf) if family.is_root(text) else family.follower_config(text, dispatch, perf)
        if new is not None:
            op.attributes["lowering_config"] = ir.Attribute.parse(new, context)
    translation = family.translation_info(str(function.attributes["translation_info"]), perf)
    if translation is not None:
        function.attributes["translation_info"] = ir.Attribute.parse(translation, context)
