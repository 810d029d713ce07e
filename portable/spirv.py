"""What portkern reads from a SPIR-V module: version, generator, features, kernels and their parameters.

Only the module's header and declarations are read (capabilities, entry
points, execution modes, decorations, types, function parameters), enough to
check a kernel against its launch description and a device against the
features the kernel needs. Function bodies are skipped.
"""

from __future__ import annotations

import struct
from typing import Any

from portkern.base.errors import CompileError
from portkern.base.records import frozen_record

MAGIC = 0x07230203
MAX_MODULE_BYTES = 64 << 20

_OP_ENTRY_POINT, _OP_EXECUTION_MODE, _OP_CAPABILITY = 15, 16, 17
_OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_POINTER = 21, 22, 32
_OP_FUNCTION, _OP_FUNCTION_PARAMETER, _OP_DECORATE = 54, 55, 71
_EXECUTION_MODEL_KERNEL = 6
_MODE_LOCAL_SIZE, _MODE_SUBGROUP_SIZE = 17, 35
_DECORATION_BUILTIN, _DECORATION_FUNC_PARAM_ATTR = 11, 38
_PARAM_ATTR_NO_WRITE = 6

#: SPIR-V storage class -> OpenCL C address space.
STORAGE = {0: "constant", 4: "local", 5: "global", 7: "private", 8: "generic"}
_CAP_FLOAT16, _CAP_FLOAT64 = 9, 10
#: Capabilities that mean the kernel uses sub-groups (Groups, SubgroupDispatch,
#: GroupNonUniform*, Intel's sub-group extensions).
_SUBGROUP_CAPS = frozenset({18, 58, *range(61, 70), 5568, 5569, 5570, 5579, 5580})
#: SubgroupSize, SubgroupMaxSize, NumSubgroups, NumEnqueuedSubgroups, SubgroupId, SubgroupLocalInvocationId.
_SUBGROUP_BUILTINS = frozenset(range(36, 42))
_GENERATORS = {6: "Khronos LLVM/SPIR-V Translator", 7: "Khronos SPIR-V Tools Assembler", 8: "Khronos Glslang"}


@frozen_record
class Param:
    """A kernel parameter's type as OpenCL C would write it."""

    #: "pointer", "scalar" or "other" (vectors, structs, images, samplers, ...).
    kind: str
    #: For scalars and pointees: ("float" | "int", bit width); None otherwise.
    element: tuple[str, int] | None = None
    #: For pointers: the OpenCL address space ("global", "constant", "local", ...).
    space: str | None = None
    #: False when the kernel never writes through it (const, or unused).
    writable: bool = True

    def __str__(self) -> str:
        if self.element is None:
            return "an unsupported type"
        base = f"{self.element[0]}{self.element[1]}"
        return f"__{self.space} {base}*" if self.kind == "pointer" else base


@frozen_record
class Kernel:
    """One kernel entry point."""

    name: str
    params: tuple[Param, ...]
    #: `reqd_work_group_size`, when the kernel declares one.
    local_size: tuple[int, int, int] | None = None
    #: A required sub-group size (Intel's `intel_reqd_sub_group_size`).
    subgroup_size: int | None = None


@frozen_record
class Module:
    """The declarations of a SPIR-V module that portkern uses."""

    version: tuple[int, int]
    generator: str
    generator_version: int
    capabilities: frozenset[int]
    kernels: dict[str, Kernel]
    uses_subgroups: bool

    @property
    def needs_fp64(self) -> bool:
        return _CAP_FLOAT64 in self.capabilities

    @property
    def needs_fp16(self) -> bool:
        return _CAP_FLOAT16 in self.capabilities

    @property
    def version_text(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"


def header_version(data: bytes) -> tuple[int, int]:
    """The SPIR-V version in a module's header, read from its first two words only;
    CompileError if they are not a SPIR-V header."""
    if len(data) < 20 or len(data) % 4 or len(data) > MAX_MODULE_BYTES:
        raise CompileError(f"not a SPIR-V module of a size this reader takes ({len(data)} bytes)")
    order = "<" if struct.unpack_from("<I", data)[0] == MAGIC else ">"
    magic, word = struct.unpack_from(f"{order}2I", data)
    if magic != MAGIC:
        raise CompileError("not a SPIR-V module (bad magic number)")
    return (word >> 16) & 0xFF, (word >> 8) & 0xFF


def read(data: bytes) -> Module:
    """Read a SPIR-V binary (either byte order); CompileError if it is not well-formed."""
    if len(data) > MAX_MODULE_BYTES:
        raise CompileError(f"SPIR-V module of {len(data)} bytes is larger than {MAX_MODULE_BYTES}")
    if len(data) < 20 or len(data) % 4:
        raise CompileError(f"not a SPIR-V module ({len(data)} bytes is not a whole number of words)")
    order = "<" if struct.unpack_from("<I", data)[0] == MAGIC else ">"
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    if words[0] != MAGIC:
        raise CompileError("not a SPIR-V module (bad magic number)")
    try:
        return _read(words)
    except (IndexError, KeyError, UnicodeDecodeError) as exc:
        raise CompileError(f"malformed SPIR-V module ({type(exc).__name__})") from None


def _read(words: tuple[int, ...]) -> Module:
    capabilities: set[int] = set()
    entries: dict[int, str] = {}
    local_sizes: dict[int, tuple[int, int, int]] = {}
    subgroup_sizes: dict[int, int] = {}
    read_only: set[int] = set()
    subgroup_builtin = False
    types: dict[int, tuple[Any, ...]] = {}
    params: dict[int, list[int]] = {}
    param_types: dict[int, int] = {}
    current: int | None = None
    index = 5
    while index < len(words):
        count, opcode = words[index] >> 16, words[index] & 0xFFFF
        if count == 0 or index + count > len(words):
            raise CompileError(f"malformed SPIR-V module (bad instruction length at word {index})")
        op = words[index : index + count]
        index += count
        if opcode == _OP_CAPABILITY:
            capabilities.add(op[1])
        elif opcode == _OP_ENTRY_POINT and op[1] == _EXECUTION_MODEL_KERNEL:
            entries[op[2]] = _string(op[3:])
        elif opcode == _OP_EXECUTION_MODE and op[2] == _MODE_LOCAL_SIZE:
            local_sizes[op[1]] = (op[3], op[4], op[5])
        elif opcode == _OP_EXECUTION_MODE and op[2] == _MODE_SUBGROUP_SIZE:
            subgroup_sizes[op[1]] = op[3]
        elif opcode == _OP_DECORATE and op[2] == _DECORATION_FUNC_PARAM_ATTR and op[3] == _PARAM_ATTR_NO_WRITE:
            read_only.add(op[1])
        elif opcode == _OP_DECORATE and op[2] == _DECORATION_BUILTIN and op[3] in _SUBGROUP_BUILTINS:
            subgroup_builtin = True
        elif opcode == _OP_TYPE_INT:
            types[op[1]] = ("int", op[2])
        elif opcode == _OP_TYPE_FLOAT:
            types[op[1]] = ("float", op[2])
        elif opcode == _OP_TYPE_POINTER:
            types[op[1]] = ("pointer", op[2], op[3])
        elif opcode == _OP_FUNCTION:
            current = op[2]
            params[current] = []
        elif opcode == _OP_FUNCTION_PARAMETER and current is not None:
            params[current].append(op[2])
            param_types[op[2]] = op[1]
    kernels = {}
    for function, name in entries.items():
        kernels[name] = Kernel(
            name,
            tuple(_param(types, param_types[p], p not in read_only) for p in params.get(function, ())),
            local_sizes.get(function),
            subgroup_sizes.get(function),
        )
    version = ((words[1] >> 16) & 0xFF, (words[1] >> 8) & 0xFF)
    tool = words[2] >> 16
    return Module(
        version,
        _GENERATORS.get(tool, f"SPIR-V generator {tool}"),
        words[2] & 0xFFFF,
        frozenset(capabilities),
        kernels,
        subgroup_builtin or bool(capabilities & _SUBGROUP_CAPS),
    )


def _param(types: dict[int, tuple[Any, ...]], type_id: int, writable: bool) -> Param:
    found = types.get(type_id)
    if found is None:
        return Param("other")
    if found[0] == "pointer":
        pointee = types.get(found[2])
        element = pointee if pointee is not None and pointee[0] in ("int", "float") else None
        return Param("pointer", element, STORAGE.get(found[1], f"storage-class-{found[1]}"), writable)
    return Param("scalar", found)


def _string(words: tuple[int, ...]) -> str:
    raw = b"".join(struct.pack("<I", w) for w in words)
    return raw.split(b"\0", 1)[0].decode("utf-8")
