"""What device code a native blob (an IREE vmfb) holds, and whether it is for a given GPU.

IREE embeds AMD code objects (HSACO: ELF, machine EM_AMDGPU) and, for NVIDIA,
PTX text. An AMD code object names its processor twice: in the ELF header's
`e_flags` and in the `amdhsa.target` of its NT_AMDGPU_METADATA note (msgpack);
the check requires both to be the asked arch. PTX names it in `.target`.
"""

from __future__ import annotations

import re

import msgpack

from portkern.base.errors import CodeObjectError
from portkern.base.records import frozen_record
from portkern.cache.device import DeviceFingerprint
from portkern.jit import elf

EM_AMDGPU = 224
ELFOSABI_AMDGPU_HSA = 64
NT_AMDGPU_METADATA = 32
_MACH_MASK = 0x0FF
_FEATURE_STATES = {0: "unsupported", 1: "any", 2: "off", 3: "on"}
#: `e_flags` bit offsets of the two AMDGPU target features (code object v4+).
_FEATURE_SHIFTS = {"xnack": 8, "sramecc": 10}
MAX_METADATA_BYTES = 4 << 20
MAX_PTX_MODULES = 1024

#: EF_AMDGPU_MACH values -> processor. Read back through llvm-readobj-19 for each
#: value; gfx950's checked on a code object IREE 3.13 built for it.
AMDGPU_MACH: dict[int, str] = {
    0x020: "gfx600", 0x021: "gfx601", 0x03A: "gfx602", 0x022: "gfx700", 0x023: "gfx701",
    0x024: "gfx702", 0x025: "gfx703", 0x026: "gfx704", 0x03B: "gfx705", 0x028: "gfx801",
    0x029: "gfx802", 0x02A: "gfx803", 0x03C: "gfx805", 0x02B: "gfx810", 0x02C: "gfx900",
    0x02D: "gfx902", 0x02E: "gfx904", 0x02F: "gfx906", 0x030: "gfx908", 0x031: "gfx909",
    0x032: "gfx90c", 0x03F: "gfx90a", 0x040: "gfx940", 0x04B: "gfx941", 0x04C: "gfx942",
    0x04F: "gfx950", 0x033: "gfx1010", 0x034: "gfx1011", 0x035: "gfx1012", 0x042: "gfx1013",
    0x036: "gfx1030", 0x037: "gfx1031", 0x038: "gfx1032", 0x039: "gfx1033", 0x03E: "gfx1034",
    0x03D: "gfx1035", 0x045: "gfx1036", 0x041: "gfx1100", 0x046: "gfx1101", 0x047: "gfx1102",
    0x044: "gfx1103", 0x043: "gfx1150", 0x04A: "gfx1151", 0x055: "gfx1152", 0x048: "gfx1200",
    0x04E: "gfx1201",
}  # fmt: skip
AMDGPU_PROCESSORS = frozenset(AMDGPU_MACH.values())

_PTX = re.compile(rb"\.version (\d{1,2}\.\d{1,2})\s*\n\s*\.target (sm_\w{1,8})")
_NOTE_PROCESSOR = re.compile(r"(gfx[0-9a-z]+)((?::[a-z]+[+-])*)$")


@frozen_record
class AmdgpuCode:
    """One AMD code object: its processor by header and by metadata, and its features."""

    offset: int
    size: int
    processor: str
    #: "on", "off", "any" or "unsupported", from `e_flags`.
    xnack: str
    sramecc: str
    #: The metadata note's `amdhsa.target` and the processor it names ("" when absent).
    target: str
    note_processor: str
    code_object_version: int | None
    kernels: tuple[str, ...]
    wavefront_sizes: tuple[int, ...]


@frozen_record
class PtxCode:
    version: str
    target: str


@frozen_record
class DeviceCode:
    """Every piece of device code found in a blob."""

    amdgpu: tuple[AmdgpuCode, ...]
    ptx: tuple[PtxCode, ...]
    #: `e_machine` of every other ELF image (code of CPU targets: 62 x86-64, 183 aarch64).
    other_machines: tuple[int, ...]

    @property
    def archs(self) -> tuple[str, ...]:
        found = [c.processor for c in self.amdgpu] + [c.note_processor for c in self.amdgpu] + [p.target for p in self.ptx]
        return tuple(sorted({a for a in found if a}))

    def summary(self) -> str:
        parts = []
        for code in self.amdgpu:
            feats = ", ".join(f"{n} {getattr(code, n)}" for n in ("xnack", "sramecc") if getattr(code, n) != "unsupported")
            parts.append(f"HSACO {code.processor} ({code.target or 'no metadata'}{'; ' + feats if feats else ''})")
        parts += [f"PTX {p.version} {p.target}" for p in self.ptx]
        parts += [f"ELF {elf.MACHINES.get(m, 'machine')} (machine {m})" for m in self.other_machines]
        return "; ".join(parts) or "no device code"


def inspect(data: bytes) -> DeviceCode:
    """The device code in a native blob."""
    amdgpu, other = [], []
    for image in elf.find(data):
        if image.machine == EM_AMDGPU:
            amdgpu.append(_amdgpu(image))
        else:
            other.append(image.machine)
    ptx = [PtxCode(m.group(1).decode(), m.group(2).decode()) for _, m in zip(range(MAX_PTX_MODULES), _PTX.finditer(data))]
    return DeviceCode(tuple(amdgpu), tuple(ptx), tuple(other))


def _amdgpu(image: elf.Image) -> AmdgpuCode:
    features = {n: _FEATURE_STATES[(image.flags >> s) & 3] for n, s in _FEATURE_SHIFTS.items()}
    target, kernels, waves = "", [], []
    for note in image.notes:
        if note.name == "AMDGPU" and note.type == NT_AMDGPU_METADATA:
            metadata = _metadata(note.desc)
            target = metadata.get("amdhsa.target", "") if isinstance(metadata.get("amdhsa.target"), str) else ""
            for kernel in metadata.get("amdhsa.kernels", ()) if isinstance(metadata.get("amdhsa.kernels"), list) else ():
                if isinstance(kernel, dict):
                    kernels.append(str(kernel.get(".name", "")))
                    if isinstance(kernel.get(".wavefront_size"), int):
                        waves.append(kernel[".wavefront_size"])
    match = _NOTE_PROCESSOR.search(target)
    mach = image.flags & _MACH_MASK
    return AmdgpuCode(
        image.offset,
        image.size,
        AMDGPU_MACH.get(mach, f"unknown-mach-{mach:#x}"),
        features["xnack"],
        features["sramecc"],
        target,
        match.group(1) if match else "",
        image.abi_version + 2 if image.osabi == ELFOSABI_AMDGPU_HSA else None,
        tuple(kernels),
        tuple(sorted(set(waves))),
    )


def _metadata(desc: bytes) -> dict:
    if len(desc) > MAX_METADATA_BYTES:
        return {}
    try:
        value = msgpack.unpackb(
            desc,
            raw=False,
            strict_map_key=False,
            max_str_len=1 << 16,
            max_bin_len=1 << 20,
            max_array_len=1 << 16,
            max_map_len=1 << 16,
            max_ext_len=0,
        )
    except Exception:  # noqa: BLE001 - msgpack raises several unrelated types on bad input
        return {}
    return value if isinstance(value, dict) else {}


def amdgpu_features(target_id_features: str) -> dict[str, str]:
    """`"sramecc+:xnack-"` -> {"sramecc": "on", "xnack": "off"}."""
    states = {}
    for part in filter(None, target_id_features.split(":")):
        states[part[:-1]] = "on" if part.endswith("+") else "off"
    return states


def problem(data: bytes, fingerprint: DeviceFingerprint) -> str | None:
    """Why `data` is not native code for this GPU, or None when it is (or is not GPU code)."""
    if fingerprint.kind == "amdgpu":
        return _amdgpu_problem(inspect(data), fingerprint.arch)
    if fingerprint.kind == "cuda":
        return _cuda_problem(inspect(data), fingerprint.arch)
    return None


def check(data: bytes, fingerprint: DeviceFingerprint) -> None:
    """Raise `CodeObjectError` unless `data` holds device code for exactly this GPU."""
    reason = problem(data, fingerprint)
    if reason is not None:
        raise CodeObjectError(f"native code for {fingerprint.label} is not usable: {reason}")


def _amdgpu_problem(code: DeviceCode, target_id: str) -> str | None:
    processor, _, feature_text = target_id.partition(":")
    wanted = amdgpu_features(feature_text)
    if not code.amdgpu:
        return f"no AMD code object found ({code.summary()})"
    if code.ptx or code.other_machines:
        return f"holds other device code too ({code.summary()})"
    for obj in code.amdgpu:
        if obj.processor != processor or obj.note_processor != processor:
            return f"code object for {obj.processor} (metadata: {obj.target or 'none'}), expected {processor}"
        for name in _FEATURE_SHIFTS:
            state = getattr(obj, name)
            expected = (wanted[name],) if name in wanted else ("any", "unsupported")
            if state not in expected:
                return f"code object has {name} {state}, expected {' or '.join(expected)}"
    return None


def _cuda_problem(code: DeviceCode, arch: str) -> str | None:
    if not code.ptx:
        return f"no PTX found ({code.summary()})"
    if code.amdgpu:
        return f"holds AMD code objects too ({code.summary()})"
    wrong = sorted({p.target for p in code.ptx if p.target != arch})
    if wrong:
        return f"PTX for {', '.join(wrong)}, expected {arch}"
    return None
