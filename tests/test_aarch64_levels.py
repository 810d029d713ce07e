"""AArch64 ISA-level baselines: cross-compiled on any host, served only to AArch64 CPUs with every feature."""

from __future__ import annotations

import platform

import numpy as np
import pytest
from helpers import assert_example, cli_json, expected_skip, prebuilt_example

import portkern
from portkern.base.errors import DeviceError
from portkern.cache.device import DeviceFingerprint
from portkern.jit import aarch64, cpu, elf
from portkern.jit.devices import resolve
from portkern.portable.bundle import decode_file, read_bundle_bytes

NAME = "gemm_bias_relu"
LEVELS = tuple(aarch64.LEVELS)
X86_HOST = platform.machine().lower() in ("x86_64", "amd64")
#: Built beside the AArch64 levels where this host can build it (an x86-64 host).
X86_LEVEL = "x86-64-v2"

#: hwcaps as Linux lists them in /proc/cpuinfo `Features` on such CPUs.
PI4 = "fp asimd evtstrm crc32 cpuid"  # Cortex-A72
N1 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs"
V1 = N1 + " jscvt fcma sha3 sm3 sm4 sha512 sve asimdfhm dit uscat ilrcpc flagm paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng"
V2 = V1 + " sb sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint bti"
#: LLVM's view of the host CPU as IREE resolves it: a known CPU model, and one LLVM does not name.
NEOVERSE_N1 = ("+v8.2a,+aes,+crc,+dotprod,+fp-armv8,+fullfp16,+lse,+neon,+perfmon,+ras,+rcpc,+rdm,+sha2,+spe,+ssbs,"
               "+reserve-x18")
GENERIC = "+fp-armv8,+neon,+reserve-x18"


def level(name: str) -> DeviceFingerprint:
    """A level's fingerprint as data (`test_levels_resolve_to_exactly_their_features` ties it to IREE's)."""
    return DeviceFingerprint("cpu", name, aarch64.LEVELS[name] + ",+reserve-x18", (("triple", aarch64.TRIPLE),))


def arm_host(arch: str, features: str) -> DeviceFingerprint:
    return DeviceFingerprint("cpu", arch, features, (("triple", aarch64.TRIPLE),))


def runnable(host: DeviceFingerprint, hwcaps: str) -> list[str]:
    return [name for name in LEVELS if cpu.can_run(level(name), host, hwcaps.split())]


@pytest.mark.parametrize(
    "hwcaps, expected",
    [(PI4, ["armv8-a"]), (N1, ["armv8-a", "armv8.2-a"]), (V1, ["armv8-a", "armv8.2-a"]), (V2, list(LEVELS))],
    ids=["cortex-a72", "neoverse-n1", "neoverse-v1 (SVE, no SVE2)", "neoverse-v2"],
)
def test_a_level_runs_only_where_the_kernel_reports_every_feature(hwcaps, expected):
    assert runnable(arm_host("neoverse-n1", NEOVERSE_N1), hwcaps) == expected
    assert runnable(arm_host("generic", GENERIC), hwcaps) == expected  # LLVM not knowing the CPU changes nothing


def test_a_host_lacking_a_required_feature_is_refused_although_llvm_names_it():
    """LLVM's CPU model says dot product; the kernel does not report it (asimddp): armv8.2-a is refused."""
    host = arm_host("neoverse-n1", NEOVERSE_N1)
    without_dotprod = " ".join(cap for cap in N1.split() if cap != "asimddp")
    assert runnable(host, without_dotprod) == ["armv8-a"]
    without_half = " ".join(cap for cap in N1.split() if cap != "asimdhp")  # fp16 needs fphp and asimdhp
    assert runnable(host, without_half) == ["armv8-a"]
    assert "dotprod" not in aarch64.usable(cpu.enabled_features(NEOVERSE_N1), without_dotprod.split())


def test_the_highest_level_the_host_has_serves_first():
    host = arm_host("neoverse-n1", NEOVERSE_N1)
    order = [fp.arch for fp in cpu.serving_order(host, [level(name) for name in LEVELS], hwcaps=N1.split())]
    assert order == ["armv8.2-a", "armv8-a"]
    assert all(cpu.is_baseline(level(name), host, hwcaps=N1.split()) for name in order)


def test_architectures_never_mix():
    x86 = DeviceFingerprint("cpu", "znver3", "+avx2,+fma,+sse4.2", (("triple", "x86_64-unknown-linux-gnu"),))
    x86_level = DeviceFingerprint("cpu", "x86-64-v2", "+sse4.2,+popcnt", (("triple", "x86_64-unknown-linux-gnu"),))
    arm = arm_host("neoverse-v2", NEOVERSE_N1)
    assert not any(cpu.can_run(level(name), x86, V2.split()) for name in LEVELS)
    assert not cpu.can_run(x86_level, arm, V2.split())
    assert cpu.serving_order(x86, [level(name) for name in LEVELS]) == []


def test_the_ladder_rises_and_every_feature_is_one_the_kernel_reports():
    for lower, higher in zip(LEVELS, LEVELS[1:]):
        assert cpu.enabled_features(aarch64.LEVELS[lower]) < cpu.enabled_features(aarch64.LEVELS[higher])
    for name in LEVELS:
        assert cpu.enabled_features(aarch64.LEVELS[name]) <= aarch64.FROM_HWCAPS.keys()


def test_hwcaps_are_read_from_cpuinfo_text():
    text = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: " + N1 + "\nCPU implementer\t: 0x41\n\nprocessor\t: 1\n"
    assert aarch64.hwcaps_in(text) == tuple(N1.split())
    assert aarch64.hwcaps_in("processor\t: 0\nflags\t\t: fpu sse2\n") is None
    assert aarch64.usable({"neon"}, None) == {"neon"}  # no hwcaps known: LLVM's view stands


def test_levels_resolve_to_exactly_their_features(store):
    """IREE keeps a level's feature list as given (plus its register-reservation option)."""
    for name in LEVELS:
        fingerprint = cpu.resolve(name, store)
        assert fingerprint == level(name)
        assert cpu.required_features(fingerprint) == cpu.enabled_features(aarch64.LEVELS[name])
        assert f"--iree-llvmcpu-target-triple={aarch64.TRIPLE}" in cpu.flags(fingerprint)


def test_an_unknown_level_is_a_typed_error_naming_it(store):
    with pytest.raises(DeviceError, match=r"'armv7-a'.*armv8-a, armv8\.2-a, armv9-a"):
        resolve("cpu:armv7-a", store)


@pytest.fixture(scope="module")
def fat(tmp_path_factory):
    """A one-kernel bundle prebuilt for every AArch64 level (and an x86-64 level on an x86-64 host)."""
    targets = [f"cpu:{name}" for name in LEVELS] + ([f"cpu:{X86_LEVEL}"] if X86_HOST else [])
    return prebuilt_example(tmp_path_factory.mktemp("arm"), "arm", targets, NAME)


def slices(path) -> dict[str, bytes]:
    bundle = decode_file(path, read_bundle_bytes(path))
    (record,) = bundle.kernels
    return {artifact.target: bundle.blobs[artifact.blob] for artifact in record.native}


def test_aarch64_levels_cross_compile_real_aarch64_code(fat, capsys):
    capsys.readouterr()
    built = slices(fat)
    assert {f"cpu:{name}" for name in LEVELS} <= built.keys()
    for target, data in built.items():
        machines = {image.machine for image in elf.find(data)}
        assert machines == ({elf.EM_AARCH64} if target.removeprefix("cpu:") in LEVELS else {elf.EM_X86_64}), target
    assert len({built[f"cpu:{name}"] for name in LEVELS}) == len(LEVELS)  # each level's own code


@pytest.mark.skipif(not X86_HOST, reason=expected_skip("cpu", "an x86-64 host: the AArch64 code must be passed over"))
def test_on_an_x86_host_the_x86_baseline_serves_and_the_aarch64_one_never(fat, store, capsys):
    capsys.readouterr()
    here = cpu.host(store)
    if not cpu.can_run(cpu.resolve(X86_LEVEL, store), here):
        pytest.skip(expected_skip("cpu", f"this host cannot run {X86_LEVEL} code"))
    kernel = portkern.load(fat, store=store).kernel(NAME)
    assert kernel.origin == "baseline" and kernel.native.built_for == f"cpu:{X86_LEVEL}"
    assert_example(kernel, np.random.default_rng(0))
    assert kernel.wait() and kernel.native.built_for == here.label
    assert [fp.arch for fp in cpu.serving_order(here, [cpu.resolve(n, store) for n in (*LEVELS, X86_LEVEL)])] == [X86_LEVEL]
    with pytest.raises(DeviceError, match="armv8.2-a code is for aarch64 CPUs; this host is x86_64"):
        portkern.load(fat, store=store).kernel(NAME, device="cpu:armv8.2-a")


def test_inspect_finalize_and_cache_ls_describe_aarch64_code(fat, tmp_path, capsys):
    capsys.readouterr()
    here = "; this host" if cpu.can_run(cpu.resolve("armv8.2-a"), cpu.host()) else "; not this host"
    status, shown = cli_json(capsys, "inspect", str(fat))
    serves = {n["target"]: n["serves"] for n in shown["kernels"][0]["native"]}
    assert serves["cpu:armv8.2-a"].startswith("aarch64 CPUs with every feature of armv8.2-a (7)")
    assert here in serves["cpu:armv8.2-a"] and (not X86_HOST or serves["cpu:armv8.2-a"].endswith("(x86_64)"))
    if X86_HOST:
        assert serves[f"cpu:{X86_LEVEL}"].startswith(f"x86_64 CPUs with every feature of {X86_LEVEL}")
    cache = str(tmp_path / "cache")
    status, done = cli_json(capsys, "finalize", str(fat), "--target", "cpu:armv8.2-a", "--cache-dir", cache)
    assert status == 0
    assert [(e["origin"], e["code"]) for e in done["entries"]] == [("prebuilt", "ELF aarch64 (machine 183)")]
    status, listed = cli_json(capsys, "cache", "ls", "--cache-dir", cache)
    assert [(e["device_label"], e["serves"]) for e in listed] == [("cpu:armv8.2-a", serves["cpu:armv8.2-a"])]


def test_a_worker_cross_compiles_a_level_without_a_prebuilt_slice(examples_bundle, tmp_path, capsys):
    """`portkern finalize --target cpu:armv9-a` of an ONNX kernel: compiled by a worker into AArch64 code."""
    capsys.readouterr()
    cache = str(tmp_path / "cache")
    status, done = cli_json(capsys, "finalize", str(examples_bundle), "--target", "cpu:armv9-a", "--kernel", "mlp", "--cache-dir", cache)
    assert status == 0
    assert [(e["origin"], e["code"]) for e in done["entries"]] == [("finalized", "ELF aarch64 (machine 183)")]
