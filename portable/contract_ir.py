"""Deriving a kernel's shape contract from its IR, on the build host.

The source is lowered to IREE's `input` phase (frontends' ops become linalg
and tensor ops) and named linalg ops are generalised, so every structured op
carries indexing maps. Then dimensions are grouped: a loop of a linalg op
that indexes dimensions of two operands makes them one group; `tensor.dim`,
`tensor.empty`, `tensor.cast`, single-dimension reshape groups, IREE's ABI
ops (`hal.buffer_view.dim`, `hal.tensor.import/export/barrier`) and index
casts carry groups through. A dimension related to others by anything else
(a product in a reshape, a slice, an offset in an indexing map, an unknown
op) is opaque: if an opaque group holds a dynamic argument dimension, the
contract cannot express the kernel's needs and is not derived.
"""

from __future__ import annotations

import itertools
import re
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, cast

from portkern.base.errors import BuildError, CompileError
from portkern.portable.bundle import Signature
from portkern.portable.compiler import Compiler, operations
from portkern.portable.contract import SYMBOL, Dim, Rule, ShapeContract, UncheckedShapesWarning, escaped, identifiers_for
from portkern.portable.manifest import KernelSpec
from portkern.portable.onnx_parameters import load_graph

#: The phase analysed: after the frontends' own lowering, before IREE's global optimisations.
ANALYSED_PHASE = "input"
#: Names given to derived symbols, in order of first appearance.
SYMBOL_NAMES = ("M", "K", "N", "L", "P", "Q", "R", "S", "T", "U", "V", "W")
_PASS_THROUGH = ("tensor.cast", "arith.index_cast", "arith.index_castui")
_IGNORED = ("cf.assert", "linalg.yield", "util.return", "func.return", "hal.tensor.export", "util.global.load")

#: A dimension or index the analysis relates: ("in", i, axis), ("out", k, axis), ("v", value, axis),
#: ("i", value), or (("loop", op), position), where `value` and `op` are IR objects.
Atom = tuple[Any, ...]
#: Describes an ("in", i, axis) / ("out", k, axis) atom for messages.
Where = Callable[[Atom], str]


def build_contract(spec: KernelSpec, compiler: Compiler, source: bytes | str, entry: str, signature: Signature) -> ShapeContract | None:
    """The shape contract recorded for an MLIR or ONNX kernel: derived from its IR, with the
    manifest's `shapes:` (and an ONNX model's `dim_param` names) applied and checked against
    it. None, with an UncheckedShapesWarning, when it can be neither derived nor stated."""
    inputs, results = argument_names(spec, source, entry, len(signature.inputs), len(signature.results))

    def where(atom: Atom) -> str:
        side, index, axis = atom
        return f"{escaped((inputs if side == 'in' else results)[index])} dimension {axis}"

    derivation = derive(compiler, source, entry, signature, spec.name)
    stated = dict(onnx_dim_params(spec)) if spec.kind == "onnx" else {}
    stated.update(stated_shapes(spec, inputs, results, signature))
    apply_stated(derivation, stated, lambda atom: f"{spec.source}: kernel {spec.name!r}: {where(atom)}")
    manifest_says = "shapes" in spec.options
    if derivation.unexpressible is not None and not manifest_says:
        if spec.options.get("buckets"):
            raise BuildError(f"{spec.source}: kernel {spec.name!r}: `buckets:` needs a shape contract; state it with `shapes:`")
        warnings.warn(
            f"kernel {spec.name!r}: its shape contract cannot be derived ({derivation.unexpressible}), so calls "
            f"with dynamic shapes cannot be checked; state it with `shapes:` in the manifest",
            UncheckedShapesWarning,
            stacklevel=2,
        )
        return None
    contract = contract_of(derivation, "stated" if manifest_says else "ir")
    named = tuple(inputs) if inputs != [f"arg{i}" for i in range(len(inputs))] else ()
    contract = replace(contract, names=named, buckets=bucket_rules(spec, contract))
    problem = contract.problem([t.shape for t in signature.inputs], [t.shape for t in signature.results])
    if problem is not None:
        raise BuildError(f"{spec.source}: kernel {spec.name!r}: shape contract {contract}: {problem}")
    return contract


def bucket_rules(spec: KernelSpec, contract: ShapeContract) -> dict[str, Rule]:
    """The manifest's `buckets:` rules, for symbols the contract has."""
    rules: dict[str, Rule] = {}
    for symbol, rule in (spec.options.get("buckets") or {}).items():
        if symbol not in contract.symbols:
            known = ", ".join(contract.symbols) or "none"
            raise BuildError(f"{spec.source}: kernel {spec.name!r}: `buckets:` names {symbol!r}, which is not a symbol of {contract} (symbols: {known})")
        rules[symbol] = rule if isinstance(rule, str) else tuple(rule)
    return rules


def argument_names(spec: KernelSpec, source: bytes | str, entry: str, n_inputs: int, n_results: int) -> tuple[list[str], list[str]]:
    """Names of the entry's arguments and results, for `shapes:` keys and messages:
    the MLIR text's `%names`, an ONNX graph's input and output names as the model writes them
    (free text: `0`, `gpu_0/data_0`), else `arg0`, `result0`."""
    inputs = [f"arg{i}" for i in range(n_inputs)]
    results = [f"result{k}" for k in range(n_results)]
    if spec.kind == "onnx":
        graph = _onnx_graph(spec.source)
        if graph is not None and len(graph[0]) == n_inputs and len(graph[1]) == n_results:
            inputs, results = [n for n, _ in graph[0]], [n for n, _ in graph[1]]
        return inputs, results
    text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
    header = re.search(rf"@{re.escape(entry)}\s*\(", text)
    if header:
        names = re.findall(r"%([A-Za-z_][A-Za-z0-9_$.]*)\s*:", _balanced(text, header.end()))
        if len(names) == n_inputs and len(set(names)) == n_inputs:
            inputs = names
    return inputs, results


def _balanced(text: str, start: int) -> str:
    """The text from `start` to the parenthesis that closes the one just before it."""
    depth = 1
    for index in range(start, min(len(text), start + 65536)):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        if depth == 0:
            return text[start:index]
    return ""


def stated_shapes(spec: KernelSpec, inputs: Sequence[str], results: Sequence[str], signature: Signature) -> dict[Atom, Dim]:
    """The manifest's `shapes:` as atoms -> size or symbol, checked against the signature."""
    shapes = spec.options.get("shapes") or {}
    names = {name: ("in", i) for i, name in enumerate(identifiers_for(inputs))}
    names.update({name: ("out", k) for k, name in enumerate(identifiers_for(results))})
    names.update({name: ("in", i) for i, name in enumerate(inputs)})
    names.update({name: ("out", k) for k, name in enumerate(results)})
    names.update({f"arg{i}": ("in", i) for i in range(len(inputs))})
    names.update({f"result{k}": ("out", k) for k in range(len(results))})
    stated: dict[Atom, Dim] = {}
    for name, dims in shapes.items():
        if name not in names:
            raise BuildError(
                f"{spec.source}: kernel {spec.name!r}: `shapes:` names {name!r}, which is not an argument or result "
                f"(arguments: {', '.join(map(escaped, inputs)) or 'none'}; results: {', '.join(map(escaped, results)) or 'none'})"
            )
        side, index = names[name]
        spec_shape = (signature.inputs if side == "in" else signature.results)[index].shape
        if len(dims) != len(spec_shape):
            raise BuildError(
                f"{spec.source}: kernel {spec.name!r}: `shapes: {escaped(name)}` has {len(dims)} dimensions, the IR's type has {len(spec_shape)}"
            )
        for axis, (dim, size) in enumerate(zip(dims, spec_shape)):
            if isinstance(dim, int) and size is not None and dim != size:
                raise BuildError(f"{spec.source}: kernel {spec.name!r}: `shapes: {escaped(name)}` dimension {axis} is {dim}, the IR's type says {size}")
            stated[(side, index, axis)] = dim
    return stated


def onnx_dim_params(spec: KernelSpec) -> dict[Atom, Dim]:
    """An ONNX model's named dynamic dimensions (`dim_param`) as atoms -> symbols."""
    graph = _onnx_graph(spec.source)
    if graph is None:
        return {}
    stated: dict[Atom, Dim] = {}
    for side, values in (("in", graph[0]), ("out", graph[1])):
        for index, (_, params) in enumerate(values):
            for axis, param in enumerate(params):
                if param:
                    symbol = re.sub(r"\W", "_", param)[:32]
                    stated[(side, index, axis)] = symbol if SYMBOL.match(symbol) else f"D_{symbol}"[:32]
    return stated


def _onnx_graph(path: Path) -> tuple[list[tuple[str, list[str]]], list[tuple[str, list[str]]]] | None:
    """(name, dim_params) of an ONNX graph's inputs (initializers left out) and outputs; None without `onnx`."""
    try:
        model = load_graph(path)
    except BuildError:  # no `onnx`, or a model the importer accepted but onnx cannot load: no names
        return None
    initializers = {t.name for t in model.graph.initializer}

    def describe(values: Any) -> list[tuple[str, list[str]]]:
        return [(v.name, [d.dim_param for d in v.type.tensor_type.shape.dim]) for v in values if v.name not in initializers]

    return describe(model.graph.input), describe(model.graph.output)


@dataclass
class Groups:
    """Union-find over dimension atoms, with what each group holds."""

    parent: dict[Atom, Atom] = field(default_factory=dict)
    #: Per group root: a size it is fixed to.
    size: dict[Atom, int] = field(default_factory=dict)
    #: Group roots related to other dimensions by something a contract cannot state, with why.
    opaque: dict[Atom, str] = field(default_factory=dict)

    def find(self, atom: Atom) -> Atom:
        self.parent.setdefault(atom, atom)
        while self.parent[atom] != atom:
            self.parent[atom] = self.parent[self.parent[atom]]
            atom = self.parent[atom]
        return atom

    def union(self, a: Atom, b: Atom) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        self.parent[rb] = ra
        if rb in self.size:
            self.size.setdefault(ra, self.size[rb])
        if rb in self.opaque:
            self.opaque.setdefault(ra, self.opaque[rb])

    def fix(self, atom: Atom, size: int) -> None:
        self.size.setdefault(self.find(atom), size)

    def mark(self, atom: Atom, why: str) -> None:
        self.opaque.setdefault(self.find(atom), why)


@dataclass
class Derivation:
    """The groups found in a kernel's IR: what ties which argument and result dimensions."""

    #: Per argument and dimension: its group (None for a static dimension).
    inputs: tuple[tuple[Atom | None, ...], ...]
    results: tuple[tuple[Atom | None, ...], ...]
    #: Why the groups do not capture everything the kernel needs (None when they do).
    unexpressible: str | None
    groups: Groups
    signature: Signature
    #: Group root -> the symbol a stated contract gives it.
    names: dict[Atom, str] = field(default_factory=dict)


def derive(compiler: Compiler, source: bytes | str, entry: str, signature: Signature, name: str) -> Derivation:
    """Group the dimensions of a kernel's arguments and results as its IR relates them."""
    try:
        module = compiler.parse(source, name=name)
        lowered = compiler.lower(module, from_phase="start", to_phase=ANALYSED_PHASE, name=name)
        _generalize(compiler, lowered)
    except CompileError as exc:
        raise BuildError(f"{name}: cannot lower for the shape analysis: {exc}") from None
    funcs = {str(op.attributes["sym_name"]).strip('"'): op for op in operations(lowered) if op.name in ("func.func", "util.func")}
    func = funcs.get(f"{entry}$async", funcs.get(entry))
    if func is None:
        raise BuildError(f"{name}: entry {entry!r} is missing after lowering to {ANALYSED_PHASE}")
    return _Walker(signature).run(func)


def _generalize(compiler: Compiler, module: Any) -> None:
    from iree.compiler import passmanager

    with compiler.context:
        passmanager.PassManager.parse("builtin.module(linalg-generalize-named-ops)").run(module)


class _Walker:
    def __init__(self, signature: Signature) -> None:
        self.signature = signature
        self.groups = Groups()
        self.constants: dict[Any, int] = {}
        self.exported: dict[Any, Any] = {}
        self.results: list[Any] = []
        self.unknown: list[str] = []

    def run(self, func: Any) -> Derivation:
        from iree.compiler import ir

        args = [a for a in func.regions[0].blocks[0].arguments if _is_tensor(a.type) or "buffer_view" in str(a.type)]
        if len(args) != len(self.signature.inputs):
            raise BuildError(f"the entry has {len(args)} tensor arguments after lowering, the signature {len(self.signature.inputs)}")
        self.arg_index = {arg: i for i, arg in enumerate(args)}
        for i, spec in enumerate(self.signature.inputs):
            for axis, size in enumerate(spec.shape):
                if size is not None:
                    self.groups.fix(("in", i, axis), size)
            if _is_tensor(args[i].type):
                self._tensor(args[i], [("in", i, axis) for axis in range(len(spec.shape))])
        for op in operations(func)[1:]:
            self._op(op, ir)
        inputs = tuple(
            tuple(None if size is not None else ("in", i, axis) for axis, size in enumerate(spec.shape))
            for i, spec in enumerate(self.signature.inputs)
        )
        results = tuple(
            tuple(None if size is not None else ("out", k, axis) for axis, size in enumerate(spec.shape))
            for k, spec in enumerate(self.signature.results)
        )
        unexpressible = None
        for i, shape in enumerate(inputs):
            for axis, atom in enumerate(shape):
                root = self.groups.find(atom) if atom is not None else None
                if root is not None and root in self.groups.opaque and root not in self.groups.size:
                    unexpressible = f"dimension {axis} of argument {i} is related to others by {self.groups.opaque[root]}"
                    break
            if unexpressible:
                break
        return Derivation(inputs, results, unexpressible, self.groups, self.signature)

    # -- atoms --------------------------------------------------------------

    def _tensor(self, value: Any, atoms: Sequence[Atom]) -> None:
        """Tie each dimension of a tensor value to an atom."""
        for axis, atom in enumerate(atoms):
            self.groups.union(("v", value, axis), atom)
        shape = value.type.shape
        for axis, size in enumerate(shape):
            if not value.type.is_dynamic_dim(axis):
                self.groups.fix(("v", value, axis), size)

    def _dims(self, value: Any) -> list[Atom]:
        if not _is_tensor(value.type):
            return []
        atoms = [("v", value, axis) for axis in range(value.type.rank)]
        for axis in range(value.type.rank):
            if not value.type.is_dynamic_dim(axis):
                self.groups.fix(atoms[axis], value.type.get_dim_size(axis))
        return atoms

    def _opaque(self, op: Any, why: str) -> None:
        """Every dynamic dimension and index an op touches is related to others in a way we cannot state."""
        for value in itertools.chain(op.operands, op.results):
            if _is_tensor(value.type):
                for axis, atom in enumerate(self._dims(value)):
                    if value.type.is_dynamic_dim(axis):
                        self.groups.mark(atom, why)
            elif _is_index_like(value.type):
                self.groups.mark(("i", value), why)

    # -- ops ----------------------------------------------------------------

    def _op(self, op: Any, ir: Any) -> None:
        name = op.name
        if name in _IGNORED:
            if name == "hal.tensor.export":
                self.exported[op.results[0]] = op.operands[0]
            if name in ("util.return", "func.return") and not self.results:
                self._return(op)
            return
        if name == "arith.constant":
            value = op.attributes["value"]
            if isinstance(value, ir.IntegerAttr) and _is_index_like(op.results[0].type):
                self.constants[op.results[0]] = value.value
                self.groups.fix(("i", op.results[0]), value.value)
            return
        if name in _PASS_THROUGH:
            source, result = op.operands[0], op.results[0]
            if _is_tensor(result.type):
                for a, b in zip(self._dims(source), self._dims(result)):
                    self.groups.union(a, b)
            else:
                self.groups.union(("i", source), ("i", result))
            return
        if name == "tensor.dim":
            axis = self.constants.get(op.operands[1])
            if axis is None:
                self._opaque(op, "a tensor.dim with a computed index")
            else:
                self.groups.union(("i", op.results[0]), ("v", op.operands[0], axis))
            return
        if name == "tensor.empty":
            result = op.results[0]
            dynamic = iter(op.operands)
            for axis, atom in enumerate(self._dims(result)):
                if result.type.is_dynamic_dim(axis):
                    self.groups.union(atom, ("i", next(dynamic)))
            return
        if name == "hal.buffer_view.dim":
            index = self.arg_index.get(op.operands[0])
            if index is not None:
                self.groups.union(("i", op.results[0]), ("in", index, ir.IntegerAttr(op.attributes["index"]).value))
            return
        if name == "hal.tensor.import":
            index = self.arg_index.get(op.operands[0])
            if index is not None:
                self._tensor(op.results[0], [("in", index, axis) for axis in range(op.results[0].type.rank)])
            return
        if name == "hal.tensor.barrier":
            for source, result in zip(op.operands, op.results):
                for a, b in zip(self._dims(source), self._dims(result)):
                    self.groups.union(a, b)
            return
        if name in ("tensor.expand_shape", "tensor.collapse_shape"):
            self._reshape(op, ir)
            return
        if "indexing_maps" in op.attributes and name.startswith("linalg."):
            self._structured(op, ir)
            return
        touches = any(_is_tensor(v.type) or _is_index_like(v.type) for v in itertools.chain(op.operands, op.results))
        if touches:
            self._opaque(op, f"the op {name}")
            self.unknown.append(name)

    def _return(self, op: Any) -> None:
        values = [self.exported.get(v, v) for v in op.operands]
        values = [v for v in values if _is_tensor(v.type)]
        self.results = values
        for k, value in enumerate(values[: len(self.signature.results)]):
            for axis, atom in enumerate(self._dims(value)):
                self.groups.union(("out", k, axis), atom)

    def _reshape(self, op: Any, ir: Any) -> None:
        source, result = op.operands[0], op.results[0]
        expand = op.name == "tensor.expand_shape"
        wide, narrow = (result, source) if expand else (source, result)
        groups = [[ir.IntegerAttr(i).value for i in g] for g in ir.ArrayAttr(op.attributes["reassociation"])]
        wide_dims, narrow_dims = self._dims(wide), self._dims(narrow)
        if expand:
            dynamic = iter(op.operands[1:])
            for axis, atom in enumerate(wide_dims):
                if result.type.is_dynamic_dim(axis):
                    self.groups.union(atom, ("i", next(dynamic)))
        for narrow_axis, group in enumerate(groups):
            if len(group) == 1:
                self.groups.union(narrow_dims[narrow_axis], wide_dims[group[0]])
            elif any(wide.type.is_dynamic_dim(a) for a in group) or narrow.type.is_dynamic_dim(narrow_axis):
                # A collapse may take any sizes (its result is their product); an expand needs
                # its source to be the product of the sizes it is split into.
                why = f"a product in {op.name}"
                self.groups.mark(narrow_dims[narrow_axis], why)
                for a in group if expand else ():
                    self.groups.mark(wide_dims[a], why)

    def _structured(self, op: Any, ir: Any) -> None:
        maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
        operands = list(op.operands)[: len(maps)]
        loop = ("loop", op)
        for operand, amap in zip(operands, maps):
            dims = self._dims(operand)
            for axis, expr in enumerate(amap.results):
                if axis >= len(dims):
                    break
                if isinstance(expr, ir.AffineDimExpr):
                    self.groups.union(dims[axis], (loop, expr.position))
                elif not isinstance(expr, ir.AffineConstantExpr) and operand.type.is_dynamic_dim(axis):
                    self.groups.mark(dims[axis], f"the index expression {expr} of {op.name}")
        outputs = operands[len(operands) - len(op.results):]
        for result, output in zip(op.results, outputs):
            for a, b in zip(self._dims(result), self._dims(output)):
                self.groups.union(a, b)


def _is_tensor(mlir_type: Any) -> bool:
    from iree.compiler import ir

    return isinstance(mlir_type, ir.RankedTensorType)


def _is_index_like(mlir_type: Any) -> bool:
    from iree.compiler import ir

    return isinstance(mlir_type, (ir.IndexType, ir.IntegerType))


# --- from groups to a contract -------------------------------------------------


def apply_stated(derivation: Derivation, stated: Mapping[Atom, Dim], where: Where) -> None:
    """Add a stated contract's ties and sizes to the derived groups, or BuildError where it
    contradicts the IR: a size the IR fixes otherwise, or two dimensions the IR makes equal
    given different symbols.

    `stated` maps ("in", i, axis) / ("out", k, axis) to a size or a symbol.
    """
    groups = derivation.groups
    seen: dict[Atom, tuple[Atom, Dim]] = {}
    for atom, dim in stated.items():
        root = groups.find(atom)
        if isinstance(dim, int) and groups.size.get(root, dim) != dim:
            raise BuildError(f"{where(atom)} is {dim} in the stated shapes, but the IR fixes it to {groups.size[root]}")
        if root in seen and root not in groups.size and seen[root][1] != dim:
            other, other_dim = seen[root]
            raise BuildError(
                f"the stated shapes give {where(other)} and {where(atom)} different sizes ({other_dim} and {dim}), "
                f"but the IR makes them equal"
            )
        seen.setdefault(root, (atom, dim))
    first: dict[str, Atom] = {}
    for atom, dim in stated.items():
        if isinstance(dim, int):
            groups.fix(atom, dim)
            continue
        if dim in first:
            a, b = groups.find(first[dim]), groups.find(atom)
            if a in groups.size and b in groups.size and groups.size[a] != groups.size[b]:
                raise BuildError(
                    f"the stated shapes call {where(first[dim])} and {where(atom)} both {dim}, "
                    f"but the IR fixes them to {groups.size[a]} and {groups.size[b]}"
                )
            groups.union(first[dim], atom)
        first.setdefault(dim, atom)
    derivation.names.update({groups.find(atom): dim for dim, atom in first.items()})


def contract_of(derivation: Derivation, origin: str = "ir") -> ShapeContract:
    """The contract of the derived groups: one symbol per group that no size fixes."""
    groups = derivation.groups
    names = {groups.find(root): name for root, name in derivation.names.items()}
    used = set(names.values())
    fresh = (n for n in itertools.chain(SYMBOL_NAMES, (f"D{i}" for i in itertools.count())) if n not in used)

    def dim(atom: Atom, fixed: int | None, is_input: bool) -> Dim | None:
        if fixed is not None:
            return fixed
        root = groups.find(atom)
        if root in groups.size:
            return groups.size[root]
        if root not in names:
            if not is_input:
                return None
            names[root] = next(fresh)
        return names[root]

    signature = derivation.signature
    inputs = tuple(
        # an input dimension always gets a size or a symbol
        tuple(cast(Dim, dim(("in", i, axis), size, True)) for axis, size in enumerate(spec.shape)) for i, spec in enumerate(signature.inputs)
    )
    results = tuple(
        tuple(dim(("out", k, axis), size, False) for axis, size in enumerate(spec.shape)) for k, spec in enumerate(signature.results)
    )
    contract = ShapeContract(inputs, results, origin)
    bound = set(contract.symbols)
    # A result symbol that only a stated result names is bound by no argument: the result dim is unknown.
    results = tuple(tuple(d if not isinstance(d, str) or d in bound else None for d in shape) for shape in results)
    return ShapeContract(inputs, results, origin)
