"""The host CPU as its OS reports it, and IREE `llvm-cpu` targets for it or for named CPUs.

This machine's CPU is identified without LLVM (`/proc/cpuinfo`: vendor, family, model and
ISA flags in LLVM's feature names); IREE resolves LLVM's name for it (`target-cpu=host`)
in the worker that compiles its code. Named CPUs and ISA levels are resolved by LLVM, in
a child process, and memoised in the store.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Iterable

from portkern.base.errors import DeviceError, brief
from portkern.cache.device import DeviceFingerprint
from portkern.cache.store import Store
from portkern.jit import aarch64
from portkern.jit.target import Probe, Target, memoised, resolve_executable_target

KIND = "cpu"

#: `arch` of this machine's CPU as identified without LLVM: IREE compiles for LLVM's `host`.
HOST = "host"


def flags(fingerprint: DeviceFingerprint) -> tuple[str, ...]:
    """IREE flags that compile for exactly this CPU (IREE's default, embedded-ELF triple; an
    AArch64 ISA level in AArch64's; this machine's CPU: LLVM's host CPU and features)."""
    if is_aarch64_level(fingerprint):
        return aarch64.flags(fingerprint.arch, fingerprint.features)
    if fingerprint.arch == HOST:
        return (
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            "--iree-llvmcpu-target-cpu=host",
            "--iree-llvmcpu-target-cpu-features=host",
        )
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
    """This machine's CPU as its OS reports it (`os_view`), without LLVM; where the OS says
    nothing usable, as LLVM's host detection names it (memoised in the store)."""
    seen = os_view()
    if seen is None:
        return llvm_host(store)
    return seen


@functools.lru_cache(maxsize=1)
def os_view() -> DeviceFingerprint | None:
    """This machine's CPU from `/proc/cpuinfo` (None where it says nothing usable): `arch`
    `HOST`, its vendor, family and model, and the features it reports in LLVM's names, less
    `SYSTEM_FEATURES` (the same features `can_run` decides by)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return from_cpuinfo(text, _host_triple())


def from_cpuinfo(text: str, triple: str) -> DeviceFingerprint | None:
    """A CPU fingerprint from `/proc/cpuinfo` text (its first processor) for a target triple
    (None when the text names no ISA features for that architecture)."""
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    if aarch64.is_aarch64(triple):
        caps = set(fields.get("Features", "").split(None))
        have = {feature for feature, names in aarch64.FROM_HWCAPS.items() if caps.issuperset(names)}
        model = " ".join(fields.get(f, "?") for f in ("CPU implementer", "CPU architecture", "CPU variant", "CPU part"))
    elif _isa(triple) == "x86_64":
        flags_ = set(fields.get("flags", "").split(None))
        have = {feature for feature, names in X86_FROM_CPUINFO.items() if flags_.issuperset(names)}
        model = " ".join(fields.get(f, "?") for f in ("vendor_id", "cpu family", "model"))
    else:
        return None
    have -= SYSTEM_FEATURES
    if not have:
        return None
    features = ",".join(f"+{name}" for name in sorted(have))
    return DeviceFingerprint(KIND, HOST, features, (("model", model), ("triple", triple)))


def llvm_host(store: Store | None = None) -> DeviceFingerprint:
    """This machine's CPU as LLVM's host detection names it (LLVM CPU name and features), asked
    in a child process and memoised in the store: what IREE compiles `target-cpu=host` for."""
    parts = ("cpu", "host", host_identity())
    fingerprint = DeviceFingerprint.from_dict(memoised(parts, lambda: _llvm_resolve("host").to_dict(), store))
    return replace(fingerprint, features=unique_features(fingerprint.features))


def resolve(cpu: str, store: Store | None = None) -> DeviceFingerprint:
    """The fingerprint of an LLVM CPU name ("host" for this machine's CPU, `host`) or of an
    AArch64 ISA level (`aarch64.LEVELS`)."""
    if cpu == HOST:
        return host(store)
    parts = ("cpu", cpu, aarch64.LEVELS.get(cpu, ""))
    fingerprint = DeviceFingerprint.from_dict(memoised(parts, lambda: _llvm_resolve(cpu).to_dict(), store))
    return replace(fingerprint, features=unique_features(fingerprint.features))


PROBE_TIMEOUT_S = 120


@functools.lru_cache(maxsize=None)
def _llvm_resolve(cpu: str) -> DeviceFingerprint:
    """Ask LLVM (inside IREE) in a child process: an unknown CPU name aborts LLVM."""
    if not re.fullmatch(r"[A-Za-z0-9_.+-]{1,64}", cpu):
        raise DeviceError(f"{cpu!r} is not a CPU name")
    import subprocess  # (only here: a warm process never starts a probe)

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
    match = re.search(r'#hal\.executable\.target<"llvm-cpu", "[^"]+", \{(.*?)\}>', resolve_executable_target(target_flags))
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


#: Features LLVM lists for CPUs whose instructions only system software (kernels, hypervisors,
#: runtimes managing threads, memory keys or shadow stacks) uses: a code generator never emits them
#: for compute code, and cloud hypervisors often hide them, so they never decide whether code runs.
SYSTEM_FEATURES = frozenset({
    # named in issue 40: hidden on cloud VMs of Zen 3 and Zen 5
    "movdir64b", "movdiri", "mwaitx", "pku", "prefetchi", "rdpru", "wbnoinvd",
    # monitors, waits, queues and enclaves; processor and thread state
    "waitpkg", "serialize", "enqcmd", "sgx", "uintr", "hreset", "usermsr", "pconfig", "ptwrite",
    "tsxldtrk", "cldemote", "invpcid", "rdpid", "fsgsbase", "xsaveopt", "xsavec", "xsaves",
    # control-flow and key-locker protection, cache-line flushes and zeroing, lightweight profiling
    "shstk", "kl", "widekl", "clflushopt", "clwb", "clzero", "lwp",
})

#: LLVM's x86 feature -> the `/proc/cpuinfo` flags that all must be present. An LLVM feature
#: missing here is never confirmed on a host, so code that needs it is not served.
X86_FROM_CPUINFO = {
    "64bit": ("lm",), "x87": ("fpu",), "cmov": ("cmov",), "cx8": ("cx8",), "mmx": ("mmx",),
    "fxsr": ("fxsr",), "sse": ("sse",), "sse2": ("sse2",), "sse3": ("pni",), "ssse3": ("ssse3",),
    "sse4.1": ("sse4_1",), "sse4.2": ("sse4_2",), "crc32": ("sse4_2",), "sse4a": ("sse4a",),
    "popcnt": ("popcnt",), "cx16": ("cx16",), "sahf": ("lahf_lm",), "movbe": ("movbe",),
    "pclmul": ("pclmulqdq",), "aes": ("aes",), "xsave": ("xsave",), "xsaveopt": ("xsaveopt",),
    "xsavec": ("xsavec",), "xsaves": ("xsaves",), "avx": ("avx",), "f16c": ("f16c",), "fma": ("fma",),
    "fma4": ("fma4",), "xop": ("xop",), "tbm": ("tbm",), "lwp": ("lwp",), "avx2": ("avx2",),
    "bmi": ("bmi1",), "bmi2": ("bmi2",), "lzcnt": ("abm",), "prfchw": ("3dnowprefetch",),
    "adx": ("adx",), "rdrnd": ("rdrand",), "rdseed": ("rdseed",), "sha": ("sha_ni",),
    "fsgsbase": ("fsgsbase",), "invpcid": ("invpcid",), "clflushopt": ("clflushopt",), "clwb": ("clwb",),
    "clzero": ("clzero",), "mwaitx": ("mwaitx",), "pku": ("pku",), "rdpid": ("rdpid",), "rdpru": ("rdpru",),
    "wbnoinvd": ("wbnoinvd",), "vaes": ("vaes",), "vpclmulqdq": ("vpclmulqdq",), "gfni": ("gfni",),
    "avx512f": ("avx512f",), "avx512cd": ("avx512cd",), "avx512dq": ("avx512dq",), "avx512bw": ("avx512bw",),
    "avx512vl": ("avx512vl",), "avx512ifma": ("avx512ifma",), "avx512vbmi": ("avx512vbmi",),
    "avx512vbmi2": ("avx512_vbmi2",), "avx512bitalg": ("avx512_bitalg",), "avx512vnni": ("avx512_vnni",),
    "avx512vpopcntdq": ("avx512_vpopcntdq",), "avx512bf16": ("avx512_bf16",),
    "avx512vp2intersect": ("avx512_vp2intersect",), "avx512fp16": ("avx512_fp16",),
    "avxvnni": ("avx_vnni",), "avxifma": ("avx_ifma",), "avxneconvert": ("avx_ne_convert",),
    "avxvnniint8": ("avx_vnni_int8",), "avxvnniint16": ("avx_vnni_int16",), "cmpccxadd": ("cmpccxadd",),
    "sha512": ("sha512",), "sm3": ("sm3",), "sm4": ("sm4",), "amx-tile": ("amx_tile",),
    "amx-bf16": ("amx_bf16",), "amx-int8": ("amx_int8",), "amx-fp16": ("amx_fp16",),
    "amx-complex": ("amx_complex",), "movdiri": ("movdiri",), "movdir64b": ("movdir64b",),
    "serialize": ("serialize",), "waitpkg": ("waitpkg",), "cldemote": ("cldemote",), "enqcmd": ("enqcmd",),
    "tsxldtrk": ("tsxldtrk",), "uintr": ("uintr",), "rtm": ("rtm",), "sgx": ("sgx",),
    "shstk": ("user_shstk",), "ptwrite": ("ptwrite",), "prefetchi": ("prefetchi",), "hreset": ("hreset",),
}

#: What every x86-64 CPU has, which LLVM's named x86-64 CPUs need not list.
_X86_64_BASE = frozenset({"64bit", "cmov", "cx8", "fxsr", "mmx", "sse", "sse2", "x87"})


def can_run(code: DeviceFingerprint, host_cpu: DeviceFingerprint, hwcaps: Iterable[str] | None = None) -> bool:
    """Whether code built for `code` runs on the host CPU: the same architecture (triple), and
    every feature the code can contain (`required_features`: system-only features never count)
    on the host. On AArch64 the kernel's hwcaps decide the features they name
    (`hwcaps`: an AArch64 host's `/proc/cpuinfo` `Features`; None: this machine's, if it is one).
    The one rule for named CPUs, ISA levels and cached code alike."""
    triple = code.property("triple")
    if triple != host_cpu.property("triple"):
        return False
    if code == host_cpu:
        return True
    have = provided_features(host_cpu)
    if aarch64.is_aarch64(triple):
        have = aarch64.usable(have, aarch64.host_hwcaps() if hwcaps is None else hwcaps)
    return required_features(code) <= have


def required_features(code: DeviceFingerprint) -> set[str]:
    """The CPU features code built for `code` can contain: its enabled features, less
    code-generation options and `SYSTEM_FEATURES`."""
    enabled = enabled_features(code.features) - SYSTEM_FEATURES
    return aarch64.required(enabled) if aarch64.is_aarch64(code.property("triple")) else enabled


def provided_features(cpu_: DeviceFingerprint) -> set[str]:
    """The features a CPU offers code (its enabled features, with what every CPU of its
    architecture has), less `SYSTEM_FEATURES`."""
    have = enabled_features(cpu_.features) - SYSTEM_FEATURES
    return have | _X86_64_BASE if _isa(cpu_.property("triple")) == "x86_64" else have


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
    """Whether code built for `code` is baseline code on `host_cpu`: it runs there (`can_run`),
    but leaves out features that CPU has (an ISA level such as x86-64-v3 or armv8.2-a, an older
    CPU model). Code for a named CPU with every feature of the host's (its own model on a VM
    that hides system features) is not: it is as good as the host's own."""
    if code.kind != KIND or code == host_cpu or not can_run(code, host_cpu, hwcaps):
        return False
    return not provided_features(host_cpu) <= provided_features(code)


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
    """This machine's CPU, with LLVM's name for it (asked in a child process, memoised in the
    store; what `portkern devices` shows, never needed to load or run code)."""
    here = host(store)
    details: dict[str, str] = {}
    if here.arch == HOST:
        try:
            details["llvm_cpu"] = llvm_host(store).arch
        except DeviceError as exc:
            details["llvm_cpu"] = f"unknown ({brief(str(exc))})"
    return Probe(KIND, (here,), details=(details,))


def target(arch: str | None, store: Store | None = None) -> Target:
    """The target for this CPU (`arch` None or "host") or for a named LLVM CPU."""
    here = host(store)
    fingerprint = here if arch in (None, "", HOST) else resolve(arch, store)
    return _target(fingerprint, here)


@functools.lru_cache(maxsize=64)
def _target(fingerprint: DeviceFingerprint, here: DeviceFingerprint) -> Target:
    """`target` for code built for `fingerprint` on the host `here` (asked once per kernel)."""
    runnable = can_run(fingerprint, here)
    if runnable:
        reason = ""
    elif _isa(fingerprint.property("triple")) != _isa(here.property("triple")):
        reason = f"{fingerprint.arch} code is for {_isa(fingerprint.property('triple'))} CPUs; this host is {_isa(here.property('triple'))}"
    else:
        missing = sorted(required_features(fingerprint) - provided_features(here))
        shown = ", ".join(missing[:6]) + (", ..." if len(missing) > 6 else "")
        reason = f"this host lacks CPU features that {fingerprint.arch} code uses ({shown})"
    return Target(fingerprint, flags(fingerprint), "any", "local-task", runnable, reason)


if __name__ == "__main__":
    print(json.dumps(_probe_in_this_process(sys.argv[1]).to_dict()))
