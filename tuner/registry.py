"""The target families the tuner knows, and the lookups that go through them.

Adding a family is one module with a `Family` instance (see `family.py`) and
its entry in `FAMILIES`.
"""

from __future__ import annotations

from typing import Any

from portkern.base.errors import PerfConfigError
from portkern.portable.bundle import KernelRecord
from portkern.tuner import amdgpu_family, cpu_family, cuda_family, opencl_family
from portkern.tuner.dispatch import Dispatch
from portkern.tuner.family import Family
from portkern.tuner.perfconfig import MAX_CONFIG_CHARS, PerfConfig
from portkern.tuner.space import Space

#: Why a dispatch with dynamic loop ranges is not searched.
DYNAMIC_REASON = "dynamic loop ranges: tuned per shape bucket (shapes=[...], portkern tune --shapes)"

#: Every family, by name.
FAMILIES: dict[str, Family] = {f.name: f for f in (cpu_family.FAMILY, amdgpu_family.FAMILY, cuda_family.FAMILY, opencl_family.FAMILY)}


def family(name: str) -> Family:
    """The family of a name (PerfConfigError for unknown names)."""
    if name not in FAMILIES:
        raise PerfConfigError(f"unknown perf-config family {name!r} (known: {', '.join(sorted(FAMILIES))})")
    return FAMILIES[name]


def family_of(target: str, lowering_configs: list[str]) -> Family | None:
    """The family a dispatch belongs to, from its printed target and lowering configs."""
    return next((f for f in FAMILIES.values() if f.claims(target, lowering_configs)), None)


def kernel_family(record: KernelRecord) -> Family | None:
    """The family that tunes this kernel as a whole (its configs are not found by analysing IREE
    dispatches), None for kernels whose dispatches are analysed."""
    return next((f for f in FAMILIES.values() if f.claims_kernel(record)), None)


def is_root(lowering_config: str) -> bool:
    """Whether a printed lowering config is a root op's, in any family."""
    return any(f.is_root(lowering_config) for f in FAMILIES.values())


def parse(text: str, family_name: str | None = None) -> PerfConfig:
    """A perf config from its string form `<family>:v<version>:<fields>` (of `family_name`, when given)."""
    if not isinstance(text, str) or not text or len(text) > MAX_CONFIG_CHARS:
        raise PerfConfigError(f"a perf config must be a non-empty string of at most {MAX_CONFIG_CHARS} characters")
    name, sep1, rest = text.partition(":")
    version, sep2, body = rest.partition(":")
    if not (sep1 and sep2):
        raise PerfConfigError(f"perf config {text!r} is not of the form <family>:v<version>:<fields>")
    if name not in FAMILIES:
        raise PerfConfigError(f"perf config {text!r}: unknown family {name!r} (known: {', '.join(sorted(FAMILIES))})")
    if family_name is not None and name != family_name:
        raise PerfConfigError(f"perf config {text!r} is for {name!r}, this dispatch needs a {family_name!r} config")
    cls = FAMILIES[name].config
    if version != f"v{cls.version}":
        raise PerfConfigError(f"perf config {text!r}: unknown {name} version {version!r} (this portkern reads v{cls.version})")
    return cls.from_fields(body.split(","))


def dispatch_from_data(data: dict) -> Dispatch:
    """A dispatch from `Dispatch.to_dict`'s plain data (what a worker's analysis sends);
    PerfConfigError if it is not that."""
    try:
        default = parse(data["default"], data["family"]) if data.get("default") is not None else None
        fields = {
            **data, "sizes": tuple(int(s) for s in data["sizes"]), "parallel": tuple(bool(p) for p in data["parallel"]),
            "points": tuple(str(p) for p in data.get("points", ())), "default": default,
        }
        return Dispatch(**fields)
    except (KeyError, TypeError, ValueError) as exc:
        raise PerfConfigError(f"not a dispatch description: {exc}") from None


def space_for(dispatch: Dispatch, threads: int) -> Space[Any] | None:
    """The search space of a dispatch on a device with `threads` worker threads, None if there is none
    (`no_space_reason` says why)."""
    if not dispatch.tunable or dispatch.family not in FAMILIES:
        return None
    return FAMILIES[dispatch.family].space(dispatch, threads)


def no_space_reason(dispatch: Dispatch) -> str:
    """Why a dispatch has no search space."""
    if dispatch.reason:
        return dispatch.reason
    if dispatch.dynamic:
        return DYNAMIC_REASON
    if dispatch.family not in FAMILIES:
        return f"no search space for {dispatch.family or 'this target'}"
    return FAMILIES[dispatch.family].no_space_reason(dispatch)
