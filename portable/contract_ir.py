"""Deriving a kernel's shape contract from its IR, on the build host.

The source is lowered to IREE's `input` phase (frontends' ops become linalg
and tensor ops) and named linalg ops are generalised, so every structured op
carries indexing maps. Then dimensions are grouped: a loop of a linalg op
that indexes dimensions of two operands makes them one group; `tensor.dim`,
`tensor.empty`, `tensor.cast`, single-dimension reshape groups, IREE's ABI
ops (`hal.buffer_view.dim`, `hal.tensor.import/export/barrier`) and index
casts carry groups through. Sizes computed from others (index arithmetic,
a collapse's product, a slice's or pad's size, a concatenation's sum) are
recorded as definitions of their groups, and what a kernel needs of them
(a slice within its source, an indexing map's `d0 + d1` within the operand,
a reshape's product, sizes not negative) as conditions over the symbols.
An index or slice offset read from data is clamped into its tensor at run
time (`portable.index_safety`), so it needs only that the dimension holds
what is read (`M >= 1`); arithmetic on data needs nothing of the sizes.
A dimension related to others by anything else (an unknown op, a size
computed in a way not followed) is opaque: if an opaque group holds a dynamic
argument dimension, or a condition needs one, the contract cannot express the
kernel's needs and is not derived.
"""

from __future__ import annotations

import itertools
import re
import warnings
from dataclasses import field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, cast

from portkern.base.errors import BuildError, CompileError
from portkern.base.records import record
from portkern.portable.bundle import Signature
from portkern.portable.compiler import Compiler, operations
from portkern.portable.contract import (
    SYMBOL,
    Dim,
    Rule,
    ShapeContract,
    UncheckedShapesWarning,
    escaped,
    expression_problem,
    identifiers_for,
)
from portkern.portable.manifest import KernelSpec
from portkern.portable.onnx_parameters import load_graph

#: The phase analysed: after the frontends' own lowering, before IREE's global optimisations.
ANALYSED_PHASE = "input"
#: Names given to derived symbols, in order of first appearance.
SYMBOL_NAMES = ("M", "K", "N", "L", "P", "Q", "R", "S", "T", "U", "V", "W")
_PASS_THROUGH = ("tensor.cast", "arith.index_cast", "arith.index_castui", "arith.extsi", "arith.extui")
#: Index arithmetic followed, as the operator of a size term; those not in _EXACT (and `floordivsi`)
#: with the condition that their operands are not negative.
_ARITH = {"arith.addi": "+", "arith.subi": "-", "arith.muli": "*", "arith.minsi": "min", "arith.maxsi": "max",
          "arith.divsi": "//", "arith.divui": "//", "arith.floordivsi": "//", "arith.ceildivsi": "ceil_div",
          "arith.ceildivui": "ceil_div", "arith.remsi": "%", "arith.remui": "%", "arith.minui": "min", "arith.maxui": "max"}
_EXACT = ("+", "-", "*", "min", "max")
_IGNORED = ("cf.assert", "linalg.yield", "util.return", "func.return", "hal.tensor.export", "util.global.load")

#: A dimension or index the analysis relates: ("in", i, axis), ("out", k, axis), ("v", value, axis),
#: ("i", value), or (("loop", op), position), where `value` and `op` are IR objects.
Atom = tuple[Any, ...]
#: Describes an ("in", i, axis) / ("out", k, axis) atom for messages.
Where = Callable[[Atom], str]
#: A size term: ("c", int), ("g", atom) (the size of its group), or (op, term, term) with op one of
#: + - * // % ceil_div min max; (op, term, term, NATURAL) when the op computes the expression only for
#: operands not negative (truncating or unsigned arithmetic), which a size computed by it then needs.
Term = tuple[Any, ...]
#: A condition a kernel needs of its sizes: (term, "<=" / ">=" / "==", term).
Need = tuple[Term, str, Term]
#: The marker of a term whose operands must not be negative.
NATURAL = "natural"


def build_contract(spec: KernelSpec, compiler: Compiler, source: bytes | str, entry: str, signature: Signature) -> ShapeContract | None:
    """The shape contract recorded for an MLIR or ONNX kernel: derived from its IR, with the
    manifest's `shapes:` (and an ONNX model's `dim_param` names) applied and checked against
    it. None, with an UncheckedShapesWarning, when it can be neither derived nor stated."""
    inputs, results = argument_names(spec, source, entry, len(signature.inputs), len(signature.results))

    def where(atom: Atom) -> str:
        side, index, axis = atom
        return f"{escaped((inputs if side == 'in' else results)[index])} dimension {axis}"

    derivation = derive(compiler, source, entry, signature, spec.name)
    groups = derivation.groups
    # An exporter's dim_param names label what the IR leaves free; on a dimension the IR fixes to a
    # size they say nothing (exporters name fixed dimensions alike that are 1 and 7).
    stated = {atom: dim for atom, dim in onnx_dim_params(spec).items() if groups.find(atom) not in groups.size} if spec.kind == "onnx" else {}
    stated.update(stated_shapes(spec, inputs, results, signature))
    apply_stated(derivation, stated, lambda atom: f"{spec.source}: kernel {spec.name!r}: {where(atom)}")
    manifest_says = "shapes" in spec.options
    if spec.options.get("unchecked") and not manifest_says:
        if spec.options.get("buckets"):
            raise BuildError(f"{spec.source}: kernel {spec.name!r}: `buckets:` needs a shape contract; state it with `shapes:`")
        if any(None in t.shape for t in signature.inputs):
            warnings.warn(
                f"kernel {spec.name!r} is built unchecked (`unchecked: true`): its calls with dynamic shapes are not checked",
                UncheckedShapesWarning,
                stacklevel=2,
            )
        return None
    if derivation.unexpressible is not None and not manifest_says:
        if spec.options.get("buckets"):
            raise BuildError(f"{spec.source}: kernel {spec.name!r}: `buckets:` needs a shape contract; state it with `shapes:`")
        message = underivable_message(spec.name, str(spec.source), derivation.unexpressible, inputs, results, signature)
        if spec.kind == "onnx":
            message += "; through portkern.onnx.prepare, pass the same as shapes=, constraints=, unchecked=True"
        raise BuildError(message)
    contract = contract_of(derivation, "stated" if manifest_says else "ir")
    named = tuple(inputs) if inputs != [f"arg{i}" for i in range(len(inputs))] else ()
    stated_requires = tuple(_stated_conditions(spec, contract))
    requires = tuple(dict.fromkeys(contract.requires + stated_requires))
    contract = replace(contract, names=named, buckets=bucket_rules(spec, contract), requires=requires)
    problem = contract.problem([t.shape for t in signature.inputs], [t.shape for t in signature.results])
    if problem is not None:
        raise BuildError(f"{spec.source}: kernel {spec.name!r}: shape contract {contract}: {problem}")
    return contract


def underivable_message(kernel: str, source: str, why: str, inputs: Sequence[str], results: Sequence[str], signature: Signature) -> str:
    """Why a kernel's contract cannot be derived, and how to state it (`shapes:`, `constraints:`) or
    build it unchecked (`unchecked: true`)."""
    letters = iter("nmkpqrstuvw")
    example = {}
    for name, spec in list(zip(inputs, signature.inputs))[:3]:
        example[escaped(name)] = "[" + ", ".join(str(d) if d is not None else next(letters, "d") for d in spec.shape) + "]"
    shown = ", ".join(f"{n}: {d}" for n, d in example.items())
    return (
        f"{source}: kernel {kernel!r}: its shape contract cannot be derived ({why}), so its calls could not be "
        f"checked; state it in the manifest, e.g. `shapes: {{{shown}, {escaped(results[0]) if results else 'result0'}: [n - k + 1]}}` "
        f"with `constraints: [\"k <= n\"]` for what the kernel needs of the sizes, or build it unchecked with "
        f"`unchecked: true` (then nothing stops a call from reading past its arguments)"
    )


def _stated_conditions(spec: KernelSpec, contract: ShapeContract) -> list[str]:
    """The manifest's `constraints:`, checked to name only the contract's symbols."""
    from portkern.base.errors import LaunchSpecError
    from portkern.portable.contract import condition

    out = []
    for text in spec.options.get("constraints") or ():
        try:
            needs = condition(str(text)).symbols
        except LaunchSpecError as exc:
            raise BuildError(f"{spec.source}: kernel {spec.name!r}: `constraints: {text}`: {exc}") from None
        unknown = sorted(needs - set(contract.symbols))
        if unknown:
            raise BuildError(
                f"{spec.source}: kernel {spec.name!r}: `constraints: {text}` names {', '.join(unknown)}, "
                f"which is not a symbol of {contract} (symbols: {', '.join(contract.symbols) or 'none'})"
            )
        out.append(str(text))
    return out


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
            if isinstance(dim, str) and not SYMBOL.match(dim):
                if side == "in":
                    raise BuildError(
                        f"{spec.source}: kernel {spec.name!r}: `shapes: {escaped(name)}` dimension {axis} is {dim!r}: an argument's "
                        f"dimensions are sizes or symbols; state relations between them in `constraints:`"
                    )
                problem = expression_problem(dim)
                if problem is not None:
                    raise BuildError(f"{spec.source}: kernel {spec.name!r}: `shapes: {escaped(name)}` dimension {axis}: {problem}")
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


@record
class Groups:
    """Union-find over dimension atoms, with what each group holds."""

    parent: dict[Atom, Atom] = field(default_factory=dict)
    #: Per group root: a size it is fixed to.
    size: dict[Atom, int] = field(default_factory=dict)
    #: Group roots related to other dimensions by something a contract cannot state, with why.
    opaque: dict[Atom, str] = field(default_factory=dict)
    #: Per group root: terms its size is computed as (index arithmetic, a product, a sum).
    defs: dict[Atom, list[Term]] = field(default_factory=dict)
    #: Group roots known not to be negative (tensor dimensions).
    natural: set[Atom] = field(default_factory=set)

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
        if rb in self.defs:
            self.defs.setdefault(ra, []).extend(self.defs.pop(rb))
        if rb in self.natural:
            self.natural.add(ra)

    def fix(self, atom: Atom, size: int) -> None:
        self.size.setdefault(self.find(atom), size)

    def mark(self, atom: Atom, why: str) -> None:
        self.opaque.setdefault(self.find(atom), why)

    def define(self, atom: Atom, term: Term) -> None:
        self.defs.setdefault(self.find(atom), []).append(term)

    def natural_term(self, term: Term) -> bool:
        """Whether a term is known not to be negative."""
        if term[0] == "c":
            return bool(term[1] >= 0)
        if term[0] == "g":
            root = self.find(term[1])
            return root in self.natural or self.size.get(root, -1) >= 0
        return term[0] != "-" and all(self.natural_term(t) for t in term[1:3])


@record
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
    #: Conditions the kernel needs of its sizes.
    needs: list[Need] = field(default_factory=list)
    #: Index into `needs` -> what a runtime index (clamped into its tensor, portable/index_safety.py)
    #: needs instead where the index is data (None: nothing).
    clamped: dict[int, Need | None] = field(default_factory=dict)
    #: ("out", k, axis) -> an expression a stated contract gives a result dimension.
    result_exprs: dict[Atom, str] = field(default_factory=dict)
    #: The analysed module, kept alive while the atoms (which hold its values) are used.
    module: Any = None


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
    derivation = _Walker(signature).run(func)
    derivation.module = lowered
    return derivation


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
        self.needs: list[Need] = []
        self.clamped: dict[int, Need | None] = {}
        #: i1 values whose truth a size's sign decides (`arith.cmpi slt %dim, %c0` is false).
        self.truths: dict[Any, bool] = {}

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
        derivation = Derivation(inputs, results, unexpressible, self.groups, self.signature, needs=self.needs, clamped=self.clamped)
        if unexpressible is None:
            placeholders = {self.groups.find(a): f"S{n}" for n, a in enumerate(a for shape in inputs for a in shape if a is not None)}
            try:
                conditions(derivation, placeholders)
            except Unresolved as exc:
                derivation.unexpressible = str(exc)
        return derivation

    # -- atoms --------------------------------------------------------------

    def _tensor(self, value: Any, atoms: Sequence[Atom]) -> None:
        """Tie each dimension of a tensor value to an atom."""
        for axis, atom in enumerate(atoms):
            self.groups.union(("v", value, axis), atom)
            self.groups.natural.add(self.groups.find(atom))
        shape = value.type.shape
        for axis, size in enumerate(shape):
            if not value.type.is_dynamic_dim(axis):
                self.groups.fix(("v", value, axis), size)

    def _dims(self, value: Any) -> list[Atom]:
        if not _is_tensor(value.type):
            return []
        atoms = [("v", value, axis) for axis in range(value.type.rank)]
        for axis in range(value.type.rank):
            self.groups.natural.add(self.groups.find(atoms[axis]))
            if not value.type.is_dynamic_dim(axis):
                self.groups.fix(atoms[axis], value.type.get_dim_size(axis))
        return atoms

    def _term(self, value: Any) -> Term:
        """The size term of an index value."""
        if value in self.constants:
            return ("c", self.constants[value])
        return ("g", ("i", value))

    def _need(self, left: Term, relation: str, right: Term) -> None:
        self.needs.append((left, relation, right))

    def _index_need(self, need: Need, clamped: Need | None) -> None:
        """A need of a runtime index, which index safety clamps into its tensor: where the index
        is data, the kernel needs only `clamped` (None: nothing) of the sizes."""
        self.clamped[len(self.needs)] = clamped
        self.needs.append(need)

    def _not_negative(self, term: Term) -> None:
        if not self.groups.natural_term(term):
            self._need(term, ">=", ("c", 0))

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
                    size = next(dynamic)
                    self._not_negative(self._term(size))
                    self.groups.union(atom, ("i", size))
            return
        if name in _ARITH and _is_index_like(op.results[0].type):
            left, right = self._term(op.operands[0]), self._term(op.operands[1])
            kind = _ARITH[name]
            term: Term = (kind, left, right)
            if not (kind in _EXACT and not name.endswith("ui") or name == "arith.floordivsi"):
                # truncating or unsigned: the same as the expression's only for operands not negative,
                # which a size computed by it needs (arithmetic on data, no size's, needs nothing)
                term = (kind, left, right, NATURAL)
            self.groups.define(("i", op.results[0]), term)
            return
        if name == "arith.cmpi":
            self._compare(op, ir)
            return
        if name == "arith.select":
            truth = self.truths.get(op.operands[0])
            result = op.results[0]
            if truth is not None and _is_index_like(result.type):
                self.groups.union(("i", result), ("i", op.operands[1 if truth else 2]))
            elif _is_index_like(result.type):
                self.groups.mark(("i", result), "an arith.select on a computed condition")
            elif _is_tensor(result.type):
                self._opaque(op, f"the op {name}")
            return
        if name.startswith("arith."):
            for result in op.results:  # other scalar arithmetic changes no operand's size
                if _is_index_like(result.type):
                    self.groups.mark(("i", result), f"the op {name}")
            return
        handler = {"tensor.extract_slice": self._slice, "tensor.insert_slice": self._slice, "tensor.pad": self._pad, "tensor.concat": self._concat,
                   "tensor.extract": self._element, "tensor.insert": self._element}.get(name)
        if handler is not None:
            try:
                handler(op, ir)
            except (KeyError, ValueError, TypeError, IndexError, StopIteration):  # a form of the op not followed
                self._opaque(op, f"the op {name}")
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
                # A collapse's result is the product of its sizes; an expand needs its source to
                # be the product of the sizes it is split into, none of them negative.
                product: Term = ("g", wide_dims[group[0]])
                for a in group[1:]:
                    product = ("*", product, ("g", wide_dims[a]))
                if expand:
                    for a in group:
                        self._not_negative(("g", wide_dims[a]))
                    self._need(("g", narrow_dims[narrow_axis]), "==", product)
                else:
                    self.groups.define(narrow_dims[narrow_axis], product)

    def _compare(self, op: Any, ir: Any) -> None:
        """An `arith.cmpi` of a size with 0 that the size's sign decides."""
        predicate = ir.IntegerAttr(op.attributes["predicate"]).value
        left, right = self._term(op.operands[0]), self._term(op.operands[1])
        # eq ne slt sle sgt sge ult ule ugt uge = 0..9
        if right == ("c", 0) and self.groups.natural_term(left) and predicate in (2, 5, 6, 9):
            self.truths[op.results[0]] = predicate in (5, 9)
        elif left == ("c", 0) and self.groups.natural_term(right) and predicate in (3, 4, 7, 8):
            self.truths[op.results[0]] = predicate in (3, 7)

    def _offsets(self, op: Any, ir: Any, first: int) -> tuple[list[Term], list[Term], list[Term]]:
        """A slice op's offsets, sizes and strides as terms (dynamic ones from operands from `first` on)."""
        dynamic = iter(op.operands[first:])
        out = []
        for key in ("static_offsets", "static_sizes", "static_strides"):
            terms = []
            for value in ir.DenseI64ArrayAttr(op.attributes[key]):
                terms.append(self._term(next(dynamic)) if value == ir.ShapedType.get_dynamic_size() else ("c", value))
            out.append(terms)
        return out[0], out[1], out[2]

    def _slice(self, op: Any, ir: Any) -> None:
        """An extract_slice (or insert_slice) within its source (destination): per dimension,
        offset and sizes not negative and the last element read (written) inside."""
        insert = op.name == "tensor.insert_slice"
        full = op.operands[1] if insert else op.operands[0]
        part = op.operands[0] if insert else op.results[0]
        offsets, sizes, strides = self._offsets(op, ir, 2 if insert else 1)
        full_dims, part_dims = self._dims(full), self._dims(part)
        if insert:
            for a, b in zip(full_dims, self._dims(op.results[0])):
                self.groups.union(a, b)
        kept = list(range(len(sizes)))
        while len(kept) > len(part_dims):  # a rank-reducing slice drops unit dimensions
            drop = next((axis for axis in kept if sizes[axis] == ("c", 1)), None)
            if drop is None:
                self._opaque(op, f"a rank-reducing {op.name}")
                return
            kept.remove(drop)
        for axis, part_axis in zip(kept, range(len(part_dims))):
            if sizes[axis][0] == "g":
                self.groups.union(part_dims[part_axis], sizes[axis][1])
        for axis, (offset, size, stride, dim) in enumerate(zip(offsets, sizes, strides, full_dims)):
            self._not_negative(size)
            self._not_negative(stride)
            inside = [self._inside(at, size, stride, dim) for at in (offset, ("c", 0))]
            if offset[0] == "c":
                self._need(*inside[0])
            else:  # a runtime offset is clamped so that the slice's last element is inside when it fits
                if not self.groups.natural_term(offset):
                    self._index_need((offset, ">=", ("c", 0)), None)
                self._index_need(inside[0], inside[1])

    @staticmethod
    def _inside(offset: Term, size: Term, stride: Term, dim: Atom) -> Need:
        """The last element of a slice at `offset` inside `dim` (for a slice of one element or more)."""
        if stride == ("c", 1):
            return ("+", offset, size), "<=", ("g", dim)
        last = ("+", ("+", offset, ("*", ("-", size, ("c", 1)), stride)), ("c", 1))
        return ("*", ("min", size, ("c", 1)), last), "<=", ("g", dim)

    def _element(self, op: Any, ir: Any) -> None:
        """A tensor.extract (tensor.insert) reads (writes) an element inside its tensor: a constant
        index below the size; a runtime index is clamped into the tensor (portable/index_safety.py),
        so the dimension must not be empty. The element read is data, no size."""
        extract = op.name == "tensor.extract"
        tensor = op.operands[0 if extract else 1]
        dims = self._dims(tensor)
        if not extract:
            for a, b in zip(dims, self._dims(op.results[0])):
                self.groups.union(a, b)
        for index, dim in zip(list(op.operands)[1 if extract else 2 :], dims):
            term = self._term(index)
            inside: Need = (("+", term, ("c", 1)), "<=", ("g", dim))
            if term[0] == "c":
                self._need(*inside)
                continue
            if not self.groups.natural_term(term):
                self._index_need((term, ">=", ("c", 0)), None)
            self._index_need(inside, (("c", 1), "<=", ("g", dim)))
        if extract and _is_index_like(op.results[0].type):
            self.groups.mark(("i", op.results[0]), "a value read from a tensor (tensor.extract)")

    def _pad(self, op: Any, ir: Any) -> None:
        """A pad's result is its source plus both paddings, neither negative."""
        source, result = op.operands[0], op.results[0]
        dynamic = iter(op.operands[1:])
        ends = []
        for key in ("static_low", "static_high"):
            ends.append([self._term(next(dynamic)) if v == ir.ShapedType.get_dynamic_size() else ("c", v) for v in ir.DenseI64ArrayAttr(op.attributes[key])])
        for axis, (src, res) in enumerate(zip(self._dims(source), self._dims(result))):
            low, high = ends[0][axis], ends[1][axis]
            self._not_negative(low)
            self._not_negative(high)
            if low == ("c", 0) and high == ("c", 0):
                self.groups.union(src, res)
            else:
                self.groups.define(res, ("+", ("+", ("g", src), low), high))

    def _concat(self, op: Any, ir: Any) -> None:
        """A concatenation's result is the sum of its operands along its dimension; the others are equal."""
        along = ir.IntegerAttr(op.attributes["dim"]).value
        result = self._dims(op.results[0])
        total: Term | None = None
        for operand in op.operands:
            for axis, atom in enumerate(self._dims(operand)):
                if axis != along:
                    self.groups.union(atom, result[axis])
            total = ("g", self._dims(operand)[along]) if total is None else ("+", total, ("g", self._dims(operand)[along]))
        if total is not None:
            self.groups.define(result[along], total)

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
                    continue
                linear = _linear(expr, ir)
                if linear is None:
                    if not isinstance(expr, ir.AffineConstantExpr) and operand.type.is_dynamic_dim(axis):
                        self.groups.mark(dims[axis], f"the index expression {expr} of {op.name}")
                    continue
                self._within(linear, dims[axis], loop, amap.n_dims)
        outputs = operands[len(operands) - len(op.results):]
        for result, output in zip(op.results, outputs):
            for a, b in zip(self._dims(result), self._dims(output)):
                self.groups.union(a, b)

    def _within(self, linear: tuple[dict[int, int], int], dim: Atom, loop: Atom, n_loops: int) -> None:
        """An indexing map's `c + sum(c_i * d_i)` inside its operand's dimension for every point of
        a non-empty iteration space."""
        coefficients, constant = linear
        loops = sorted(coefficients) if coefficients else list(range(n_loops))
        if not loops:
            self._need(("c", constant + 1), "<=", ("g", dim))
            return
        guard: Term = ("g", (loop, loops[0]))
        for position in loops[1:]:
            guard = ("min", guard, ("g", (loop, position)))
        guard = ("min", guard, ("c", 1))
        high: Term = ("c", constant)
        low: Term = ("c", constant)
        for position, c in coefficients.items():
            step = ("*", ("c", c), ("-", ("g", (loop, position)), ("c", 1)))
            if c > 0:
                high = ("+", high, step)
            else:
                low = ("+", low, step)
        self._need(("*", guard, ("+", high, ("c", 1))), "<=", ("g", dim))
        if constant < 0 or any(c < 0 for c in coefficients.values()):
            self._need(("*", guard, low), ">=", ("c", 0))


def _linear(expr: Any, ir: Any) -> tuple[dict[int, int], int] | None:
    """An affine expression as {loop position: coefficient} and a constant, None when not linear in the loops."""
    if isinstance(expr, ir.AffineDimExpr):
        return {expr.position: 1}, 0
    if isinstance(expr, ir.AffineConstantExpr):
        return {}, expr.value
    if isinstance(expr, ir.AffineAddExpr):
        a, b = _linear(expr.lhs, ir), _linear(expr.rhs, ir)
        if a is None or b is None:
            return None
        merged = dict(a[0])
        for k, v in b[0].items():
            merged[k] = merged.get(k, 0) + v
        return {k: v for k, v in merged.items() if v}, a[1] + b[1]
    if isinstance(expr, ir.AffineMulExpr):
        a, b = _linear(expr.lhs, ir), _linear(expr.rhs, ir)
        if a is None or b is None:
            return None
        if not a[0]:
            a, b = b, a
        if b[0]:
            return None
        return {k: v * b[1] for k, v in a[0].items() if v * b[1]}, a[1] * b[1]
    return None


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
    derivation.result_exprs.update({atom: dim for atom, dim in stated.items() if isinstance(dim, str) and not SYMBOL.match(dim)})
    stated = {atom: dim for atom, dim in stated.items() if atom not in derivation.result_exprs}
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
    named = {root: name for root, name in names.items() if name in {d for shape in inputs for d in shape}}
    try:
        requires, computed = conditions(derivation, named)
    except Unresolved as exc:
        if origin != "stated":
            raise BuildError(f"the shape contract cannot be derived ({exc})") from None
        requires, computed = [], {}  # the stated contract stands in for what cannot be derived

    def result(k: int, axis: int, size: int | None) -> Dim | None:
        atom = ("out", k, axis)
        if atom in derivation.result_exprs:
            return derivation.result_exprs[atom]
        found = dim(atom, size, False)
        return computed.get(groups.find(atom)) if found is None else found

    results = tuple(tuple(result(k, axis, size) for axis, size in enumerate(spec.shape)) for k, spec in enumerate(signature.results))
    stated_results = [text for text in derivation.result_exprs.values() if isinstance(text, str)]
    requires += [f"{text} >= 0" for text in stated_results]
    contract = ShapeContract(inputs, results, origin)
    bound = set(contract.symbols)
    # A result symbol that only a stated result names is bound by no argument: the result dim is unknown.
    results = tuple(tuple(d if not isinstance(d, str) or not SYMBOL.match(d) or d in bound else None for d in shape) for shape in results)
    return ShapeContract(inputs, results, origin, requires=tuple(dict.fromkeys(requires)))


# --- sizes and conditions as expressions over the symbols ------------------------


class Unresolved(Exception):
    """A size a condition needs is not known in terms of the arguments' dimensions."""


@record
class _Lin:
    """A size as a linear combination of atoms (symbols, or texts of what is not linear) and a constant."""

    terms: dict[str, int]
    const: int = 0

    def plus(self, other: "_Lin", sign: int = 1) -> "_Lin":
        terms = dict(self.terms)
        for atom, c in other.terms.items():
            terms[atom] = terms.get(atom, 0) + sign * c
        return _Lin({a: c for a, c in terms.items() if c}, self.const + sign * other.const)

    def scaled(self, factor: int) -> "_Lin":
        return _Lin({a: c * factor for a, c in self.terms.items() if c * factor}, self.const * factor)

    @property
    def atom(self) -> str | None:
        """The one atom this is, None when it is anything else."""
        return next(iter(self.terms)) if len(self.terms) == 1 and not self.const and next(iter(self.terms.values())) == 1 else None

    def text(self) -> str:
        if self.atom is not None:
            return self.atom
        parts = []
        for atom, c in self.terms.items():
            # an atom is a symbol, a call, or a product, quotient or remainder (which bind tighter than + and -)
            plain = abs(c) == 1 or SYMBOL.match(atom) or atom.startswith(("min(", "max(", "ceil_div("))
            shown = atom if plain else f"({atom})"
            body = shown if abs(c) == 1 else f"{abs(c)} * {shown}"
            parts.append(("- " if c < 0 else "+ ") + body)
        if self.const or not parts:
            parts.append(("- " if self.const < 0 else "+ ") + str(abs(self.const)))
        text = " ".join(parts)
        return text[2:] if text.startswith("+ ") else "-" + text[2:]


#: Operators of size terms on two constants.
_FOLD: dict[str, Callable[[int, int], int]] = {
    "min": min,
    "max": max,
    "//": lambda x, y: x // y,
    "%": lambda x, y: x % y,
    "ceil_div": lambda x, y: -(-x // y),
    "*": lambda x, y: x * y,
}


class _Render:
    """Terms over groups rendered as expressions over the contract's symbols."""

    def __init__(self, groups: Groups, names: Mapping[Atom, str]) -> None:
        self.groups, self.names = groups, names
        #: Atom text -> (operator, its operands, whether it is known not negative).
        self.atoms: dict[str, tuple[str, tuple[_Lin, ...], bool]] = {}
        self.visiting: set[Atom] = set()
        #: Conditions the sizes rendered need (operands of truncating or unsigned arithmetic not negative).
        self.implied: list[str] = []

    def natural(self, lin: _Lin) -> bool:
        return lin.const >= 0 and all(c > 0 and (SYMBOL.match(a) is not None or self.atoms.get(a, ("", (), False))[2]) for a, c in lin.terms.items())

    def group(self, root: Atom) -> _Lin:
        if root in self.groups.size:
            return _Lin({}, self.groups.size[root])
        if root in self.names:
            return _Lin({self.names[root]: 1})
        if root in self.groups.opaque:
            raise Unresolved(self.groups.opaque[root])
        if root in self.visiting:
            raise Unresolved("a size computed from itself")
        self.visiting.add(root)
        try:
            problem = "a size no argument dimension fixes"
            for term in self.groups.defs.get(root, ()):
                mark = len(self.implied)
                try:
                    return self.term(term)
                except Unresolved as exc:
                    del self.implied[mark:]
                    problem = str(exc)
            raise Unresolved(problem)
        finally:
            self.visiting.discard(root)

    def term(self, term: Term) -> _Lin:
        if term[0] == "c":
            return _Lin({}, int(term[1]))
        if term[0] == "g":
            return self.group(self.groups.find(term[1]))
        op, a, b = term[0], self.term(term[1]), self.term(term[2])
        if NATURAL in term[3:]:
            for operand in (a, b):
                text = self._compare(operand, ">=", _Lin({}, 0))
                if text is not None:
                    self.implied.append(text)
        if op == "+":
            return a.plus(b)
        if op == "-":
            return a.plus(b, -1)
        if op == "*" and (not a.terms or not b.terms):
            return b.scaled(a.const) if not a.terms else a.scaled(b.const)
        if not a.terms and not b.terms and (op in ("min", "max") or b.const):
            return _Lin({}, _FOLD[op](a.const, b.const))
        if op in ("min", "max") and a == b or op == "//" and b == _Lin({}, 1):
            return a
        if op == "max" and b == _Lin({}, 0) and self.natural(a):
            return a
        if op == "min" and b == _Lin({}, 0) and self.natural(a):
            return b
        natural = self.natural(a) and self.natural(b)
        args: tuple[_Lin, ...] = (a, b)
        if op in ("min", "max"):  # min(min(a, b), c) is min(a, b, c)
            args = tuple(x for arg in args for x in (self.atoms[arg.atom][1] if arg.atom in self.atoms and self.atoms[arg.atom][0] == op else (arg,)))
        text = f"{op}({', '.join(x.text() for x in args)})" if op in ("min", "max", "ceil_div") else f"{_wrapped(a)} {op} {_wrapped(b)}"
        self.atoms[text] = (op, args, natural or (op in ("min",) and (self.natural(a) or self.natural(b))))
        return _Lin({text: 1})

    def condition(self, left: Term, relation: str, right: Term) -> str | None:
        """A condition's text, None when it always holds."""
        if relation == "<=" and left[0] == "*" and left[1][0] == "min" and left[1][2] == ("c", 1):
            if self.condition(left[2], relation, right) is None:  # holds unguarded: holds
                return None
        lhs, rhs = self.term(left), self.term(right)
        if relation == "==":
            if lhs == rhs:
                return None
            for one, other in ((lhs, rhs), (rhs, lhs)):
                info = self.atoms.get(one.atom or "")
                if info and info[0] in ("min", "max") and other in info[1]:
                    rest = info[1][1] if info[1][0] == other else info[1][0]
                    return self._compare(other, "<=" if info[0] == "min" else ">=", rest)
            return f"{lhs.text()} == {rhs.text()}"
        return self._compare(lhs, relation, rhs)

    def _compare(self, lhs: _Lin, relation: str, rhs: _Lin) -> str | None:
        slack = rhs.plus(lhs, -1) if relation == "<=" else lhs.plus(rhs, -1)
        if self.natural(slack):
            return None
        small, big = (lhs, rhs) if relation == "<=" else (rhs, lhs)
        info = self.atoms.get(small.atom or "")
        if info and info[0] == "min" and big in info[1]:
            return None
        info = self.atoms.get(big.atom or "")
        if info and info[0] == "max" and small in info[1]:
            return None
        if not slack.terms:  # never holds: the kernel cannot be called with any sizes
            return f"{lhs.text()} {relation} {rhs.text()}"
        if rhs.terms and not rhs.const and not lhs.terms:
            return f"{rhs.text()} {'>=' if relation == '<=' else '<='} {lhs.text()}"
        return f"{lhs.text()} {relation} {rhs.text()}"


def _wrapped(lin: _Lin) -> str:
    text = lin.text()
    return text if SYMBOL.match(text) or text.lstrip("-").isdigit() or lin.atom is not None and text.startswith(("min(", "max(", "ceil_div(")) else f"({text})"


def conditions(derivation: Derivation, names: Mapping[Atom, str]) -> tuple[list[str], dict[Atom, str]]:
    """The conditions a kernel needs of its arguments' sizes, as texts over the symbols `names`
    gives group roots, and the expressions of sizes computed from them (by group root);
    Unresolved when a condition needs a size the arguments do not determine. A kernel whose
    arguments are all static has no size to check: a condition on data (a slice at an offset
    read from a tensor) is left to the index safety of its source language."""
    groups = derivation.groups
    render = _Render(groups, names)
    texts: list[str] = []
    static = all(atom is None for shape in derivation.inputs for atom in shape)

    def rendered(left: Term, relation: str, right: Term) -> str | None:
        """A condition's text, after the conditions the sizes in it need; None when it always holds."""
        mark = len(render.implied)
        try:
            text = render.condition(left, relation, right)
        except Unresolved:
            del render.implied[mark:]
            raise
        texts.extend(render.implied[mark:])
        return text

    try:
        for n, (left, relation, right) in enumerate(derivation.needs):
            try:
                try:
                    text = rendered(left, relation, right)
                except Unresolved:
                    if n not in derivation.clamped:
                        raise
                    instead = derivation.clamped[n]  # a data-dependent index, clamped at run time
                    text = None if instead is None else rendered(*instead)
            except Unresolved:
                if static:
                    continue
                raise
            if text is not None:
                texts.append(text)
        computed: dict[Atom, str] = {}
        for root, defs in list(groups.defs.items()):
            root = groups.find(root)
            base: Term | None = ("g", root) if root in groups.size or root in names else None
            for term in defs:
                if base is None:
                    mark = len(render.implied)
                    try:
                        computed[root] = render.term(term).text()
                    except Unresolved:
                        del render.implied[mark:]
                        if len(defs) > 1 and not static:
                            raise
                        continue
                    texts.extend(render.implied[mark:])
                    base = term
                    continue
                try:
                    text = rendered(base, "==", term)
                except Unresolved:
                    if static:
                        continue
                    raise
                if text is not None:
                    texts.append(text)
    except Unresolved as exc:
        raise Unresolved(f"a size computed by {exc}") from None
    return list(dict.fromkeys(texts)), computed
