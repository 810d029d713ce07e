"""The CPU fingerprint names each feature once, and that changes no generated code."""

from __future__ import annotations

from dataclasses import replace

import pytest

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

    probed = cpu._llvm_resolve("host")  # as LLVM/IREE report it, before de-duplication
    host = cpu.host()
    names = [item[1:] for item in host.features.split(",")]
    assert len(names) == len(set(names))
    assert cpu.enabled_features(host.features) == cpu.enabled_features(probed.features)
    if probed.features == host.features:
        pytest.skip("this host's probe names no feature twice")
    # The key changes (one rebuild of what was cached under the old fingerprint) ...
    assert probed.digest() != host.digest()
    # ... but the native code does not.
    built = [compile_str(KERNEL, extra_args=list(cpu.flags(replace(host, features=f)))) for f in (probed.features, host.features)]
    old, new = (code_objects(b) for b in built)
    assert old and old == new
