"""Launch descriptions of OpenCL kernels: arguments, result shapes, work sizes, variants.

An OpenCL kernel cannot say what its arguments mean, so its manifest entry
does: each argument is a buffer (dtype, role `in`/`out`/`inout`, shape) or a
scalar (dtype, and either a `value` computed from shapes or nothing, when the
caller passes it). Shapes, scalar values, the global size and `requires`
conditions are expressions (`portkern.portable.expr`) over symbols that the
input shapes bind: `shape: [M, K]` binds M and K.

The same description is stored in the bundle (`KernelRecord.launch`, schema
`$defs/launch`) with one entry per variant (sub-group size, local size, and
the indices of the variant's stages), and is checked again on the device.

A kernel with a parameter space (`tune:` with `params:` and `restrict:`) has
one variant per valid point of the space, the default point first; each
point's parameters are `-D` definitions and symbols of `global:`, `local:`,
`requires:` and scalar values. A point is named on the device by its kernel
config string (`point_config`), which the tuner's OpenCL family also writes.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import field
from pathlib import Path
from typing import Any, Mapping, Sequence

from portkern.base.errors import LaunchSpecError, MalformedBundleError
from portkern.base.records import frozen_record, to_plain, wire
from portkern.portable import expr
from portkern.portable.bundle import KernelRecord, Signature, TensorSpec
from portkern.schemas import schema

BUFFER_ROLES = ("in", "out", "inout")
#: Sub-group (wave) sizes a variant may be built for.
SUBGROUP_SIZES = (32, 64)
MAX_ARGS = 64
MAX_RANK = 8
MAX_WORK_DIMS = 3
MAX_LOCAL = 1 << 16
MAX_VARIANTS = 8
#: Most valid points a parameter space may have (each is compiled on the build host).
MAX_POINTS = 256
#: Most combinations of parameter values examined (before `restrict:`).
MAX_COMBINATIONS = 1 << 16
MAX_PARAMS = 8
MAX_PARAM_VALUES = 64
#: Kernel config strings of points: `0=<POINT_FAMILY>:v<POINT_VERSION>:NAME=value,...`.
POINT_FAMILY, POINT_VERSION = "opencl", 1
#: The kernel config of the default point (candidate 0).
DEFAULT_CONFIG = "default"
#: Most bytes the buffers of one call at the tuning shapes (`tune: at:`) may take.
MAX_TUNING_BYTES = 1 << 30
#: Element kind and bits of each dtype, as OpenCL C declares them.
ELEMENTS = {
    "float16": ("float", 16), "float32": ("float", 32), "float64": ("float", 64),
    "int8": ("int", 8), "uint8": ("int", 8), "bool": ("int", 8),
    "int16": ("int", 16), "uint16": ("int", 16), "int32": ("int", 32), "uint32": ("int", 32),
    "int64": ("int", 64), "uint64": ("int", 64),
}  # fmt: skip
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_DEFINE_VALUE = re.compile(r"^[A-Za-z0-9_.+-]{0,64}$")
#: Manifest keys that describe an OpenCL launch (refused for other kinds).
MANIFEST_KEYS = ("args", "global", "local", "requires", "defines", "variants", "tune")


#: Where in a manifest entry or bundle record a value lies: keys and list indices (`("args", 2, "shape", 0)`).
KeyPath = tuple[str | int, ...]


def dtypes() -> tuple[str, ...]:
    """The element types a bundle can describe."""
    return tuple(schema("bundle")["$defs"]["dtype"]["enum"])


def _fail(where: KeyPath, message: str) -> LaunchSpecError:
    error = LaunchSpecError(message)
    error.where = where  # type: ignore[attr-defined]
    return error


def where_of(error: LaunchSpecError) -> KeyPath:
    """The key path (e.g. `("args", 2, "shape", 0)`) an error is about."""
    return getattr(error, "where", ())


def dotted(where: Sequence[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in where).lstrip(".")


def _texts(exprs: Sequence[expr.Expr]) -> list[str]:
    return [e.text for e in exprs]


def _text(e: expr.Expr) -> str:
    return e.text


@frozen_record
class LaunchArg:
    """One kernel argument: a buffer, or a scalar."""

    name: str
    dtype: str
    #: "in", "out" or "inout" for a buffer; None for a scalar.
    role: str | None = field(default=None, metadata=wire(omit=True))
    #: A buffer's shape (written for buffers only).
    shape: tuple[expr.Expr, ...] = field(default=(), metadata=wire(omit=lambda arg: not arg.is_buffer, encode=_texts))
    #: A scalar's value computed from shapes; None when the caller passes it (written for scalars only).
    value: expr.Expr | None = field(default=None, metadata=wire(omit=lambda arg: arg.is_buffer or arg.value is None, encode=_text))

    @property
    def is_buffer(self) -> bool:
        return self.role is not None

    @property
    def is_input(self) -> bool:
        """Whether the caller passes it (input buffers and scalars without a value)."""
        return self.role in ("in", "inout") or (self.role is None and self.value is None)

    @property
    def is_output(self) -> bool:
        return self.role in ("out", "inout")

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)


@frozen_record
class Variant:
    """One build of the kernel: for a sub-group size (or any), or for one point of its parameter space,
    with its local size and stages."""

    subgroup_size: int | None
    #: Work-group size; None lets the driver choose.
    local: tuple[int, ...] | None
    #: Indices into the kernel record's stages (empty before the build).
    stages: tuple[int, ...] = ()
    #: The point of the parameter space this variant is built for, in the space's order (empty: no space).
    params: tuple[tuple[str, int], ...] = field(default=(), metadata=wire(omit=True))

    @property
    def config(self) -> str:
        """The kernel config string naming this point (tuning records and cache keys hold it)."""
        return point_config(self.params)

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)


def point_text(params: Sequence[tuple[str, int]]) -> str:
    """A point's parameters as `NAME=value,...` (the fields of its perf config)."""
    return ",".join(f"{name}={value}" for name, value in params)


def point_config(params: Sequence[tuple[str, int]]) -> str:
    """The kernel config string of a point: `0=opencl:v1:NAME=value,...` (the kernel is its one dispatch)."""
    return f"0={POINT_FAMILY}:v{POINT_VERSION}:{point_text(params)}"


@frozen_record
class VariantSource:
    """What the build host compiles for one variant."""

    source: Path
    #: Preprocessor definitions, in order (kernel-wide ones first).
    defines: tuple[tuple[str, str], ...] = ()


@frozen_record
class Launch:
    """A checked launch description."""

    args: tuple[LaunchArg, ...]
    global_size: tuple[expr.Expr, ...] = field(metadata=wire(name="global", encode=_texts))
    requires: tuple[expr.Expr, ...] = field(default=(), metadata=wire(encode=_texts))
    variants: tuple[Variant, ...] = ()
    #: Symbol values of the shapes a parameter space is tuned at (`tune: at:`), written as a mapping.
    tune_at: tuple[tuple[str, int], ...] = field(default=(), metadata=wire(omit=True, encode=dict))

    @property
    def tunable(self) -> bool:
        """Whether the kernel has a parameter space (one variant per point, the default first)."""
        return bool(self.variants and self.variants[0].params)

    @property
    def params(self) -> tuple[str, ...]:
        """The parameter names of the space, in order (empty without one)."""
        return tuple(name for name, _ in self.variants[0].params) if self.tunable else ()

    def point(self, config: str) -> Variant:
        """The variant a kernel config names ("default": the default point); LaunchSpecError if none."""
        if config == DEFAULT_CONFIG:
            return self.variants[0]
        if self.tunable:
            for variant in self.variants:
                if variant.config == config:
                    return variant
        raise LaunchSpecError(f"config {config[:200]!r} names no point of this kernel's parameter space")

    def tuning_shapes(self) -> list[tuple[int, ...]]:
        """The input buffer shapes a parameter space is tuned at (symbols from `tune_at`); LaunchSpecError
        when a symbol has no value or the buffers would hold more than MAX_TUNING_BYTES."""
        symbols = dict(self.tune_at)
        shapes = {a.name: tuple(d.evaluate(symbols, {}) for d in a.shape) for a in self.inputs if a.is_buffer}
        total = 0
        for arg in self.args:
            if arg.is_buffer:
                shape = shapes.get(arg.name) or tuple(d.evaluate(symbols, shapes) for d in arg.shape)
                total += _product(shape) * ELEMENTS[arg.dtype][1] // 8
        if total > MAX_TUNING_BYTES:
            raise LaunchSpecError(f"the buffers at the tuning shapes would take {total} bytes; at most {MAX_TUNING_BYTES}")
        return list(shapes.values())

    @property
    def inputs(self) -> tuple[LaunchArg, ...]:
        return tuple(a for a in self.args if a.is_input)

    @property
    def outputs(self) -> tuple[LaunchArg, ...]:
        return tuple(a for a in self.args if a.is_output)

    @property
    def symbols(self) -> frozenset[str]:
        """Names bound by input shapes."""
        return _symbols(self.args)

    def signature(self) -> Signature:
        """Inputs (what the caller passes) and results; a dimension that is not a constant is dynamic."""

        def spec(arg: LaunchArg) -> TensorSpec:
            return TensorSpec(tuple(d.constant() for d in arg.shape), arg.dtype)

        return Signature(tuple(spec(a) for a in self.inputs), tuple(spec(a) for a in self.outputs))

    def to_dict(self) -> dict[str, Any]:
        """The description as bundle metadata (`from_dict` reads it back, checking it)."""
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Launch":
        """A launch description from a bundle record (already schema-checked), checked again."""
        variants = tuple(
            Variant(
                v.get("subgroup_size"), _local(v.get("local"), ("variants", i, "local")), tuple(v.get("stages", ())),
                tuple((str(name), int(value)) for name, value in v.get("params", ())),
            )
            for i, v in enumerate(data.get("variants", ()))
        )
        if not variants:
            raise _fail(("variants",), "at least one variant is needed")
        params = frozenset(name for name, _ in variants[0].params)
        launch = _common(data, params)
        tune_at = tuple((str(k), int(v)) for k, v in (data.get("tune_at") or {}).items())
        _check_variants(variants, launch.global_size)
        checked = Launch(launch.args, launch.global_size, launch.requires, variants, tune_at)
        if checked.tunable:
            if {k for k, _ in tune_at} != launch.symbols:
                raise _fail(("tune_at",), f"must give every shape symbol ({', '.join(sorted(launch.symbols))}) a size")
            checked.tuning_shapes()
        return checked


def from_manifest(options: Mapping[str, Any], kind: str, source: Path) -> tuple[Launch, tuple[VariantSource, ...]]:
    """The launch description of a manifest entry and what to build per variant.

    `options` holds the entry's launch keys, with variant sources as absolute
    paths; `source` is the kernel's resolved source. Errors carry the key path.
    """
    for key in ("args", "global"):
        if key not in options:
            raise _fail((), f"{kind} kernels need `{key}:`")
    if "tune" in options:
        return _space(options, kind, source)
    launch = _common(options)
    local = _local(options.get("local"), ("local",))
    defines = _defines(options.get("defines"), ("defines",), kind)
    specs = options.get("variants")
    variants: tuple[Variant, ...]
    sources: tuple[VariantSource, ...]
    if not specs:
        variants = (Variant(None, local),)
        sources = (VariantSource(source, defines),)
    else:
        listed: list[Variant] = []
        built: list[VariantSource] = []
        for index, item in enumerate(specs):
            at: KeyPath = ("variants", index)
            size = item.get("subgroup_size")
            listed.append(Variant(size, _local(item["local"], at + ("local",)) if "local" in item else local))
            extra = _defines(item.get("defines"), at + ("defines",), kind)
            path = source
            if "source" in item:
                path = Path(item["source"])
                if not path.is_absolute() or not path.is_file():
                    raise _fail(at + ("source",), f"no such file {item['source']!r} (looked for {path})")
            built.append(VariantSource(path, defines + extra + (("PORTKERN_SUBGROUP_SIZE", str(size)),)))
        variants, sources = tuple(listed), tuple(built)
        if any(v.subgroup_size is None for v in variants):
            raise _fail(("variants",), "every variant needs a `subgroup_size`")
    _check_variants(variants, launch.global_size)
    return Launch(launch.args, launch.global_size, launch.requires, variants), sources


def _space(options: Mapping[str, Any], kind: str, source: Path) -> tuple[Launch, tuple[VariantSource, ...]]:
    """A kernel with a parameter space: one variant per valid point, the default point first."""
    tune = options["tune"]
    if kind != "opencl":
        raise _fail(("tune",), "only OpenCL C sources have a parameter space (its parameters are -D definitions)")
    if not isinstance(tune, Mapping) or set(tune) - {"params", "restrict", "at"} or "params" not in tune:
        raise _fail(("tune",), "must be a mapping with `params:` and optionally `restrict:` and `at:`")
    if "variants" in options:
        raise _fail(("variants",), "a kernel with a parameter space (`tune:`) cannot also have sub-group `variants:`")
    space = _params(tune["params"])
    combinations = 1
    for _, values in space:
        combinations *= len(values)
    if combinations > MAX_COMBINATIONS:
        raise _fail(("tune", "params"), f"{combinations} combinations of values; at most {MAX_COMBINATIONS} (use fewer values)")
    names = frozenset(name for name, _ in space)
    launch = _common(options, names)
    clash = sorted(names & launch.symbols)
    if clash:
        raise _fail(("tune", "params", clash[0]), f"{clash[0]} is also a shape symbol; name the parameter differently")
    restrict = _exprs(tune.get("restrict", []), ("tune", "restrict"), 0, 32, condition=True)
    for index, item in enumerate(restrict):
        _check_refs(item, names, {}, ("tune", "restrict", index), "no parameter of `tune: params:` names")
    local = _local_exprs(options.get("local"), names)
    at = _tune_at(tune.get("at"), launch)
    defines = _defines(options.get("defines"), ("defines",), kind)
    given = {name: value for name, value in defines if name in names}
    kept = tuple((name, value) for name, value in defines if name not in names)
    points: list[Variant] = []
    for values in itertools.product(*(v for _, v in space)):
        point = tuple(zip((n for n, _ in space), values))
        variant = _point(point, restrict, local, launch, at)
        if variant is not None:
            points.append(variant)
    if not points:
        raise _fail(("tune", "restrict"), "no point of the parameter space is valid (restrictions, work-group sizes, whole work-groups at the tuning shapes)")
    if len(points) > MAX_POINTS:
        raise _fail(("tune", "params"), f"the space has {len(points)} valid points; at most {MAX_POINTS} are built (restrict it)")
    default = next((p for p in points if {n: str(v) for n, v in p.params} == given), points[0])
    points.remove(default)
    points.insert(0, default)
    sources = tuple(VariantSource(source, kept + tuple((n, str(v)) for n, v in p.params)) for p in points)
    return Launch(launch.args, launch.global_size, launch.requires, tuple(points), at), sources


def _params(value: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    at = ("tune", "params")
    if not isinstance(value, Mapping) or not 1 <= len(value) <= MAX_PARAMS:
        raise _fail(at, f"must map 1 to {MAX_PARAMS} parameter names to lists of integer values")
    found = []
    for name, values in value.items():
        if not isinstance(name, str) or not _IDENTIFIER.match(name) or name.startswith("PORTKERN_") or name in expr.FUNCTIONS:
            raise _fail(at + (str(name),), f"{name!r} is not a parameter name you may use (a C identifier, not PORTKERN_*)")
        if (
            not isinstance(values, list)
            or not 1 <= len(values) <= MAX_PARAM_VALUES
            or not all(type(v) is int and 0 <= v <= MAX_LOCAL for v in values)
            or len(set(values)) != len(values)
        ):
            raise _fail(at + (name,), f"must be a list of 1 to {MAX_PARAM_VALUES} distinct integers from 0 to {MAX_LOCAL}")
        found.append((name, tuple(values)))
    return tuple(found)


def _local_exprs(value: Any, names: frozenset[str]) -> tuple[expr.Expr, ...] | None:
    if value is None:
        return None
    items = _exprs(value, ("local",), 1, MAX_WORK_DIMS, condition=False)
    for index, item in enumerate(items):
        _check_refs(item, names, {}, ("local", index), "no parameter of `tune: params:` names")
    return items


def _tune_at(value: Any, launch: Launch) -> tuple[tuple[str, int], ...]:
    """The symbol values of the shapes the space is tuned at; every shape symbol needs one."""
    symbols = sorted(launch.symbols)
    if value is None and not symbols:
        return ()
    if not isinstance(value, Mapping) or sorted(value) != symbols or not all(type(v) is int and 1 <= v <= 1 << 24 for v in value.values()):
        raise _fail(("tune", "at"), f"must give every shape symbol ({', '.join(symbols)}) the integer size (1 to {1 << 24}) to tune at")
    at = tuple((name, value[name]) for name in symbols)
    try:
        Launch(launch.args, launch.global_size, launch.requires, (), at).tuning_shapes()
    except LaunchSpecError as exc:
        raise _fail(("tune", "at"), str(exc)) from None
    return at


def _point(
    point: tuple[tuple[str, int], ...], restrict: Sequence[expr.Expr], local: Sequence[expr.Expr] | None, launch: Launch, at: tuple[tuple[str, int], ...]
) -> Variant | None:
    """The variant of a point, None when the point is not valid: a restriction fails, its work-group
    is empty or too large, or at the tuning shapes its launch breaks `requires` or is not whole work-groups."""
    values = dict(point)
    try:
        if not all(r.evaluate(values, {}) for r in restrict):
            return None
        sizes = None if local is None else tuple(e.evaluate(values, {}) for e in local)
        if sizes is not None and (len(sizes) != len(launch.global_size) or min(sizes) < 1 or _product(sizes) > MAX_LOCAL):
            return None
        symbols = {**dict(at), **values}
        shapes = {a.name: tuple(d.evaluate(symbols, {}) for d in a.shape) for a in launch.inputs if a.is_buffer}
        if not all(c.evaluate(symbols, shapes) for c in launch.requires):
            return None
        grid = [g.evaluate(symbols, shapes) for g in launch.global_size]
        if min(grid) < 1 or sizes is not None and any(g % s for g, s in zip(grid, sizes)):
            return None
    except LaunchSpecError:
        return None
    return Variant(None, sizes, (), point)


def launch_of(record: KernelRecord) -> Launch:
    """An OpenCL kernel record's launch description, checked against its stages and signature."""
    if not record.launch:
        raise MalformedBundleError(f"kernel {record.name!r} ({record.kind}) has no launch description")
    try:
        launch = Launch.from_dict(record.launch)
    except LaunchSpecError as exc:
        raise MalformedBundleError(f"kernel {record.name!r}: launch.{dotted(where_of(exc))}: {exc}") from None
    for index, variant in enumerate(launch.variants):
        formats = []
        for stage in variant.stages:
            if stage >= len(record.stages):
                raise MalformedBundleError(f"kernel {record.name!r}: variant {index} refers to stage {stage}, which does not exist")
            formats.append(record.stages[stage].format)
        if formats.count("spirv") != 1 or len(set(formats)) != len(formats):
            raise MalformedBundleError(
                f"kernel {record.name!r}: variant {index} must have one SPIR-V stage and at most one stage of each other format"
            )
    if launch.signature() != record.signature:
        raise MalformedBundleError(f"kernel {record.name!r}: signature {record.signature} does not match its launch description")
    return launch


# --- checks shared by manifests and bundles ----------------------------------


def _common(data: Mapping[str, Any], params: frozenset[str] = frozenset()) -> Launch:
    """Arguments, global size and conditions, checked; variants left empty. `params` (a parameter
    space's names) may appear in the global size, conditions and scalar values, not in shapes."""
    raw_args = data.get("args")
    if not isinstance(raw_args, list) or not 1 <= len(raw_args) <= MAX_ARGS:
        raise _fail(("args",), f"needs a list of 1 to {MAX_ARGS} arguments")
    args = tuple(_arg(item, ("args", i)) for i, item in enumerate(raw_args))
    seen: set[str] = set()
    for i, arg in enumerate(args):
        if arg.name in seen:
            raise _fail(("args", i, "name"), f"two arguments are named {arg.name!r}")
        seen.add(arg.name)
    if not any(a.is_output for a in args):
        raise _fail(("args",), "no argument has role `out` or `inout`, so the kernel would return nothing")
    symbols = _symbols(args)
    shapes = {a.name: len(a.shape) for a in args if a.is_input and a.is_buffer}
    for i, arg in enumerate(args):
        for axis, dim in enumerate(arg.shape):
            _check_refs(dim, symbols, shapes, ("args", i, "shape", axis))
        if arg.value is not None:
            _check_refs(arg.value, symbols | params, shapes, ("args", i, "value"))
    global_size = _exprs(data.get("global"), ("global",), 1, MAX_WORK_DIMS, condition=False)
    requires = _exprs(data.get("requires", []), ("requires",), 0, 32, condition=True)
    for name, exprs in (("global", global_size), ("requires", requires)):
        for index, item in enumerate(exprs):
            _check_refs(item, symbols | params, shapes, (name, index))
    return Launch(args, global_size, requires)


def _symbols(args: Sequence[LaunchArg]) -> frozenset[str]:
    return frozenset(d.text for a in args if a.is_buffer and a.is_input for d in a.shape if d.is_symbol)


def _arg(item: Any, at: KeyPath) -> LaunchArg:
    if not isinstance(item, Mapping):
        raise _fail(at, "an argument must be a mapping with name and dtype")
    unknown = sorted(set(item) - {"name", "dtype", "role", "shape", "value"})
    if unknown:
        raise _fail(at, f"unknown key {', '.join(map(repr, unknown))} (allowed: dtype, name, role, shape, value)")
    name, dtype = item.get("name"), item.get("dtype")
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise _fail(at + ("name",), f"{name!r} is not a C identifier")
    if dtype not in dtypes():
        raise _fail(at + ("dtype",), f"{dtype!r} is not one of {', '.join(dtypes())}")
    role = item.get("role")
    if role is None:
        if "shape" in item:
            raise _fail(at + ("shape",), "a scalar has no shape; give buffers a `role` (in, out, inout)")
        value = item.get("value")
        return LaunchArg(name, dtype, None, (), None if value is None else _parse(value, at + ("value",)))
    if role not in BUFFER_ROLES:
        raise _fail(at + ("role",), f"{role!r} is not one of {', '.join(BUFFER_ROLES)}")
    if "value" in item:
        raise _fail(at + ("value",), "a buffer has no value")
    shape = item.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_RANK:
        raise _fail(at + ("shape",), f"a buffer needs a `shape`: a list of at most {MAX_RANK} dimensions")
    return LaunchArg(name, dtype, role, tuple(_parse(d, at + ("shape", k)) for k, d in enumerate(shape)))


def _parse(text: Any, at: KeyPath, condition: bool = False) -> expr.Expr:
    try:
        return expr.parse(text, condition=condition)
    except LaunchSpecError as exc:
        raise _fail(at, str(exc)) from None


def _exprs(items: Any, at: KeyPath, least: int, most: int, condition: bool) -> tuple[expr.Expr, ...]:
    if not isinstance(items, list) or not least <= len(items) <= most:
        raise _fail(at, f"needs a list of {least} to {most} {'conditions' if condition else 'expressions'}")
    return tuple(_parse(item, at + (i,), condition) for i, item in enumerate(items))


def _check_refs(item: expr.Expr, symbols: frozenset[str], shapes: Mapping[str, int], at: KeyPath, binds: str = "no input shape binds") -> None:
    unbound = sorted(item.symbols - symbols)
    if unbound:
        known = ", ".join(sorted(symbols)) or "none"
        raise _fail(at, f"`{item}` uses {', '.join(unbound)}, which {binds} (bound: {known})")
    for arg, axis in sorted(item.dims):
        if arg not in shapes:
            raise _fail(at, f"`{item}` reads {arg}.shape, but {arg} is not an input buffer")
        if axis >= shapes[arg]:
            raise _fail(at, f"`{item}` reads {arg}.shape[{axis}], but {arg} has {shapes[arg]} dimensions")


def _local(value: Any, at: KeyPath) -> tuple[int, ...] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= MAX_WORK_DIMS
        or not all(type(v) is int and 1 <= v <= MAX_LOCAL for v in value)
    ):
        raise _fail(at, f"must be a list of 1 to {MAX_WORK_DIMS} integers from 1 to {MAX_LOCAL}")
    return tuple(value)


def _defines(value: Any, at: KeyPath, kind: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if kind != "opencl":
        raise _fail(at, "only OpenCL C sources take preprocessor definitions")
    if not isinstance(value, Mapping):
        raise _fail(at, "must map macro names to values")
    found = []
    for name, raw in value.items():
        text = "" if raw is None else str(raw).lower() if isinstance(raw, bool) else str(raw)
        if not _IDENTIFIER.match(str(name)) or str(name).startswith("PORTKERN_"):
            raise _fail(at + (str(name),), f"{name!r} is not a macro name you may define")
        if not _DEFINE_VALUE.match(text):
            raise _fail(at + (str(name),), f"{raw!r} is not a plain value (letters, digits, _ . + -)")
        found.append((str(name), text))
    return tuple(found)


def _check_variants(variants: Sequence[Variant], global_size: Sequence[expr.Expr]) -> None:
    if variants[0].params:
        _check_points(variants, global_size)
        return
    if len(variants) > MAX_VARIANTS:
        raise _fail(("variants",), f"at most {MAX_VARIANTS} variants")
    sizes = [v.subgroup_size for v in variants]
    for index, variant in enumerate(variants):
        if variant.subgroup_size is not None and variant.subgroup_size not in SUBGROUP_SIZES:
            raise _fail(("variants", index, "subgroup_size"), f"must be one of {', '.join(map(str, SUBGROUP_SIZES))}")
        if variant.subgroup_size in sizes[:index]:
            raise _fail(("variants", index, "subgroup_size"), f"two variants for sub-group size {variant.subgroup_size}")
        if variant.subgroup_size is None and len(variants) > 1:
            raise _fail(("variants", index, "subgroup_size"), "only a single variant may leave the sub-group size open")
        if variant.local is not None and len(variant.local) != len(global_size):
            where = ("variants", index, "local") if len(variants) > 1 else ("local",)
            raise _fail(where, f"has {len(variant.local)} dimensions, the global size has {len(global_size)}")
        if variant.local is not None and _product(variant.local) > MAX_LOCAL:
            raise _fail(("variants", index, "local"), f"work-group of {_product(variant.local)} items is larger than {MAX_LOCAL}")


def _check_points(variants: Sequence[Variant], global_size: Sequence[expr.Expr]) -> None:
    """The variants of a parameter space: distinct points over the same names, no sub-group sizes."""
    if len(variants) > MAX_POINTS:
        raise _fail(("variants",), f"at most {MAX_POINTS} points of a parameter space")
    names = [name for name, _ in variants[0].params]
    if len(names) > MAX_PARAMS or len(set(names)) != len(names) or not all(_IDENTIFIER.match(n) for n in names):
        raise _fail(("variants", 0, "params"), f"must name 1 to {MAX_PARAMS} distinct parameters")
    seen = set()
    for index, variant in enumerate(variants):
        if [name for name, _ in variant.params] != names or variant.params in seen:
            raise _fail(("variants", index, "params"), "every point must set the same parameters, and no point may repeat")
        if variant.subgroup_size is not None:
            raise _fail(("variants", index, "subgroup_size"), "points of a parameter space have no sub-group size")
        if variant.local is not None and (len(variant.local) != len(global_size) or _product(variant.local) > MAX_LOCAL):
            raise _fail(("variants", index, "local"), f"must have {len(global_size)} dimensions and at most {MAX_LOCAL} items")
        seen.add(variant.params)


def _product(values: Sequence[int]) -> int:
    result = 1
    for value in values:
        result *= value
    return result
