"""AArch64 for CPU targets: the ISA levels built on any host, and what an AArch64 host's kernel
says its CPU has (`/proc/cpuinfo` `Features`) in LLVM's feature names.

The levels are cross-compiled with IREE's AArch64 triple, for LLVM's `generic` CPU with
a fixed feature list. Each level lists only features the Linux kernel reports, so the
feature-subset rule can be decided on any AArch64 host; the architecture-version features
(`+v8.2a`, ...) are left out for the same reason.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path
from typing import Iterable, Mapping

TRIPLE = "aarch64-unknown-linux-gnu"
#: The LLVM CPU every level is built for (its features come from the level).
LLVM_CPU = "generic"

_V8 = "+fp-armv8,+neon"
_V8_2 = _V8 + ",+crc,+lse,+rdm,+fullfp16,+dotprod"
_V9 = _V8_2 + ",+sve,+sve2,+i8mm,+bf16"

#: ISA level -> the LLVM features its code may use. Named like the x86-64 levels' LLVM names:
#: armv8-a: every AArch64 Linux CPU (Cortex-A53/A72, Graviton1, Raspberry Pi 3/4);
#: armv8.2-a: the v8.1/v8.2 atomics, CRC and rounding-doubling multiply plus fp16 arithmetic
#: and dot product (Cortex-A75/A76/A78, Neoverse N1, Graviton2, Raspberry Pi 5);
#: armv9-a: adds SVE/SVE2, int8 matrix multiply and bfloat16 (Neoverse N2/V2, Graviton4,
#: Cortex-A710/X2).
LEVELS: Mapping[str, str] = {"armv8-a": _V8, "armv8.2-a": _V8_2, "armv9-a": _V9}

#: Features in IREE's target that configure code generation rather than require a CPU feature.
CODEGEN_OPTIONS = frozenset({"reserve-x18"})

#: LLVM feature -> the kernel's hwcap names (`/proc/cpuinfo` `Features`) that all must be present.
FROM_HWCAPS: Mapping[str, tuple[str, ...]] = {
    "fp-armv8": ("fp",),
    "neon": ("asimd",),
    "aes": ("aes", "pmull"),
    "sha2": ("sha1", "sha2"),
    "crc": ("crc32",),
    "lse": ("atomics",),
    "fullfp16": ("fphp", "asimdhp"),
    "rdm": ("asimdrdm",),
    "jsconv": ("jscvt",),
    "complxnum": ("fcma",),
    "rcpc": ("lrcpc",),
    "ccpp": ("dcpop",),
    "sha3": ("sha3", "sha512"),
    "sm4": ("sm3", "sm4"),
    "dotprod": ("asimddp",),
    "fp16fml": ("asimdfhm",),
    "dit": ("dit",),
    "lse2": ("uscat",),
    "rcpc-immo": ("ilrcpc",),
    "flagm": ("flagm",),
    "ssbs": ("ssbs",),
    "sb": ("sb",),
    "pauth": ("paca", "pacg"),
    "ccdp": ("dcpodp",),
    "sve": ("sve",),
    "sve2": ("sve2",),
    "sve2-aes": ("sveaes", "svepmull"),
    "sve2-bitperm": ("svebitperm",),
    "sve2-sha3": ("svesha3",),
    "sve2-sm4": ("svesm4",),
    "altnzcv": ("flagm2",),
    "fptoint": ("frint",),
    "i8mm": ("i8mm",),
    "bf16": ("bf16",),
    "rand": ("rng",),
    "bti": ("bti",),
    "mte": ("mte",),
    "sme": ("sme",),
    "mops": ("mops",),
}


def is_aarch64(triple: str) -> bool:
    """Whether a target triple is AArch64 (little-endian)."""
    return triple.split("-", 1)[0] in ("aarch64", "arm64")


def flags(level: str, features: str) -> tuple[str, ...]:
    """IREE flags that build code for an ISA level (`features`: the level's, as IREE resolved them)."""
    return (
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        f"--iree-llvmcpu-target-triple={TRIPLE}",
        f"--iree-llvmcpu-target-cpu={LLVM_CPU}",
        f"--iree-llvmcpu-target-cpu-features={features}",
    )


def required(features: Iterable[str]) -> set[str]:
    """The CPU features code built with these (enabled) LLVM features needs."""
    return set(features) - CODEGEN_OPTIONS


def usable(llvm_features: Iterable[str], hwcaps: Iterable[str] | None) -> set[str]:
    """The features code may use on an AArch64 host: LLVM's view of its CPU, where the kernel's
    hwcaps (None: not known) decide every feature they can name."""
    have = set(llvm_features)
    if hwcaps is None:
        return have
    caps = set(hwcaps)
    kernel_says = {feature for feature, names in FROM_HWCAPS.items() if caps.issuperset(names)}
    return (have - FROM_HWCAPS.keys()) | kernel_says


def hwcaps_in(cpuinfo: str) -> tuple[str, ...] | None:
    """The first `Features` line of `/proc/cpuinfo` text, split; None if there is none."""
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == "Features":
            return tuple(value.split(None))
    return None


@functools.lru_cache(maxsize=1)
def host_hwcaps() -> tuple[str, ...] | None:
    """This machine's hwcaps when it is an AArch64 Linux host, else None."""
    if platform.machine().lower() not in ("aarch64", "arm64"):
        return None
    try:
        return hwcaps_in(Path("/proc/cpuinfo").read_text())
    except OSError:
        return None
