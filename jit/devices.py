"""Device specs ("cpu", "cpu:haswell", "amdgpu:gfx942", "gfx942", "cuda:sm_90", "opencl",
"opencl:0", ...) and the backends that probe and target them.

A backend is a module with `KIND`, `probe(store) -> Probe` and
`target(arch, store) -> Target` (`arch` None: the local device).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from portkern.base.errors import DeviceError
from portkern.cache.store import Store
from portkern.jit.target import Probe, Target

_BACKENDS = {
    "cpu": "portkern.jit.cpu",
    "amdgpu": "portkern.jit.amdgpu",
    "cuda": "portkern.jit.cuda",
    "opencl": "portkern.jit.opencl",
}
_ALIASES = {"host": "cpu", "llvm-cpu": "cpu", "hip": "amdgpu", "rocm": "amdgpu", "nvidia": "cuda"}
#: A bare arch name names its kind: "gfx942" is "amdgpu:gfx942", "sm_90" is "cuda:sm_90".
_ARCH_PREFIXES = {"gfx": "amdgpu", "sm_": "cuda"}



def parse(spec: str) -> tuple[str, str | None]:
    """`"kind"` or `"kind:arch"` -> (kind, arch or None)."""
    if not isinstance(spec, str) or not spec.strip():
        raise DeviceError(f"device must be a string such as 'cpu' or 'cpu:znver4', got {spec!r}")
    kind, _, arch = spec.strip().partition(":")
    kind = _ALIASES.get(kind.lower(), kind.lower())
    for prefix, named in _ARCH_PREFIXES.items():
        if kind.startswith(prefix) and kind not in _BACKENDS:
            kind, arch = named, spec.strip()
    if kind not in _BACKENDS:
        raise DeviceError(f"unknown device kind {kind!r} in {spec!r} (known: {', '.join(_BACKENDS)})")
    return kind, (arch or None)


def split(text: str) -> list[str]:
    """Device specs from a comma-separated list ("gfx942,cpu:znver4")."""
    return [part.strip() for part in text.split(",") if part.strip()]


def backend(kind: str) -> ModuleType:
    return importlib.import_module(_BACKENDS[kind])


def resolve(spec: str, store: Store | None = None) -> Target:
    """The target a device spec names."""
    kind, arch = parse(spec)
    return backend(kind).target(arch, store)


def probe_all(store: Store | None = None) -> list[Probe]:
    """Every backend's view of this machine; a failing probe is reported, never raised."""
    found = []
    for kind in _BACKENDS:
        try:
            found.append(backend(kind).probe(store))
        except Exception as exc:  # noqa: BLE001 - a probe must not take down the listing
            found.append(Probe(kind, (), f"probe failed: {type(exc).__name__}: {exc}"))
    return found
