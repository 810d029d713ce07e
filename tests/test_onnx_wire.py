"""Large inline ONNX weights read without loading the model: the protobuf wire-format scan
(`portable.onnx_wire`) moves them out as external data in the original file, the build reads
them from there, and a malformed file is a BuildError, never another exception."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX models need the 'onnx' package")

from onnx import numpy_helper  # noqa: E402

import portkern  # noqa: E402
from portkern.base.errors import BuildError  # noqa: E402
from portkern.examples.large_mlp import reference, write_mlp  # noqa: E402
from portkern.portable import bundle as fmt  # noqa: E402
from portkern.portable import onnx_parameters  # noqa: E402
from portkern.portable.builder import build_file  # noqa: E402
from portkern.portable.onnx_wire import strip_initializers  # noqa: E402

WIDTHS = (64, 512, 256, 256)
BATCH = 8
THRESHOLD = 256


@pytest.fixture
def model(tmp_path) -> Path:
    return write_mlp(tmp_path / "m.onnx", WIDTHS, BATCH, seed=1)


def test_stripped_model_refers_to_the_same_bytes_in_the_original_file(model):
    original = onnx.load(str(model))
    stripped = strip_initializers(model, THRESHOLD)
    assert stripped is not None and len(stripped.model) < 4096 < model.stat().st_size
    raw = model.read_bytes()
    for tensor in original.graph.initializer:
        span = stripped.spans[tensor.name]
        np.testing.assert_array_equal(
            np.frombuffer(raw[span.offset : span.offset + span.size], np.float32).reshape(tuple(tensor.dims)), numpy_helper.to_array(tensor)
        )
    # the stripped model, next to the original, is the same model to onnx (its external data is the original file)
    (model.parent / "s.onnx").write_bytes(stripped.model)
    again = onnx.load(str(model.parent / "s.onnx"))
    onnx.checker.check_model(str(model.parent / "s.onnx"))
    assert [n.op_type for n in again.graph.node] == [n.op_type for n in original.graph.node]
    for a, b in zip(original.graph.initializer, again.graph.initializer):
        assert a.name == b.name
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))


def test_small_initializers_stay_inline(model):
    assert strip_initializers(model, threshold=512 * 256 + 1) is None  # W1 (512x256) is the largest
    stripped = strip_initializers(model, threshold=256 * 256)
    assert set(stripped.spans) == {"W1", "W2"}
    kept = {t.name: t for t in onnx.load_model_from_string(stripped.model).graph.initializer}
    assert kept["W0"].raw_data and not kept["W1"].raw_data and kept["W1"].data_location == onnx.TensorProto.EXTERNAL


def test_a_stripped_build_is_the_same_bundle_and_matches_numpy(tmp_path, model, store, monkeypatch):
    (tmp_path / "manifest.yaml").write_text("bundle: mlp\nkernels:\n  - name: mlp\n    source: m.onnx\n")
    build_file(tmp_path / "manifest.yaml", tmp_path / "whole.pkb")
    monkeypatch.setattr(onnx_parameters, "LARGE_ONNX_BYTES", 0)  # every model is stripped, as a large one is
    build_file(tmp_path / "manifest.yaml", tmp_path / "stripped.pkb")
    a, b = fmt.read_bundle(tmp_path / "whole.pkb"), fmt.read_bundle(tmp_path / "stripped.pkb")
    assert a.parameters.root == b.parameters.root and a.kernel("mlp").stage().blob == b.kernel("mlp").stage().blob
    x = np.random.default_rng(3).standard_normal((BATCH, WIDTHS[0]), dtype=np.float32)
    out = portkern.load(tmp_path / "stripped.pkb", store=store).kernel("mlp")(x)
    np.testing.assert_allclose(out, reference(x, WIDTHS, 1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda b: b[:40], "runs past"),  # cut inside the first initializer's header
        (lambda b: b"\x3a" + b"\xff" * 11, "longer than 64 bits"),
        (lambda b: b"\x3a\x7f" + b"\x00" * 10, "runs past"),
        (lambda b: b"\x3b\x00", "wire type 3"),
        (lambda b: b"\x00\x00", "field number 0"),
        (lambda b: b"", "empty"),
    ],
)
def test_malformed_models_are_build_errors(tmp_path, model, damage, match):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(damage(model.read_bytes()))
    with pytest.raises(BuildError, match=match):
        strip_initializers(bad, THRESHOLD)


def test_raw_data_that_does_not_fit_the_shape_is_a_build_error(tmp_path):
    from onnx import TensorProto, helper

    tensor = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[32, 32], raw_data=np.zeros(1000, np.float32).tobytes())
    graph = helper.make_graph([helper.make_node("Identity", ["W"], ["y"])], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 32])], [tensor])
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(graph).SerializeToString())
    with pytest.raises(BuildError, match=r"'W' has 4000 bytes of raw data, its shape \[32, 32\] needs 4096"):
        strip_initializers(path, THRESHOLD)


def test_random_damage_is_a_build_error_or_a_consistent_model(tmp_path, model):
    """Seeded byte flips and cuts of a model's headers: the scan either refuses the file with a
    BuildError or describes spans that lie inside it; nothing else is raised."""
    data = model.read_bytes()
    spans = strip_initializers(model, THRESHOLD).spans.values()
    assert spans
    # the model's structure: its first bytes (nodes, the graph's header) and each initializer's header
    headers = sorted({*range(256), *(i for s in spans for i in range(max(0, s.offset - 24), s.offset))})
    pick = random.Random(0)
    bad = tmp_path / "bad.onnx"
    refused = described = 0
    for trial in range(300):
        damaged = bytearray(data)
        for _ in range(pick.randint(1, 3)):
            damaged[pick.choice(headers)] = pick.randrange(256)
        if pick.random() < 0.2:
            damaged = damaged[: pick.randrange(1, len(damaged))]
        bad.write_bytes(bytes(damaged))
        try:
            stripped = strip_initializers(bad, THRESHOLD)
        except BuildError:
            refused += 1
            continue
        if stripped is not None:
            described += 1
            assert all(0 <= s.offset and s.offset + s.size <= len(damaged) for s in stripped.spans.values())
    assert refused and described, (refused, described)  # the seeded damage meets both outcomes
