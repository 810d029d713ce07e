"""ONNX models nobody here wrote (the onnx package's `pytorch-converted` and `light` models), run the two
ways users run them (a manifest naming the shipped file; `portkern.onnx.prepare`), each in a fresh
process with a fresh cache, every output compared with onnx's reference at rtol 1e-3, atol 1e-5.
A seeded sample (bench/onnx_corpus.py runs all 91); names as exporters write them; weights kept by
`--prebuild`; the MaxPool padding IREE cannot lower as written."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from helpers import assert_example, assert_matches  # noqa: E402

import portkern  # noqa: E402
from portkern import onnx as backend  # noqa: E402
from portkern.base.errors import ArgumentTypeError, BuildError  # noqa: E402
from portkern.cli.main import main  # noqa: E402
from portkern.examples import MANIFEST  # noqa: E402
from portkern.examples import onnx_corpus as corpus  # noqa: E402
from portkern.portable.builder import build_file  # noqa: E402
from portkern.portable.onnx_model import prepare  # noqa: E402

#: Always run, both routes: a PyTorch export whose input is named `0`, a Caffe2 model whose names hold `/`.
ALWAYS = ("test_Softmax", "light_shufflenet")
SEED = 33
SAMPLE = corpus.sample({"pytorch-converted": 5, "light": 1}, SEED, always=ALWAYS)
RUNS = [(m, r, m.name in ALWAYS and r == "manifest") for m in SAMPLE[: len(ALWAYS)] for r in corpus.ROUTES]
RUNS += [(m, corpus.ROUTES[i % 2], False) for i, m in enumerate(SAMPLE[len(ALWAYS):])]
#: Models that broke once, on the route that broke: a strided, dilated MaxPool whose NaN rewrite
#: gathers through a Constant large enough for the importer to make it a parameter.
RUNS += [(corpus.by_name("test_MaxPool1d_stride_padding_dilation"), "manifest", False)]


def test_the_always_run_models_have_the_names_exporters_write():
    assert corpus.input_names(corpus.by_name("test_Softmax")) == ["0"]
    assert any("/" in name for name in corpus.input_names(corpus.by_name("light_shufflenet")))


@pytest.mark.parametrize("model,route,by_names", RUNS, ids=[f"{m.name}-{r}{'-by-name' if n else ''}" for m, r, n in RUNS])
def test_a_model_nobody_here_wrote_matches_onnx_reference(model, route, by_names):
    result = corpus.run(model, route, timeout_s=170, by_names=by_names)
    assert result.built and result.correct, f"{model.suite}/{model.name} ({route}): {result.reason}"
    assert result.max_error is not None


def free_named_model():
    """A model named as current exporters name values: input `0` (dynamic batch), weights `onnx::MatMul_12`
    (a parameter) and `gpu_0/b:0`, output `out put ü`."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["0", "onnx::MatMul_12"], ["/l/MatMul_output_0"]),
            helper.make_node("Add", ["/l/MatMul_output_0", "gpu_0/b:0"], ["y/0"]),
            helper.make_node("Relu", ["y/0"], ["out put ü"]),
        ],
        "torch-jit-export",
        [helper.make_tensor_value_info("0", TensorProto.FLOAT, ["batch", 8]), helper.make_tensor_value_info("gpu_0/x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("out put ü", TensorProto.FLOAT, ["batch", 64])],
        [numpy_helper.from_array(w, "onnx::MatMul_12"), numpy_helper.from_array(b, "gpu_0/b:0")],
    )
    graph.node.append(helper.make_node("Identity", ["gpu_0/x"], ["unused"]))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), (lambda x: np.maximum(x @ w + b, 0))


def test_names_are_data_carried_with_their_identifiers_and_calls_may_use_either(tmp_path, store):
    model, reference = free_named_model()
    onnx.save(model, str(tmp_path / "m.onnx"))
    (tmp_path / "m.yaml").write_text("bundle: names\nkernels:\n  - name: k\n    source: m.onnx\n")
    built = build_file(tmp_path / "m.yaml", tmp_path / "m.pkb")
    assert built.version == (1, 3)  # free-text names
    contract = built.kernel("k").signature.contract
    assert contract.names == ("0", "gpu_0/x") and contract.identifiers == ("v_0", "gpu_0_x")
    kernel = portkern.load(tmp_path / "m.pkb", store=store).kernel("k")
    x, extra = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32), np.zeros(1, np.float32)
    want = reference(x.astype(np.float64)).astype(np.float32)
    assert_matches(kernel(x, extra), [want], 1e-5, 1e-5)
    assert_matches(kernel(**{"0": x, "gpu_0/x": extra}), [want], 1e-5, 1e-5)
    assert_matches(kernel(v_0=x, gpu_0_x=extra), [want], 1e-5, 1e-5)
    assert_matches(kernel(x, gpu_0_x=extra), [want], 1e-5, 1e-5)
    with pytest.raises(ArgumentTypeError, match=r"no argument 'gpu_0/y' \(arguments: '0', 'gpu_0/x'\)"):
        kernel(x, **{"gpu_0/y": extra})
    with pytest.raises(ArgumentTypeError, match="twice"):
        kernel(x, extra, v_0=x)
    with pytest.raises(ArgumentTypeError, match="no value for argument '0'"):
        kernel(gpu_0_x=extra)


def test_shapes_keys_may_be_free_text_names(tmp_path):
    model, _ = free_named_model()
    onnx.save(model, str(tmp_path / "m.onnx"))
    (tmp_path / "m.yaml").write_text(
        'bundle: names\nkernels:\n  - name: k\n    source: m.onnx\n    shapes:\n      "0": [B, 8]\n      "out put ü": [B, 64]\n'
    )
    contract = build_file(tmp_path / "m.yaml", tmp_path / "m.pkb").kernel("k").signature.contract
    assert contract.inputs[0] == ("B", 8) and contract.results[0] == ("B", 64) and contract.origin == "stated"


def padded_maxpool(opset: int):
    from onnx import TensorProto, helper

    node = helper.make_node("MaxPool", ["gpu_0/x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])
    graph = helper.make_graph(
        [node], "pool", [helper.make_tensor_value_info("gpu_0/x", TensorProto.FLOAT, [1, 2, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 6, 6])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 3 if opset < 11 else 8
    return model


@pytest.mark.parametrize("opset", [9, 17])
def test_a_maxpool_padded_at_one_end_builds_and_matches_onnx_reference(opset):
    from onnx.reference import ReferenceEvaluator

    model = padded_maxpool(opset)
    x = -np.abs(np.random.default_rng(opset).standard_normal((1, 2, 12, 12))).astype(np.float32) - 1  # padding must not win
    want = ReferenceEvaluator(model).run(None, {"gpu_0/x": x})[0]
    prepared = onnx.ModelProto()
    prepared.CopyFrom(model)
    assert prepare(prepared) and [n.op_type for n in prepared.graph.node] == ["Pad", "MaxPool"]
    onnx.checker.check_model(prepared)
    assert_matches(ReferenceEvaluator(prepared).run(None, {"gpu_0/x": x})[0], [want], 0, 0)
    assert_matches(backend.run_model(model, [x])[0], [want], 1e-6, 0)


@pytest.fixture(scope="module")
def mlp_manifest(tmp_path_factory):
    where = tmp_path_factory.mktemp("mlp")
    (where / "manifest.yaml").write_text(f"bundle: mlp\nkernels:\n  - name: mlp\n    source: {MANIFEST.parent / 'mlp.onnx'}\n")
    return where / "manifest.yaml"


def test_a_prebuilt_onnx_bundle_keeps_its_weights_and_runs(mlp_manifest, store):
    out = mlp_manifest.parent / "prebuilt.pkb"
    assert main(["build", str(mlp_manifest), "-o", str(out), "--prebuild", "cpu:x86-64-v2", "--json"]) == 0
    bundle = portkern.load(out, store=store)
    record = bundle.bundle.kernel("mlp")
    assert record.parameters and [n.target for n in record.native] == ["cpu:x86-64-v2"]
    kernel = bundle.kernel("mlp")
    assert_example(kernel, np.random.default_rng(3), "mlp")


def test_the_builder_refuses_a_bundle_whose_kernels_lack_their_parameters(mlp_manifest):
    out = mlp_manifest.parent / "dropped.pkb"
    with pytest.raises(BuildError, match=r"kernel 'mlp' needs 2 parameter\(s\) the bundle lacks"):
        build_file(mlp_manifest, out, finish=lambda bundle: dataclasses.replace(bundle, parameter_data=()))
    assert not out.exists()
