"""Every common mistake is answered with what to do next (issue 23): one test per hint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from portkern.base.errors import ArgumentTypeError, KernelNotFoundError, ManifestError, did_you_mean
from portkern.jit.args import check_arguments
from portkern.portable.bundle import Signature, TensorSpec
from portkern.portable.manifest import load_manifest

VADD_ARGS = """    args:
      - {name: a, dtype: float32, role: in, shape: [n]}
      - {name: c, dtype: float32, role: out, shape: [n]}
      - {name: n, dtype: int32, value: n}
"""


def manifest(tmp_path: Path, text: str) -> Path:
    (tmp_path / "k.cl").write_text("__kernel void k(__global const float *a, __global float *c, int n) {}\n")
    (tmp_path / "k.mlir").write_text("func.func @k(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }\n")
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "portkern", *args], capture_output=True, text=True, timeout=300)


def test_python_float_for_a_scalar_argument_says_to_pass_a_numpy_scalar():
    signature = Signature((TensorSpec((4,), "float32"), TensorSpec((), "float32")), (TensorSpec((4,), "float32"),))
    with pytest.raises(ArgumentTypeError, match=r"argument 1 must be a numpy array of float32, got float \(pass a scalar as a NumPy scalar: np\.float32\(2\.5\)\)"):
        check_arguments("axpy", signature, [np.zeros(4, np.float32), 2.5])
    # A NumPy scalar is accepted and stays 0-d (the runtime checks the rank).
    _, alpha = check_arguments("axpy", signature, [np.zeros(4, np.float32), np.float32(2.5)])
    assert alpha.shape == () and alpha == np.float32(2.5)


def test_a_list_for_a_tensor_argument_gets_no_scalar_hint():
    signature = Signature((TensorSpec((4,), "float32"),), ())
    with pytest.raises(ArgumentTypeError) as info:
        check_arguments("k", signature, [[0.0] * 4])
    assert "NumPy scalar" not in str(info.value)


def test_unquoted_expression_with_a_comma_says_to_quote_it(tmp_path):
    path = manifest(tmp_path, "bundle: b\nkernels:\n  - name: k\n    source: k.cl\n" + VADD_ARGS + "    global: [round_up(n, 64)]\n")
    with pytest.raises(ManifestError, match=r'manifest.yaml:9: kernels\[0\]\.global\[0\]: `round_up\(n` is not a valid expression .*quote the whole expression, e\.g\. \["round_up\(n, 64\)"\]'):
        load_manifest(path)


def test_quoted_expression_with_a_comma_is_accepted(tmp_path):
    path = manifest(tmp_path, "bundle: b\nkernels:\n  - name: k\n    source: k.cl\n" + VADD_ARGS + '    global: ["round_up(n, 64)"]\n')
    (kernel,) = load_manifest(path).kernels
    assert kernel.options["global"] == ["round_up(n, 64)"]


def test_yaml_error_names_file_line_column_and_the_offending_line(tmp_path):
    path = manifest(tmp_path, "bundle: b\nkernels:\n  - name: k\n    source: k.mlir\n   kind: mlir\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    message = str(info.value)
    assert message.startswith(f"{path}:5:4: not valid YAML: expected <block end>")
    assert message.endswith(": `   kind: mlir`")
    assert "\n" not in message and "<unicode string>" not in message


def test_yaml_error_in_the_cli_is_one_line_keeping_the_indentation(tmp_path):
    path = manifest(tmp_path, "bundle: b\n\tkernels: []\n")
    done = cli("build", str(path), "-o", str(tmp_path / "b.pkb"))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"portkern: error: {path}:2:1: not valid YAML: found character '\\t'")
    assert done.stderr.endswith(": `\tkernels: []`\n")


@pytest.mark.parametrize(
    "text, message",
    [
        ("bundle: b\nkernel:\n  - name: k\n    source: k.mlir\n", r"manifest.yaml:1: manifest: unknown key 'kernel' \(did you mean 'kernels'\?\) \(allowed: bundle, kernels, targets\)"),
        ("bundle: b\nkernels:\n  - name: k\n    sourse: k.mlir\n", r"manifest.yaml:3: kernels\[0\]: unknown key 'sourse' \(did you mean 'source'\?\) \(allowed: "),
    ],
)
def test_unknown_manifest_key_suggests_the_closest(tmp_path, text, message):
    with pytest.raises(ManifestError, match=message):
        load_manifest(manifest(tmp_path, text))


def test_unlike_unknown_key_gets_no_suggestion(tmp_path):
    with pytest.raises(ManifestError) as info:
        load_manifest(manifest(tmp_path, "bundle: b\nkernels:\n  - name: k\n    source: k.mlir\n    colour: red\n"))
    assert "did you mean" not in str(info.value) and "unknown key 'colour'" in str(info.value)


def test_unknown_kernel_name_suggests_the_closest(examples_bundle):
    from portkern.portable.bundle import read_bundle

    with pytest.raises(KernelNotFoundError, match=r"has no kernel 'gemm_bias_rel' \(did you mean 'gemm_bias_relu'\?\) \(it has: gemm_bias_relu, "):
        read_bundle(examples_bundle).kernel("gemm_bias_rel")
    done = cli("run", str(examples_bundle), "gemm_glue")
    assert done.returncode == 1
    assert "(did you mean 'gemm_glu'?)" in done.stderr and done.stderr.count("\n") == 1


def test_did_you_mean_is_empty_without_a_close_match():
    assert did_you_mean("zzz", ["source", "entry"]) == ""
    assert did_you_mean("entyr", ["source", "entry"]) == " (did you mean 'entry'?)"
