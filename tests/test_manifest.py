"""Manifests: valid ones load; each kind of mistake is a ManifestError naming the line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from portkern.base.errors import ManifestError
from portkern.portable.manifest import load_manifest

KERNEL = "func.func @k(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }\n"


def write(tmp_path: Path, text: str, sources=("k.mlir",)) -> Path:
    for name in sources:
        (tmp_path / name).write_text(KERNEL)
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    return path


def test_valid_manifest_infers_kind_and_resolves_sources(tmp_path):
    path = write(tmp_path, "bundle: b\nkernels:\n  - name: k\n    source: k.mlir\n    entry: k\n")
    manifest = load_manifest(path)
    assert manifest.bundle == "b"
    (kernel,) = manifest.kernels
    assert (kernel.name, kernel.kind, kernel.entry, kernel.line) == ("k", "mlir", "k", 3)
    assert kernel.source == (tmp_path / "k.mlir").resolve()


def test_shipped_example_manifest_is_valid():
    from portkern.examples import MANIFEST

    kinds = {k.name: k.kind for k in load_manifest(MANIFEST).kernels}
    assert kinds["mlp"] == "onnx" and kinds["gemm_glu"] == "mlir"


@pytest.mark.parametrize(
    "text, message",
    [
        ("bundle: b\nkernels:\n  - name: k\n    source: k.mlir\n    colour: red\n", r"manifest.yaml:3: kernels\[0\]: unknown key 'colour'"),
        ("bundle: b\nflavour: x\nkernels:\n  - name: k\n    source: k.mlir\n", r"manifest.yaml:1: manifest: unknown key 'flavour'"),
        ("bundle: b\nkernels:\n  - name: k\n    source: missing.mlir\n", r"manifest.yaml:4: kernels\[0\].source: no such file 'missing.mlir'"),
        ("bundle: b\nkernels:\n  - name: k\n    source: k.mlir\n  - name: k\n    source: k.mlir\n", r"manifest.yaml:5: duplicate kernel name 'k' \(first declared on line 3\)"),
        ("bundle: b\nkernels:\n  - name: k\n    source: k.mlir\n    kind: cuda\n", r"manifest.yaml:5: kernels\[0\].kind: 'cuda' is not one of"),
        ("bundle: b\nkernels:\n  - name: ../etc\n    source: k.mlir\n", r"manifest.yaml:3: kernels\[0\].name: '../etc' is not a valid name"),
        ("bundle: b\nkernels: []\n", r"manifest.yaml:2: kernels: \[\] should be non-empty"),
        ("kernels:\n  - name: k\n    source: k.mlir\n", r"manifest.yaml:1: manifest: 'bundle' is a required property"),
        ("bundle: b\nkernels:\n  - name: k\n    source: k.txt\n", r"manifest.yaml:4: kernels\[0\].source: cannot infer the kind of 'k.txt'"),
        ("bundle: b\nbundle: c\nkernels: []\n", r"manifest.yaml:2: duplicate key 'bundle'"),
        ("bundle: [unclosed\n", r"manifest.yaml:2:1: not valid YAML"),
        ("", r"manifest.yaml: manifest is empty"),
    ],
)
def test_bad_manifest_is_rejected_with_line_and_key(tmp_path, text, message):
    path = write(tmp_path, text, sources=("k.mlir", "k.txt"))
    with pytest.raises(ManifestError, match=message):
        load_manifest(path)


def test_yaml_tags_that_build_objects_are_refused(tmp_path):
    path = write(tmp_path, "bundle: !!python/object/apply:os.system ['true']\nkernels: []\n")
    with pytest.raises(ManifestError):
        load_manifest(path)


def test_unreadable_manifest(tmp_path):
    with pytest.raises(ManifestError, match="cannot read manifest"):
        load_manifest(tmp_path / "nope.yaml")
