"""Launch descriptions: safe size expressions, manifest checks with lines, binding to arrays, untrusted bundles.

None of these tests needs the OpenCL toolchain or a device.
"""

from __future__ import annotations

import numpy as np
import pytest

import portkern
from portkern.base.errors import ArgumentShapeError, LaunchSpecError, MalformedBundleError, ManifestError
from portkern.jit.args import bind_launch
from portkern.portable import expr
from portkern.portable.bundle import Bundle, KernelRecord, Signature, Stage, TensorSpec, sha256, write_bundle
from portkern.portable.launch import Launch, from_manifest
from portkern.portable.manifest import load_manifest
from portkern.portable.producer import Producer

MATMUL = {
    "args": [
        {"name": "A", "dtype": "float32", "role": "in", "shape": ["M", "K"]},
        {"name": "B", "dtype": "float32", "role": "in", "shape": ["K", "N"]},
        {"name": "C", "dtype": "float32", "role": "out", "shape": ["M", "N"]},
        {"name": "K", "dtype": "int32", "value": "B.shape[0]"},
        {"name": "alpha", "dtype": "float32"},
    ],
    "global": ["round_up(N, 16)", "round_up(M, 16)"],
    "local": [16, 16],
    "requires": ["K % 4 == 0"],
}


@pytest.mark.parametrize(
    "text, symbols, value",
    [
        ("round_up(n, 64)", {"n": 100}, 128),
        ("ceil_div(n, 64) * 64 - n % 7", {"n": 65}, 128 - 2),
        ("max(a, b, 3) + min(a, -b)", {"a": 1, "b": 2}, 1),
        ("x.shape[1] // 2", {}, 5),
        ("17", {}, 17),
    ],
)
def test_expressions_evaluate(text, symbols, value):
    assert expr.parse(text).evaluate(symbols, {"x": (3, 10)}) == value


def test_conditions_chain():
    cond = expr.parse("0 < K <= 64", condition=True)
    assert cond.evaluate({"K": 64}, {}) is True and cond.evaluate({"K": 65}, {}) is False


@pytest.mark.parametrize(
    "text, message",
    [
        ("__import__('os').system('true')", "unknown function"),
        ("n.__class__", "Attribute is not allowed"),
        ("n ** 2", "BinOp is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("n / 2", "BinOp is not allowed"),
        ("1.5 * n", "only integer literals"),
        ("'abc'", "only integer literals"),
        ("True", "only integer literals"),
        ("x.shape[n]", "Subscript is not allowed"),
        ("min(n)", r"min\(\) takes 2 to 8"),
        ("round_up", "is a function"),
        ("n +", "not a valid expression"),
        ("+".join(["n"] * 40), "too complex"),
        ("1" * 300, "longer than 256"),
        ("9" * 30, "too large"),
    ],
)
def test_unsafe_or_malformed_expressions_are_refused(text, message):
    with pytest.raises(LaunchSpecError, match=message):
        expr.parse(text)


@pytest.mark.parametrize("text", ["n \u202e+ 1", "'\u202e\x1b[2J'", "n +\x1b[2J"])
def test_a_refused_expression_is_written_escaped(text):
    """An expression is a bundle's or a manifest's text: the refusal quotes it with its control and
    format characters (a right-to-left override, an escape) written as `\\uXXXX`."""
    with pytest.raises(LaunchSpecError) as refused:
        expr.parse(text)
    message = str(refused.value)
    assert text.replace("\u202e", "\\u202e").replace("\x1b", "\\u001b") in message
    assert "\u202e" not in message and "\x1b" not in message


def test_conditions_must_compare():
    with pytest.raises(LaunchSpecError, match="not a comparison"):
        expr.parse("K % 16", condition=True)


def test_division_by_zero_is_an_error_not_a_crash():
    with pytest.raises(LaunchSpecError, match="division by zero"):
        expr.parse("ceil_div(n, m)").evaluate({"n": 4, "m": 0}, {})


def launch(**changes) -> Launch:
    return from_manifest({**MATMUL, **changes}, "opencl", __import__("pathlib").Path(__file__))[0]


def test_signature_lists_what_the_caller_passes():
    sig = launch().signature()
    assert sig.inputs == (TensorSpec((None, None), "float32"), TensorSpec((None, None), "float32"), TensorSpec((), "float32"))
    assert sig.results == (TensorSpec((None, None), "float32"),)


def test_binding_computes_sizes_and_scalars():
    a, b = np.zeros((20, 8), np.float32), np.zeros((8, 33), np.float32)
    bound = bind_launch("mm", launch(), (16, 16), [a, b, np.float32(1)])
    assert bound.symbols == {"M": 20, "K": 8, "N": 33}
    assert bound.shapes == {"C": (20, 33)} and bound.global_size == (48, 32)
    assert bound.scalars["K"] == 8 and bound.scalars["K"].dtype == np.int32


@pytest.mark.parametrize(
    "shapes, local, message",
    [
        (((20, 8), (9, 33)), (16, 16), r"argument 1 \(B\) must have shape KxN, got 9x33 \(K=8, M=20, N=33\)"),
        (((20, 6), (6, 33)), (16, 16), r"arguments break `K % 4 == 0` \(K=6, M=20, N=33\)"),
        (((20, 8), (8, 33)), (16, 7), r"global size \(48, 32\) is not a whole number of work-groups of \(16, 7\)"),
    ],
)
def test_binding_refuses_inconsistent_shapes(shapes, local, message):
    arrays = [np.zeros(s, np.float32) for s in shapes] + [np.float32(1)]
    with pytest.raises(ArgumentShapeError, match=message):
        bind_launch("mm", launch(), local, arrays)


def test_scalar_that_does_not_fit_its_dtype():
    spec = launch(args=[*MATMUL["args"][:3], {"name": "K", "dtype": "int8", "value": "K"}], requires=[])
    with pytest.raises(ArgumentShapeError, match="argument K = 200 does not fit int8"):
        bind_launch("mm", spec, None, [np.zeros((2, 200), np.float32), np.zeros((200, 3), np.float32)])


def write(tmp_path, body: str, kind: str = "opencl"):
    (tmp_path / "k.cl").write_text("__kernel void k(__global float *a) {}\n")
    (tmp_path / "k.mlir").write_text("")
    path = tmp_path / "m.yaml"
    path.write_text(f"bundle: b\nkernels:\n  - name: k\n    source: k.{'cl' if kind == 'opencl' else 'mlir'}\n{body}")
    return path


ARGS = "    args:\n      - {name: a, dtype: float32, role: in, shape: [n]}\n      - {name: c, dtype: float32, role: out, shape: [n]}\n"


@pytest.mark.parametrize(
    "body, message",
    [
        ("    global: [n]\n", r"m.yaml:3: kernels\[0\]: opencl kernels need `args:`"),
        (ARGS, r"m.yaml:3: kernels\[0\]: opencl kernels need `global:`"),
        (ARGS + "    global: [m]\n", r"m.yaml:8: kernels\[0\].global\[0\]: `m` uses m, which no input shape binds \(bound: n\)"),
        (ARGS + "    global: [n]\n    local: [8, 8]\n", r"m.yaml:9: kernels\[0\].local: has 2 dimensions, the global size has 1"),
        (ARGS + "    global: [n]\n    requires: [n]\n", r"m.yaml:9: kernels\[0\].requires\[0\]: `n` is not a comparison"),
        (ARGS.replace("name: c", "name: a") + "    global: [n]\n", r"m.yaml:7: kernels\[0\].args\[1\].name: two arguments are named 'a'"),
        (ARGS.replace("role: out", "role: in") + "    global: [n]\n", r"m.yaml:6: kernels\[0\].args: no argument has role `out`"),
        (ARGS + "    global: [n]\n    variants:\n      - {subgroup_size: 32}\n      - {subgroup_size: 32}\n",
         r"m.yaml:11: kernels\[0\].variants\[1\].subgroup_size: two variants for sub-group size 32"),
        (ARGS + "    global: [n]\n    variants:\n      - {subgroup_size: 48}\n", r"m.yaml:10: kernels\[0\].variants\[0\].subgroup_size: 48 is not one of \[32, 64\]"),
        (ARGS + "    global: [n]\n    defines: {PORTKERN_X: 1}\n", r"m.yaml:9: kernels\[0\].defines.PORTKERN_X: 'PORTKERN_X' is not a macro name"),
        (ARGS + "    global: [n]\n    defines: {TILE: 'a b'}\n", r"kernels\[0\].defines.TILE: 'a b' is not a plain value"),
        (ARGS.replace("dtype: float32, role: in", "dtype: complex64, role: in") + "    global: [n]\n",
         r"m.yaml:6: kernels\[0\].args\[0\].dtype: 'complex64' is not one of"),
    ],
)
def test_bad_launch_descriptions_name_line_and_key(tmp_path, body, message):
    with pytest.raises(ManifestError, match=message):
        load_manifest(write(tmp_path, body))


def test_launch_keys_are_only_for_opencl_kernels(tmp_path):
    with pytest.raises(ManifestError, match=r"m.yaml:6: kernels\[0\].args: only opencl and spirv kernels take `args` \(this one is mlir\)"):
        load_manifest(write(tmp_path, ARGS + "    global: [n]\n", kind="mlir"))


def _bundle(tmp_path, launch_data: dict, signature: Signature):
    """A bundle with one SPIR-V kernel record; the blob is only a header (nothing here runs it)."""
    blob = bytes.fromhex("03022307" "00000100" "0e000600" "05000000" "00000000")
    stage = Stage("spirv", "opencl", "spirv", sha256(blob), len(blob), Producer("test", "0"))
    record = KernelRecord("k", "opencl", "k", signature, (stage,), "0" * 64, (), launch_data)
    path = tmp_path / "b.pkb"
    write_bundle(Bundle("b", (record,), {stage.blob: blob}), path)
    return path


def good_launch():
    spec = launch()
    return spec, {**spec.to_dict(), "variants": [{"subgroup_size": None, "local": [16, 16], "stages": [0]}]}


def test_a_sound_record_loads(tmp_path):
    spec, data = good_launch()
    assert portkern.load(_bundle(tmp_path, data, spec.signature())).names() == ["k"]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["args"][0].update(shape=["__import__('os')"]), r"launch.args\[0\].shape\[0\]: .*unknown function"),
        (lambda d: d["args"][2].update(shape=["Q"]), r"launch.args\[2\].shape\[0\]: `Q` uses Q, which no input shape binds"),
        (lambda d: d["variants"][0].update(stages=[3]), "variant 0 refers to stage 3, which does not exist"),
        (lambda d: d["args"][0].update(dtype="float64"), r"signature \(\?x\?xfloat32, .* does not match its launch description"),
        (lambda d: d.update(variants=[]), "does not match the bundle schema at kernels/0/launch/variants"),
        (lambda d: d.update(extra=1), "does not match the bundle schema at kernels/0/launch"),
    ],
)
def test_tampered_launch_descriptions_are_refused_on_load(tmp_path, change, message):
    spec, data = good_launch()
    change(data)
    with pytest.raises(MalformedBundleError, match=message):
        portkern.load(_bundle(tmp_path, data, spec.signature()))
