"""The builder: deterministic bundles, signatures, and clear errors for bad sources."""

from __future__ import annotations

import pytest

from portkern.base.errors import BuildError
from portkern.examples import MANIFEST
from portkern.portable.builder import build_file
from portkern.portable.bundle import read_bundle


def test_same_inputs_give_byte_identical_bundles(examples_bundle, tmp_path):
    again = tmp_path / "again.pkb"
    build_file(MANIFEST, again)
    assert again.read_bytes() == examples_bundle.read_bytes()


def test_signatures_and_entries(examples_bundle):
    bundle = read_bundle(examples_bundle)
    glu = bundle.kernel("gemm_glu")
    assert glu.entry == "gemm_glu" and glu.kind == "mlir"
    assert [(t.shape, t.dtype) for t in glu.signature.inputs] == [((256, 512), "float32"), ((512, 768), "float32")]
    assert [(t.shape, t.dtype) for t in glu.signature.results] == [((256, 384), "float32")]
    mlp = bundle.kernel("mlp")
    assert mlp.kind == "onnx" and mlp.entry == "mlp"
    assert [t.shape for t in mlp.signature.inputs] == [(32, 64)]


def _build(tmp_path, source: str, name="k.mlir", extra=""):
    (tmp_path / name).write_text(source)
    (tmp_path / "m.yaml").write_text(f"bundle: t\nkernels:\n  - name: k\n    source: {name}\n{extra}")
    return build_file(tmp_path / "m.yaml", tmp_path / "t.pkb")


def test_mlir_syntax_error_names_file_and_line(tmp_path):
    with pytest.raises(BuildError, match=r"k\.mlir: k: cannot parse MLIR: .*k\.mlir:2:"):
        _build(tmp_path, "func.func @k(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<5xf32>\n}\n")


def test_several_public_functions_need_an_entry(tmp_path):
    two = (
        "func.func @a(%x: tensor<4xf32>) -> tensor<4xf32> { return %x : tensor<4xf32> }\n"
        "func.func @b(%x: tensor<4xf32>) -> tensor<4xf32> { return %x : tensor<4xf32> }\n"
    )
    with pytest.raises(BuildError, match=r"several public functions \(a, b\); name one with `entry:`"):
        _build(tmp_path, two)
    bundle = _build(tmp_path, two, extra="    entry: b\n")
    assert bundle.kernel("k").entry == "b"
    with pytest.raises(BuildError, match=r"no public function 'c' \(found: a, b\)"):
        _build(tmp_path, two, extra="    entry: c\n")


def test_unsupported_element_type(tmp_path):
    with pytest.raises(BuildError, match="argument 0 of 'k' has element type i4, which has no NumPy dtype"):
        _build(tmp_path, "func.func @k(%a: tensor<4xi4>) -> tensor<4xi4> { return %a : tensor<4xi4> }\n")
    bundle = _build(tmp_path, "func.func @k(%a: tensor<4xbf16>) -> tensor<4xbf16> { return %a : tensor<4xbf16> }\n")
    assert bundle.kernel("k").signature.inputs[0].dtype == "bfloat16"  # through ml_dtypes


def test_dynamic_shapes_are_recorded(tmp_path):
    bundle = _build(tmp_path, "func.func @k(%a: tensor<?x4xf32>) -> tensor<?x4xf32> { return %a : tensor<?x4xf32> }\n")
    assert bundle.kernel("k").signature.inputs[0].shape == (None, 4)


def test_invalid_onnx_model(tmp_path):
    with pytest.raises(BuildError, match="ONNX import failed"):
        _build(tmp_path, "not a protobuf", name="m.onnx")


def test_a_free_threaded_python_gets_a_typed_error_not_a_hang(monkeypatch):
    """IREE's compiler API never returned on Python 3.13t: refused at once, with what to do."""
    from portkern.base.errors import CompileError
    from portkern.portable import compiler

    monkeypatch.setattr(compiler, "gil_enabled", lambda: False)
    with pytest.raises(CompileError, match="free-threaded"):
        compiler.Compiler()
