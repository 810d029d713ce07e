"""GPU families: stages lowered against a placeholder target, and the target attributes in a module.

A family stage is a kernel lowered past the device-independent `flow` phase to
`executable-sources` (the latest phase that does not depend on the GPU model)
for a placeholder target of the family. The placeholder names no real arch; on
the device it is replaced by the real target attribute and compilation
resumes. Target attributes live at exactly these places in an IREE module:

- `hal.device.targets` on the module (before devices are materialised),
- the `initial_value` of each `util.global` holding a `#hal.device.target`,
- the `target` of each `hal.executable.variant`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from portkern.base.errors import BuildError, CompileError, one_line
from portkern.base.records import frozen_record
from portkern.portable.compiler import operations
from portkern.portable.lower import PORTABLE_PHASE

if TYPE_CHECKING:
    from iree.compiler import ir

    from portkern.portable.compiler import Compiler

#: The phase a family stage is stored at.
FAMILY_PHASE = "executable-sources"
#: Module attribute naming the targets to compile for when no flags do.
MODULE_TARGETS = "hal.device.targets"
#: Config key that marks a placeholder executable target.
PLACEHOLDER_KEY = "portkern.placeholder"


@frozen_record
class Family:
    """A GPU family as IREE's HAL names it."""

    name: str
    #: HAL device id ("hip", "cuda"); also the IREE runtime driver.
    device: str
    #: Executable target backend and format.
    backend: str
    format: str
    #: The name written where an arch would be; no real arch looks like it.
    placeholder: str
    #: Arch-independent executable-target config entries every target of the family carries.
    common_config: str = ""

    def executable_target(self, config: str) -> str:
        return f'#hal.executable.target<"{self.backend}", "{self.format}", {{{config}}}>'

    @property
    def placeholder_target(self) -> str:
        """The placeholder `#hal.executable.target` a family stage is lowered for."""
        entries = ", ".join(e for e in (self.common_config, f'{PLACEHOLDER_KEY} = "{self.placeholder}"') if e)
        return self.executable_target(entries)

    def device_target(self, executable_target: str) -> str:
        """The `#hal.device.target` holding one executable target."""
        return f'#hal.device.target<"{self.device}", [{executable_target}]>'


FAMILIES: dict[str, Family] = {
    "amdgpu": Family(
        "amdgpu",
        "hip",
        "rocm",
        "rocm-hsaco-fb",
        "portkern-placeholder-amdgpu",
        'abi = "hip", iree.encoding.resolver = #iree_gpu.gpu_encoding_resolver<>',
    ),
    "cuda": Family("cuda", "cuda", "cuda", "cuda-nvptx-fb", "portkern-placeholder-cuda"),
}


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise CompileError(f"no GPU family {name!r} (known: {', '.join(FAMILIES)})") from None


def target_sites(module: "ir.Module | ir.Operation") -> list[tuple["ir.Operation", str]]:
    """Every (operation, attribute name) holding a target attribute, in program order."""
    found = []
    for op in operations(module):
        attrs = op.attributes
        if op.name == "hal.executable.variant" and "target" in attrs:
            found.append((op, "target"))
        elif op.name == "util.global" and "initial_value" in attrs and str(attrs["initial_value"]).startswith("#hal.device.target<"):
            found.append((op, "initial_value"))
        elif op.name == "builtin.module" and MODULE_TARGETS in attrs:
            found.append((op, MODULE_TARGETS))
    return found


def executable_targets(module: "ir.Module | ir.Operation") -> list[str]:
    """The text of every `hal.executable.variant` target in a module."""
    return [str(op.attributes[name]) for op, name in target_sites(module) if name == "target"]


def attach(module: "ir.Module | ir.Operation", fam: Family, executable_target: str) -> None:
    """Name the target on a module that has no devices yet (phases up to `flow`), in place."""
    from iree.compiler import ir

    op = getattr(module, "operation", module)
    device = _attribute(fam.device_target(executable_target), op.context)
    op.attributes[MODULE_TARGETS] = ir.ArrayAttr.get([device], op.context)


def replace(module: "ir.Module | ir.Operation", fam: Family, executable_target: str, expect: str) -> int:
    """Replace every target attribute, each of which must mention `expect`, in place; return how many."""
    from iree.compiler import ir

    op = getattr(module, "operation", module)
    sites = target_sites(op)
    stray = [str(o.attributes[n])[:120] for o, n in sites if expect not in str(o.attributes[n])]
    if stray:
        raise CompileError(f"module has a target attribute that is not the expected placeholder: {stray[0]}")
    ctx = op.context
    executable = _attribute(executable_target, ctx)
    device = _attribute(fam.device_target(executable_target), ctx)
    for site, name in sites:
        if name == "target":
            site.attributes[name] = executable
        elif name == "initial_value":
            site.attributes[name] = device
        else:
            site.attributes[name] = ir.ArrayAttr.get([device], ctx)
    return len(sites)


def _attribute(text: str, context: Any) -> "ir.Attribute":
    from iree.compiler import ir

    try:
        return ir.Attribute.parse(text, context)
    except ir.MLIRError as exc:
        raise CompileError(f"cannot parse target attribute {text[:80]}...: {one_line(exc, limit=300)}") from None


def has_encodings(flow_bytecode: bytes) -> bool:
    """Whether a flow module carries data-tiling encodings, which IREE resolves per arch
    while lowering to `executable-sources` (so such a module has no arch-independent later stage)."""
    return b"iree_encoding" in flow_bytecode


def lower_family_stage(compiler: "Compiler", flow_bytecode: bytes, fam: Family, name: str) -> "ir.Operation | None":
    """The flow module lowered to `FAMILY_PHASE` for the family's placeholder target.

    None when the module has data-tiling encodings: the device then finalises
    from the flow stage. `compiler` must have no target flags.
    """
    if has_encodings(flow_bytecode):
        return None
    module = compiler.parse(flow_bytecode, name=name)
    attach(module, fam, fam.placeholder_target)
    try:
        lowered = compiler.lower(module, from_phase=PORTABLE_PHASE, to_phase=FAMILY_PHASE, name=name)
    except CompileError as exc:
        raise BuildError(f"{name}: lowering for the {fam.name} placeholder target failed: {exc}") from None
    sites = target_sites(lowered)
    if not sites or any(fam.placeholder not in str(op.attributes[n]) for op, n in sites):
        raise BuildError(f"{name}: the {fam.name} stage does not carry the placeholder target everywhere")
    return lowered
