"""The host CPU as LLVM sees it, and IREE `llvm-cpu` targets for it or for named CPUs."""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Iterable

from portkern.cache.device import DeviceFingerprint
from portkern.cache.store import Store
from portkern.errors import DeviceError, brief
from portkern.jit import aarch64
from portkern.jit.target import Probe, Target, memoised, resolve_executable_target

KIND = "cpu"

_TARGET_ATTR = re.compile(r'#hal\.executable\.target<"llvm-cpu", "[^"]+", \{(.*?)\}>')


def flags(fingerprint: DeviceFingerprint) -> tuple[str, ...]:
    """IREE flags that compile for exactly this CPU (IREE's default, embedded-ELF triple; an
    AArch64 ISA level in AArch64's)."""
    if is_aarch64_level(fingerprint):
        return aarch64.flags(fingerprint.arch, fingerprint.features)
    return (
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        f"--iree-llvmcpu-target-cpu={fingerprint.arch}",
        f"--iree-llvmcpu-target-cpu-features={fingerprint.features}",
    )


@functools.lru_cache(maxsize=1)
def host_identity() -> str:
    """A cheap digest of what the OS reports about the CPU (model, stepping, flags)."""
    parts = [platform.machine()]
    try:
        text = Path("/proc/cpuinfo").read_text()
        first = text.split("\n\n", 1)[0]
        parts += [line for line in first.splitlines() if line.split(":")[0].strip() in _IDENTITY_FIELDS]
    except OSError:
        parts.append(platform.processor())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


_IDENTITY_FIELDS = {"vendor_id", "cpu family", "model", "model name", "stepping", "flags", "Features", "CPU part"}


def host(store: Store | None = None) -> DeviceFingerprint:
    """This machine's CPU, as LLVM's host detection names it (memoised in the store)."""
    return resolve("host", store)


def resolve(cpu: str, store: Store | None = None) -> DeviceFingerprint:
    """The fingerprint of an LLVM CPU name ("host" for this machine's CPU) or of an AArch64
    ISA level (`aarch64.LEVELS`)."""
    parts = ("cpu", cpu, host_identity() if cpu == "host" else aarch64.LEVELS.get(cpu, ""))
    fingerprint = DeviceFingerprint.from_dict(memoised(parts, lambda: _llvm_resolve(cpu).to_dict(), store))
    return replace(fingerprint, features=unique_features(fingerprint.features))


PROBE_TIMEOUT_S = 120


@functools.lru_cache(maxsize=None)
def _llvm_resolve(cpu: str) -> DeviceFingerprint:
    """Ask LLVM (inside IREE) in a child process: an unknown CPU name aborts LLVM."""
    if not re.fullmatch(r"[A-Za-z0-9_.+-]{1,64}", cpu):
        raise DeviceError(f"{cpu!r} is not a CPU name")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "portkern.jit.cpu", cpu],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise DeviceError(f"probing the CPU {cpu!r} took longer than {PROBE_TIMEOUT_S} s") from None
    if "is not a recognized processor" in done.stderr or done.returncode != 0:
        raise DeviceError(
            f"LLVM does not know the CPU {cpu!r} ({brief(done.stderr, last=True) or 'probe failed'}); "
            f"the AArch64 ISA levels are {', '.join(aarch64.LEVELS)}"
        )
    return DeviceFingerprint.from_dict(json.loads(done.stdout))


def _probe_in_this_process(cpu: str) -> DeviceFingerprint:
    if cpu in aarch64.LEVELS:
        level = DeviceFingerprint(KIND, cpu, aarch64.LEVELS[cpu], (("triple", aarch64.TRIPLE),))
        attrs = _resolved_attrs(cpu, flags(level))
        return replace(level, features=attrs.get("cpu_features", level.features))
    features = "host" if cpu == "host" else ""
    attrs = _resolved_attrs(
        cpu,
        (
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            f"--iree-llvmcpu-target-cpu={cpu}",
            f"--iree-llvmcpu-target-cpu-features={features}",
        ),
    )
    return DeviceFingerprint(KIND, attrs.get("cpu", cpu), attrs.get("cpu_features", ""), (("triple", _host_triple()),))


def _resolved_attrs(cpu: str, target_flags: tuple[str, ...]) -> dict[str, str]:
    """The string attributes of the `llvm-cpu` executable target IREE resolves for the flags."""
    match = _TARGET_ATTR.search(resolve_executable_target(target_flags))
    if match is None:
        raise DeviceError(f"could not read the IREE CPU target for {cpu!r}")
    return dict(re.findall(r'([\w.]+) = "([^"]*)"', match.group(1)))


def _host_triple() -> str:
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    system = platform.system().lower()
    return f"{arch}-unknown-{system}-gnu" if system == "linux" else f"{arch}-unknown-{system}"


def unique_features(features: str) -> str:
    """Each feature once, at its last mention: the one LLVM applies.

    For the host, IREE lists the named CPU's own features and then every host feature;
    the earlier mentions only re-enable what the CPU name already enables, so dropping
    them leaves the generated code unchanged (tests/test_cpu_features.py compiles both).
    """
    items = [item.strip() for item in features.split(",") if item.strip()]
    last = {item.lstrip("+-"): index for index, item in enumerate(items)}
    return ",".join(item for index, item in enumerate(items) if last[item.lstrip("+-")] == index)


def enabled_features(features: str) -> set[str]:
    """Features a "+a,-b,..." string leaves on; a later mention overrides an earlier one, as in LLVM."""
    state: dict[str, bool] = {}
    for item in features.split(","):
        item = item.strip()
        if item[:1] in "+-" and len(item) > 1:
            state[item[1:]] = item[0] == "+"
    return {name for name, on in state.items() if on}


def can_run(code: DeviceFingerprint, host_cpu: DeviceFingerprint, hwcaps: Iterable[str] | None = None) -> bool:
    """Whether code built for `code` runs on the host CPU: the same architecture (triple), and
    only features the host has. On AArch64 the kernel's hwcaps decide the features they name
    (`hwcaps`: an AArch64 host's `/proc/cpuinfo` `Features`; None: this machine's, if it is one)."""
    triple = code.property("triple")
    if triple != host_cpu.property("triple"):
        return False
    if code == host_cpu:
        return True
    have = enabled_features(host_cpu.features)
    if aarch64.is_aarch64(triple):
        have = aarch64.usable(have, aarch64.host_hwcaps() if hwcaps is None else hwcaps)
    return required_features(code) <= have


def required_features(code: DeviceFingerprint) -> set[str]:
    """The CPU features code built for `code` needs (its enabled features, less code-generation options)."""
    enabled = enabled_features(code.features)
    return aarch64.required(enabled) if aarch64.is_aarch64(code.property("triple")) else enabled


def is_aarch64_level(code: DeviceFingerprint) -> bool:
    """Whether `code` is one of the AArch64 ISA levels (`aarch64.LEVELS`)."""
    return code.kind == KIND and code.arch in aarch64.LEVELS and aarch64.is_aarch64(code.property("triple"))


def serving_order(
    host_cpu: DeviceFingerprint, built_for: Iterable[DeviceFingerprint], hwcaps: Iterable[str] | None = None
) -> list[DeviceFingerprint]:
    """The CPUs among `built_for` whose code this host runs (`can_run`): the host's own
    first, then the most specific (most features enabled)."""
    hwcaps = None if hwcaps is None else tuple(hwcaps)
    runs = {fp for fp in built_for if fp.kind == KIND and can_run(fp, host_cpu, hwcaps)}
    return sorted(runs, key=lambda fp: (fp != host_cpu, -len(enabled_features(fp.features)), fp.arch))


def is_baseline(code: DeviceFingerprint, host_cpu: DeviceFingerprint, hwcaps: Iterable[str] | None = None) -> bool:
    """Whether code built for `code` is baseline code on `host_cpu`: for another CPU model or an
    ISA level (e.g. x86-64-v3, armv8.2-a) whose every feature that CPU has (`hwcaps` as for `can_run`)."""
    return code.kind == KIND and code.arch != host_cpu.arch and can_run(code, host_cpu, hwcaps)


def serves(code: DeviceFingerprint, store: Store | None = None) -> str:
    """Which hosts native code built for `code` is served to, in words, and whether this one is."""
    if code.kind != KIND:
        return f"exactly {code.label}"
    here_cpu = host(store)
    here = "this host" if can_run(code, here_cpu) else "not this host"
    isa = _isa(code.property("triple"))
    if isa != _isa(here_cpu.property("triple")):
        here += f" ({_isa(here_cpu.property('triple'))})"
    return f"{isa} CPUs with every feature of {code.arch} ({len(required_features(code))}); {here}"


def _isa(triple: str) -> str:
    return triple.split("-", 1)[0] or "unknown"


def probe(store: Store | None = None) -> Probe:
    return Probe(KIND, (host(store),))


def target(arch: str | None, store: Store | None = None) -> Target:
    """The target for this CPU (`arch` None) or for a named LLVM CPU."""
    here = host(store)
    fingerprint = here if arch in (None, "", "host") else resolve(arch, store)
    runnable = can_run(fingerprint, here)
    if runnable:
        reason = ""
    elif _isa(fingerprint.property("triple")) != _isa(here.property("triple")):
        reason = f"{fingerprint.arch} code is for {_isa(fingerprint.property('triple'))} CPUs; this host is {_isa(here.property('triple'))}"
    else:
        reason = f"this host ({here.arch}) lacks CPU features that {fingerprint.arch} code uses"
    return Target(fingerprint, flags(fingerprint), "any", "local-task", runnable, reason)


if __name__ == "__main__":
    print(json.dumps(_probe_in_this_process(sys.argv[1]).to_dict()))
