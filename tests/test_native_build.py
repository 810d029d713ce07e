"""The builder reads its output back before publishing it; entry names as real exporters write them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import portkern
from portkern.base.errors import BuildError, MalformedBundleError, ManifestError
from portkern.portable.builder import build_file
from portkern.portable.bundle import encode
from portkern.portable.verify import read_back

QUOTED = """func.func @"{name}"(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4x8xf32> {{
  %0 = arith.mulf %a, %b : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}}
"""


def torch_style_model(path):
    """A two-node model as PyTorch's exporter writes it: graph `torch-jit-export`, dotted tensor names."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(3).uniform(-1, 1, (8, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input.1", "fc.weight"], ["5"]), helper.make_node("Relu", ["5"], ["6"])],
        "torch-jit-export",
        inputs=[helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [2, 8])],
        outputs=[helper.make_tensor_value_info("6", TensorProto.FLOAT, [2, 4])],
        initializer=[numpy_helper.from_array(weight, name="fc.weight")],
    )
    model = helper.make_model(graph, producer_name="pytorch", opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.write_bytes(model.SerializeToString())
    return weight


def test_a_pytorch_style_onnx_model_builds_loads_and_runs(tmp_path, store):
    weight = torch_style_model(tmp_path / "model.onnx")
    (tmp_path / "manifest.yaml").write_text("bundle: torch\nkernels:\n  - name: classifier\n    source: model.onnx\n")
    build_file(tmp_path / "manifest.yaml", tmp_path / "torch.pkb")
    bundle = portkern.load(tmp_path / "torch.pkb", store=store)
    assert bundle.record("classifier").entry == "torch-jit-export"
    x = np.random.default_rng(4).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(bundle.kernel("classifier")(x), np.maximum(x @ weight, 0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("entry", ["main_graph", "model.forward-v2", "$fn.0", "name with spaces"])
def test_quoted_entry_symbols_build_load_and_run(tmp_path, store, entry):
    (tmp_path / "k.mlir").write_text(QUOTED.format(name=entry))
    (tmp_path / "manifest.yaml").write_text(f"bundle: q\nkernels:\n  - name: k\n    source: k.mlir\n    entry: '{entry}'\n")
    build_file(tmp_path / "manifest.yaml", tmp_path / "q.pkb")
    kernel = portkern.load(tmp_path / "q.pkb", store=store).kernel("k")
    a, b = np.random.default_rng(5).standard_normal((2, 4, 8)).astype(np.float32)
    np.testing.assert_allclose(kernel(a, b), a * b, rtol=1e-6)


def test_kernel_names_stay_strict_and_the_error_says_the_rule(tmp_path):
    (tmp_path / "k.mlir").write_text(QUOTED.format(name="k"))
    (tmp_path / "manifest.yaml").write_text("bundle: q\nkernels:\n  - name: 'torch jit/export'\n    source: k.mlir\n")
    with pytest.raises(ManifestError, match=r"'torch jit/export' is not a valid name: 1 to 128 characters, letters, digits, _ \. -"):
        build_file(tmp_path / "manifest.yaml", tmp_path / "q.pkb")


def test_a_bundle_that_fails_the_reader_is_not_written(tmp_path):
    (tmp_path / "k.mlir").write_text(QUOTED.format(name="k"))
    (tmp_path / "manifest.yaml").write_text("bundle: q\nkernels:\n  - name: k\n    source: k.mlir\n")

    def break_entry(bundle):
        return dataclasses.replace(bundle, kernels=(dataclasses.replace(bundle.kernels[0], entry='bad"quote'),))

    with pytest.raises(BuildError, match=r"not written: the bundle as built fails the reader \(MalformedBundleError: .*entry"):
        build_file(tmp_path / "manifest.yaml", tmp_path / "q.pkb", finish=break_entry)
    assert not (tmp_path / "q.pkb").exists()
    bundle = build_file(tmp_path / "manifest.yaml", tmp_path / "q.pkb")
    assert read_back(encode(bundle)).kernels == bundle.kernels
    with pytest.raises(MalformedBundleError, match="entry"):
        read_back(encode(break_entry(bundle)))
