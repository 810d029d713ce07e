"""The CPU fingerprint names each feature once, and that changes no generated code."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from helpers import expected_skip

from portkern.cache.device import DeviceFingerprint
from portkern.jit import cpu, elf

KERNEL = """func.func @axpy(%a: tensor<64xf32>, %b: tensor<64xf32>) -> tensor<64xf32> {
  %e = tensor.empty() : tensor<64xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
                       iterator_types = ["parallel"]} ins(%a, %b : tensor<64xf32>, tensor<64xf32>) outs(%e : tensor<64xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %m = arith.mulf %x, %y : f32
    %s = arith.addf %m, %y : f32
    linalg.yield %s : f32
  } -> tensor<64xf32>
  return %r : tensor<64xf32>
}
"""


@pytest.mark.parametrize(
    "features, unique",
    [
        ("+avx,+sse,+avx,-sse", "+avx,-sse"),
        ("+x87,+avx,-mwaitx,+avx,+mwaitx", "+x87,+avx,+mwaitx"),
        ("", ""),
        (" +a , +b ,+a", "+b,+a"),
    ],
)
def test_unique_features_keeps_the_last_mention(features, unique):
    assert cpu.unique_features(features) == unique
    assert cpu.enabled_features(unique) == cpu.enabled_features(features)


def code_objects(native: bytes) -> list[bytes]:
    return [native[image.offset:image.offset + image.size] for image in elf.find(native)]


def test_host_fingerprint_names_each_feature_once_and_builds_the_same_code():
    from iree.compiler import compile_str

    # the probe's own answer, as LLVM/IREE report it (before de-duplication)
    done = subprocess.run([sys.executable, "-m", "portkern.jit.cpu", "host"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    probed = DeviceFingerprint.from_dict(json.loads(done.stdout))
    host = cpu.llvm_host()
    names = [item[1:] for item in host.features.split(",")]
    assert len(names) == len(set(names))
    assert cpu.enabled_features(host.features) == cpu.enabled_features(probed.features)
    if probed.features == host.features:
        pytest.skip(expected_skip("cpu", "this host's probe names no feature twice"))
    # The key changes (one rebuild of what was cached under the old fingerprint) ...
    assert probed.digest() != host.digest()
    # ... but the native code does not.
    built = [compile_str(KERNEL, extra_args=list(cpu.flags(replace(host, features=f)))) for f in (probed.features, host.features)]
    old, new = (code_objects(b) for b in built)
    assert old and old == new


X86 = "x86_64-unknown-linux-gnu"
#: `/proc/cpuinfo` of a Zen 3 VM whose hypervisor hides mwaitx and rdpru (abridged to one processor).
ZEN3_VM = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw topoext ssbd ibrs ibpb stibp vmmcall fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves clzero xsaveerptr wbnoinvd arat umip pku ospke vaes vpclmulqdq rdpid fsrm

processor\t: 1
"""
#: LLVM's `znver3` features (IREE 3.13), system features included.
ZNVER3 = ("+adx,+aes,+avx,+avx2,+bmi,+bmi2,+clflushopt,+clwb,+clzero,+crc32,+cx16,+cx8,+f16c,+fma,+fsgsbase,+fxsr,"
          "+invpcid,+lzcnt,+mmx,+movbe,+mwaitx,+pclmul,+pku,+popcnt,+prfchw,+rdpid,+rdpru,+rdrnd,+rdseed,+sahf,+sha,"
          "+sse,+sse2,+sse3,+sse4.1,+sse4.2,+sse4a,+ssse3,+vaes,+vpclmulqdq,+wbnoinvd,+x87,+xsave,+xsavec,+xsaveopt,+xsaves")


def test_cpuinfo_names_the_cpu_and_its_features_in_llvm_terms():
    host = cpu.from_cpuinfo(ZEN3_VM, X86)
    assert host.arch == cpu.HOST and host.property("model") == "AuthenticAMD 25 1"
    have = cpu.enabled_features(host.features)
    assert {"avx2", "fma", "sse4.1", "crc32", "lzcnt", "prfchw", "sahf", "sha", "x87", "64bit"} <= have
    assert not have & cpu.SYSTEM_FEATURES and "avx512f" not in have
    assert cpu.from_cpuinfo("processor\t: 0\n", X86) is None


def test_named_cpu_code_is_judged_by_the_features_code_can_contain():
    host = cpu.from_cpuinfo(ZEN3_VM, X86)
    znver3 = DeviceFingerprint(cpu.KIND, "znver3", ZNVER3, (("triple", X86),))
    assert "mwaitx" in cpu.enabled_features(ZNVER3) and "mwaitx" not in cpu.enabled_features(host.features)
    assert cpu.can_run(znver3, host) and not cpu.is_baseline(znver3, host)  # the hidden mwaitx, rdpru do not count
    with_avx512 = replace(znver3, arch="znver4", features=ZNVER3 + ",+avx512f")
    assert not cpu.can_run(with_avx512, host)
    older = replace(znver3, arch="znver2", features=ZNVER3.replace("+vaes,+vpclmulqdq,", ""))
    assert cpu.can_run(older, host) and cpu.is_baseline(older, host)
    arm = replace(znver3, properties=(("triple", "aarch64-unknown-linux-gnu"),))
    assert not cpu.can_run(arm, host)
