"""The build manifest: which kernel sources go into a bundle, and how."""

from __future__ import annotations

from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import yaml

from portkern.base.errors import LaunchSpecError, ManifestError, did_you_mean, one_line
from portkern.base.framing import read_bounded
from portkern.base.records import frozen_record
from portkern.schemas import validator

if TYPE_CHECKING:
    from portkern.portable.launch import KeyPath

#: Source suffix -> kernel kind, for kernels whose manifest entry names no kind.
KIND_BY_SUFFIX = {".mlir": "mlir", ".mlirbc": "mlir", ".onnx": "onnx", ".pt2": "torch", ".cl": "opencl", ".spv": "spirv"}

MAX_MANIFEST_BYTES = 1 << 20


@frozen_record
class KernelSpec:
    """One kernel as the manifest declares it."""

    name: str
    source: Path
    kind: str
    entry: str | None = None
    line: int = 0
    #: Kind-specific fields (e.g. an OpenCL kernel's launch description), as written
    #: (variant sources resolved to absolute paths).
    options: Mapping[str, Any] = field(default_factory=dict)


@frozen_record
class Manifest:
    """A validated manifest; sources are absolute paths that exist."""

    path: Path
    bundle: str
    kernels: tuple[KernelSpec, ...]
    targets: tuple[str, ...] = ("cpu",)


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate a manifest file."""
    path = Path(path)
    data = read_bounded(path, MAX_MANIFEST_BYTES, "manifest", ManifestError)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: cannot read manifest: {exc}") from None
    return parse_manifest(text, path)


def parse_manifest(text: str, path: Path) -> Manifest:
    """Validate manifest text; `path` names it in errors and anchors relative sources."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise ManifestError(_yaml_problem(exc, text, path)) from None
    if root is None:
        raise ManifestError(f"{path}: manifest is empty")
    lines: dict[KeyPath, int] = {}
    data = _to_python(root, (), lines, path)
    for error in sorted(validator("manifest").iter_errors(data), key=lambda e: list(e.absolute_path)):
        where = tuple(error.absolute_path)
        raise ManifestError(f"{path}:{_line(lines, where)}: {_describe(where, error)}")
    kernels = tuple(_kernel(entry, index, lines, path) for index, entry in enumerate(data["kernels"]))
    seen: dict[str, int] = {}
    for kernel in kernels:
        if kernel.name in seen:
            raise ManifestError(
                f"{path}:{kernel.line}: duplicate kernel name {kernel.name!r} "
                f"(first declared on line {seen[kernel.name]})"
            )
        seen[kernel.name] = kernel.line
    return Manifest(path, data["bundle"], kernels, tuple(data.get("targets", ("cpu",))))


def _kernel(entry: dict[str, Any], index: int, lines: dict[KeyPath, int], path: Path) -> KernelSpec:
    line = _line(lines, ("kernels", index))
    source = (path.parent / entry["source"]).resolve()
    kind = entry.get("kind") or KIND_BY_SUFFIX.get(source.suffix)
    if kind is None:
        raise ManifestError(
            f"{path}:{_line(lines, ('kernels', index, 'source'))}: kernels[{index}].source: "
            f"cannot infer the kind of {entry['source']!r}; add `kind:` "
            f"(one of {', '.join(sorted(set(KIND_BY_SUFFIX.values())))})"
        )
    if not source.is_file():
        raise ManifestError(
            f"{path}:{_line(lines, ('kernels', index, 'source'))}: kernels[{index}].source: "
            f"no such file {entry['source']!r} (looked for {source})"
        )
    options = {k: v for k, v in entry.items() if k not in ("name", "source", "kind", "entry")}
    _check_launch(kind, source, options, index, lines, path)
    return KernelSpec(entry["name"], source, kind, entry.get("entry"), line, options)


def _check_launch(kind: str, source: Path, options: dict[str, Any], index: int, lines: dict[KeyPath, int], path: Path) -> None:
    """OpenCL and SPIR-V kernels need a valid launch description; other kinds take none.

    Variant sources are resolved (relative to the manifest) in `options`.
    """
    from portkern.portable.launch import MANIFEST_KEYS, dotted, from_manifest, where_of

    for key in ("shapes", "buckets", "constraints", "unchecked"):
        if kind in ("opencl", "spirv") and key in options:
            raise ManifestError(
                f"{path}:{_line(lines, ('kernels', index, key))}: kernels[{index}].{key}: "
                f"{kind} kernels state their shapes in `args:` and are not tuned"
            )
    if kind not in ("opencl", "spirv"):
        _check_expressions(options, index, lines, path)
        for key in sorted(set(options) & set(MANIFEST_KEYS)):
            raise ManifestError(
                f"{path}:{_line(lines, ('kernels', index, key))}: kernels[{index}].{key}: "
                f"only opencl and spirv kernels take `{key}` (this one is {kind})"
            )
        return
    for variant in options.get("variants", ()):
        if "source" in variant:
            variant["source"] = str((path.parent / variant["source"]).resolve())
    try:
        from_manifest(options, kind, source)
    except LaunchSpecError as exc:
        where = where_of(exc)
        key = f"kernels[{index}]" + (f".{dotted(where)}" if where else "")
        raise ManifestError(f"{path}:{_line(lines, ('kernels', index) + where)}: {key}: {exc}") from None


def _check_expressions(options: dict[str, Any], index: int, lines: dict[KeyPath, int], path: Path) -> None:
    """`shapes:` expressions and `constraints:` conditions must parse (portable/expr.py)."""
    from portkern.portable.expr import parse

    checks: list[tuple[KeyPath, str, Any, bool]] = []
    for name, dims in (options.get("shapes") or {}).items():
        checks += [(("shapes", name, axis), f"shapes.{name}[{axis}]", dim, False) for axis, dim in enumerate(dims) if isinstance(dim, str)]
    checks += [(("constraints", i), f"constraints[{i}]", text, True) for i, text in enumerate(options.get("constraints") or ())]
    for where, shown, text, condition in checks:
        try:
            parse(text, condition=condition)
        except LaunchSpecError as exc:
            raise ManifestError(f"{path}:{_line(lines, ('kernels', index) + where)}: kernels[{index}].{shown}: {text!r} is not valid ({exc})") from None


def _to_python(node: yaml.Node, where: KeyPath, lines: dict[KeyPath, int], path: Path) -> Any:
    """Plain data from a YAML node, recording each value's line and refusing duplicate keys."""
    lines[where] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if not isinstance(key_node, yaml.ScalarNode):
                raise ManifestError(f"{path}:{key_node.start_mark.line + 1}: mapping keys must be plain names")
            if key in result:
                raise ManifestError(f"{path}:{key_node.start_mark.line + 1}: duplicate key {key!r}")
            result[key] = _to_python(value_node, where + (key,), lines, path)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(item, where + (i,), lines, path) for i, item in enumerate(node.value)]
    return yaml.SafeLoader("").construct_object(node) if node.tag != "tag:yaml.org,2002:str" else node.value


def _yaml_problem(exc: yaml.YAMLError, text: str, path: Path) -> str:
    """One line: file, line and column, what PyYAML found, and the offending source line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or one_line(exc)
    if mark is None:
        return f"{path}: not valid YAML: {problem}"
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    started = f" ({context} started on line {context_mark.line + 1})" if context and context_mark else ""
    lines = text.splitlines()
    source = lines[mark.line].rstrip() if mark.line < len(lines) else ""
    shown = f": `{source[:120]}`" if source.strip() else ""
    return f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {problem}{started}{shown}"


def _line(lines: dict[KeyPath, int], where: KeyPath) -> int:
    while where not in lines and where:
        where = where[:-1]
    return lines.get(where, 1)


def _describe(where: KeyPath, error: Any) -> str:
    dotted = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in where).lstrip(".") or "manifest"
    if error.validator == "additionalProperties":
        known = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(known))
        hints = "".join(did_you_mean(key, known) for key in unknown)
        return f"{dotted}: unknown key {', '.join(map(repr, unknown))}{hints} (allowed: {', '.join(known)})"
    if error.validator == "required":
        return f"{dotted}: {error.message}"
    if error.validator == "pattern":
        return f"{dotted}: {error.instance!r} is not {error.schema.get('description') or 'valid'}"
    return f"{dotted}: {error.message}"
