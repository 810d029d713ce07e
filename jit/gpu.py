"""What the GPU backends (AMD, NVIDIA) share: the real target attribute of an arch,
targets, and fitting a bundle stage to a target.

GPU targets are selected by attribute, not by compiler flags: the real
`#hal.executable.target` of the arch replaces the placeholder in a family stage
(or is attached to a flow stage), and one flag-less compiler session serves
every arch. The real attribute is what IREE itself resolves for the arch,
read from a tiny module lowered to `executable-sources` (memoised in the store).

A GPU backend module has, besides `KIND`, `probe` and `target`:
`NAME` (for messages), `DRIVER` (IREE runtime driver), `canonical(arch)`
(validated arch name or `DeviceError`), `executable_target(arch, store)` and
`device_arch(arch)` (the arch a device that runs such code reports).
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Callable

from portkern.base.errors import CompileError, DeviceError, FinalizeError, brief
from portkern.cache.device import DeviceFingerprint
from portkern.cache.store import Store
from portkern.jit.target import Probe, Target, memoised, resolve_executable_target
from portkern.portable.bundle import SOURCE_PHASE, Stage
from portkern.portable.family import FAMILY_PHASE, attach, family, replace
from portkern.portable.lower import PORTABLE_PHASE
from portkern.portable.producer import installed_compiler

#: Bump when the way target attributes are made changes, so memoised ones are not reused.
TARGETS_VERSION = 1


def resolved_target(flags: tuple[str, ...]) -> str:
    """The GPU `#hal.executable.target` IREE resolves for target flags (whose arch must be validated first)."""
    text = resolve_executable_target(flags)
    if "iree_codegen.target_info" not in text:
        raise DeviceError(f"IREE {installed_compiler().version} has no GPU description for {' '.join(flags)}")
    return text


def memoised_target(kind: str, arch: str, make: Callable[[], str], store: Store | None) -> str:
    """`make()` once per kind, arch and compiler: in this process, and in the store across processes."""
    parts = ("gpu-target", str(TARGETS_VERSION), kind, arch)
    return memoised(parts, lambda: {"kind": kind, "arch": arch, "executable_target": make()}, store)["executable_target"]


def probe_once(read: Callable[[], Probe], doc: str) -> Callable[..., Probe]:
    """A backend's `probe(store=None)`: `read()` (which must never raise) run once per process.

    The store is not used: which GPUs are present is read live, never memoised across
    processes (a GPU or its driver can come and go between runs), unlike the CPU's
    identity and the targets' attributes. The argument is there for the backend interface."""
    cached = functools.lru_cache(maxsize=1)(read)

    def probe(store: Store | None = None) -> Probe:
        del store  # see above: presence is read live
        return cached()

    probe.__doc__ = doc
    probe.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
    return probe


@functools.lru_cache(maxsize=None)
def driver_problem(driver: str) -> str:
    """Why IREE's runtime driver cannot run code here ("" when it can)."""
    try:
        import iree.runtime as rt

        found = rt.get_driver(driver).query_available_devices()
    except (RuntimeError, ValueError) as exc:
        return f"IREE's {driver} driver is not usable: {brief(exc) or type(exc).__name__}"
    return "" if found else f"IREE's {driver} driver sees no device"


def make_target(backend: ModuleType, arch: str | None, store: Store | None) -> Target:
    """The target for a named arch, or (arch None) for this machine's first device."""
    probe = backend.probe(store)
    if arch in (None, ""):
        if not probe.devices:
            raise DeviceError(f"no {backend.NAME} here: {probe.reason}")
        fingerprint = probe.devices[0]
    else:
        fingerprint = DeviceFingerprint(backend.KIND, backend.canonical(arch))
    executable_target = backend.executable_target(fingerprint.arch, store)
    if any(d.arch == backend.device_arch(fingerprint.arch) for d in probe.devices):
        reason = driver_problem(backend.DRIVER)
    else:
        seen = ", ".join(d.label for d in probe.devices)
        reason = f"no {backend.NAME} of arch {backend.device_arch(fingerprint.arch)} here ({probe.reason or 'found ' + seen})"
    return Target(fingerprint, (), backend.KIND, backend.DRIVER, not reason, reason, executable_target)


def fit(module, stage: Stage, target: Target) -> None:
    """Write the target's attribute into a freshly parsed stage module, in place: in
    place of the placeholder of a family stage, or as the module's target for a flow or source stage."""
    if not target.executable_target:
        if stage.placeholder is not None:
            raise FinalizeError(f"the {stage.family} stage needs a GPU target, not {target.label}")
        return
    fam = family(target.family)
    try:
        if stage.placeholder is not None:
            if stage.family != fam.name or stage.placeholder != fam.placeholder or stage.phase != FAMILY_PHASE:
                raise FinalizeError(
                    f"stage {stage.family}/{stage.phase} with placeholder {stage.placeholder!r} "
                    f"is not a {fam.name} stage this portkern can finalise"
                )
            replace(module, fam, target.executable_target, expect=fam.placeholder)
        elif stage.phase in (PORTABLE_PHASE, SOURCE_PHASE):
            attach(module, fam, target.executable_target)
        else:
            raise FinalizeError(f"a {stage.phase} stage without placeholder cannot be finalised for {target.label}")
    except CompileError as exc:
        if isinstance(exc, FinalizeError):
            raise
        raise FinalizeError(f"{target.label}: {exc}") from None
