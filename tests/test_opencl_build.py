"""OpenCL C and SPIR-V on the build host: bundles, compiler messages, validation, manifest-vs-kernel checks."""

from __future__ import annotations

import struct

import pytest
from helpers import opencl_toolchain_missing

from portkern.base.errors import BuildError
from portkern.examples import OPENCL_MANIFEST
from portkern.examples.reference import HERE
from portkern.portable import spirv
from portkern.portable.builder import build_file
from portkern.portable.bundle import read_bundle
from portkern.portable.launch import launch_of
from portkern.portable.opencl import BuildWarning, compile_opencl

pytestmark = pytest.mark.skipif(bool(opencl_toolchain_missing()), reason=opencl_toolchain_missing() or "-")

VADD_ARGS = """    args:
      - {name: a, dtype: float32, role: in, shape: [n]}
      - {name: b, dtype: float32, role: in, shape: [n]}
      - {name: c, dtype: float32, role: out, shape: [n]}
      - {name: n, dtype: int32, value: n}
    global: ["round_up(n, 64)"]
    local: [64]
"""


def build(tmp_path, source_name: str, source: str | bytes | None = None, body: str = VADD_ARGS, kind: str = ""):
    if source is not None:
        path = tmp_path / source_name
        path.write_bytes(source) if isinstance(source, bytes) else path.write_text(source)
    kind_line = f"    kind: {kind}\n" if kind else ""
    (tmp_path / "m.yaml").write_text(f"bundle: t\nkernels:\n  - name: vadd\n    source: {source_name}\n{kind_line}{body}")
    return build_file(tmp_path / "m.yaml", tmp_path / "t.pkb")


def test_examples_bundle_holds_validated_spirv_and_spir(opencl_examples_bundle, tmp_path):
    bundle = read_bundle(opencl_examples_bundle)
    assert bundle.name == "opencl-examples" and [k.name for k in bundle.kernels] == ["vadd", "matmul_tiled", "softmax_rows"]
    for record in bundle.kernels:
        assert record.kind == "opencl" and record.entry == record.name
        assert [(s.phase, s.family, s.format) for s in record.stages] == [("spirv", "opencl", "spirv"), ("spir", "opencl", "spir-bitcode")]
        module = spirv.read(bundle.blob(record.stages[0].blob))
        assert module.version == (1, 0) and record.name in module.kernels
        assert bundle.blob(record.stages[1].blob)[:4] == b"BC\xc0\xde"  # LLVM bitcode
        assert record.stages[0].producer.compiler == "clang/llvm-spirv"
        assert launch_of(record).variants[0].stages == (0, 1)
    matmul = bundle.kernel("matmul_tiled")
    assert spirv.read(bundle.blob(matmul.stages[0].blob)).kernels["matmul_tiled"].local_size == (16, 16, 1)
    assert [str(t) for t in matmul.signature.inputs] == ["?x?xfloat32", "?x?xfloat32"]
    assert matmul.launch["global"] == ["round_up(N, 16)", "round_up(M, 16)"]
    again = tmp_path / "again.pkb"
    build_file(OPENCL_MANIFEST, again)
    assert again.read_bytes() == opencl_examples_bundle.read_bytes()


def test_compile_error_names_file_and_line(tmp_path):
    source = "__kernel void vadd(__global const float *a, __global const float *b,\n" \
             "                   __global float *c, int n) {\n  c[0] = a[0] + undefined_fn(b[0]);\n}\n"  # fmt: skip
    with pytest.raises(BuildError, match=r"bad\.cl:3:17: error: use of undeclared identifier 'undefined_fn'"):
        build(tmp_path, "bad.cl", source)


def test_spirv_file_is_taken_as_is(tmp_path):
    code = compile_opencl(HERE / "vadd.cl")
    bundle = build(tmp_path, "vadd.spv", code)
    record = bundle.kernel("vadd")
    assert record.kind == "spirv" and bundle.blob(record.stages[0].blob) == code
    assert record.stages[0].producer.compiler == "Khronos LLVM/SPIR-V Translator"


def _corrupt(code: bytes, how: str) -> bytes:
    words = list(struct.unpack(f"<{len(code) // 4}I", code))
    if how == "truncated":
        return code[: len(code) // 2 + 2]
    if how == "magic":
        return b"\0\0\0\0" + code[4:]
    if how == "opcode":  # OpEntryPoint becomes an unknown opcode
        index = 5
        while words[index] & 0xFFFF != 15:
            index += words[index] >> 16
        words[index] = (words[index] & 0xFFFF0000) | 0x7FFF
    return struct.pack(f"<{len(words)}I", *words)


@pytest.mark.parametrize(
    "how, message",
    [
        ("truncated", "End of input reached"),
        ("magic", "Invalid SPIR-V magic number"),
        ("opcode", "Invalid opcode: 32767"),
    ],
)
def test_spirv_that_fails_validation_is_rejected(tmp_path, how, message):
    code = _corrupt(compile_opencl(HERE / "vadd.cl"), how)
    with pytest.raises(BuildError, match=rf"broken\.spv: not valid SPIR-V \(spirv-val\): error: line \d+: {message}"):
        build(tmp_path, "broken.spv", code, kind="spirv")


@pytest.mark.parametrize(
    "change, message",
    [
        (("dtype: float32, role: out", "dtype: int32, role: out"), r"argument 2 \(c\): the kernel parameter is __global float\*, but the manifest says int32"),
        (("name: b, dtype: float32, role: in", "name: b, dtype: float32, role: out"), r"argument 1 \(b\): the manifest says role out, but the kernel never writes"),
        (("{name: n, dtype: int32, value: n}", "{name: n, dtype: int64, value: n}"), r"argument 3 \(n\): the kernel parameter is int, but the manifest says a scalar of int64"),
        (("      - {name: n, dtype: int32, value: n}\n", ""), "kernel 'vadd' takes 4 arguments, the manifest lists 3"),
        (("{name: a, dtype: float32, role: in, shape: [n]}", "{name: a, dtype: float32}"), r"argument 0 \(a\): the kernel parameter is __global float\*, but the manifest says a scalar"),
    ],
)
def test_manifest_that_disagrees_with_the_kernel_is_refused(tmp_path, change, message):
    with pytest.raises(BuildError, match=message):
        build(tmp_path, "vadd.cl", (HERE / "vadd.cl").read_text(), VADD_ARGS.replace(*change))


def test_entry_must_exist(tmp_path):
    with pytest.raises(BuildError, match=r"no kernel 'nope' \(kernels found: vadd\); set `entry:`"):
        build(tmp_path, "vadd.cl", (HERE / "vadd.cl").read_text(), "    entry: nope\n" + VADD_ARGS)


def test_required_work_group_size_must_match_local(tmp_path):
    source = (HERE / "matmul_tiled.cl").read_text()
    body = (
        "    entry: matmul_tiled\n    args:\n"
        "      - {name: A, dtype: float32, role: in, shape: [M, K]}\n"
        "      - {name: B, dtype: float32, role: in, shape: [K, N]}\n"
        "      - {name: C, dtype: float32, role: out, shape: [M, N]}\n"
        "      - {name: M, dtype: int32, value: M}\n      - {name: N, dtype: int32, value: N}\n      - {name: K, dtype: int32, value: K}\n"
        "    global: [N, M]\n    local: [8, 8]\n"
    )
    with pytest.raises(BuildError, match=r"declares reqd_work_group_size\(16, 16, 1\), but the manifest's local size is \[8, 8\]; set `local: \[16, 16\]`"):
        build(tmp_path, "mm.cl", source, body)


def test_unroll_hints_that_break_validation_are_dropped_with_a_warning(tmp_path):
    source = (
        "__kernel void vadd(__global const float *a, __global const float *b, __global float *c, int n) {\n"
        "  float s = 0;\n#pragma unroll 4\n  for (int i = 0; i < n; ++i) s += a[i] * b[i];\n"
        "  c[get_global_id(0)] = s;\n}\n"
    )
    with pytest.warns(BuildWarning, match="loop unroll hints dropped"):
        bundle = build(tmp_path, "dot.cl", source)
    assert spirv.read(bundle.blob(bundle.kernel("vadd").stages[0].blob)).kernels["vadd"]


def test_subgroup_variants_are_built_with_their_size(tmp_path):
    source = (
        "__kernel void vadd(__global const float *a, __global const float *b, __global float *c, int n) {\n"
        "  int i = get_global_id(0);\n  if (i < n) c[i] = a[i] + b[i] * PORTKERN_SUBGROUP_SIZE * SCALE;\n}\n"
    )
    body = VADD_ARGS + "    defines: {SCALE: 2}\n    variants:\n      - {subgroup_size: 32}\n      - {subgroup_size: 64, local: [128]}\n"
    record = build(tmp_path, "wave.cl", source, body).kernel("vadd")
    variants = launch_of(record).variants
    assert [(v.subgroup_size, v.local) for v in variants] == [(32, (64,)), (64, (128,))]
    assert len(record.stages) == 4 and variants[0].stages == (0, 1) and variants[1].stages == (2, 3)
    assert record.stages[0].blob != record.stages[2].blob
