"""The source stage: a bundle of another IREE release (simulated by re-sealing a bundle with another
producer record; bench/compat.py uses a real IREE 3.12) runs from its source stage, a `--no-source`
bundle is refused across releases, and an unreadable source stage is a typed error naming both releases."""

from __future__ import annotations

import json
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_example, cli_json, one_kernel_bundle, reseal

import portkern
from portkern.base.errors import IncompatibleProducerError
from portkern.cli.main import main
from portkern.examples import MANIFEST
from portkern.examples.reference import EXAMPLES
from portkern.portable.builder import build_file
from portkern.portable.bundle import read_bundle
from portkern.portable.onnx_layout import transpose_matmul_weights
from portkern.portable.onnx_parameters import ELEMENTS_THRESHOLD
from portkern.portable.producer import Producer, check_release, installed_compiler
from portkern.portable.source import MLIR_TEXT, ONNX_PROTOBUF, PARAMETER_LOCATION, CompatibilityWarning

OTHER = "3.12.0"


@pytest.fixture(scope="module")
def foreign(examples_bundle, tmp_path_factory) -> Path:
    return reseal(examples_bundle, tmp_path_factory.mktemp("foreign") / "foreign.pkb", OTHER)


def test_the_builder_keeps_a_source_stage_per_kernel(examples_bundle):
    bundle = read_bundle(examples_bundle)
    assert bundle.version == (1, 2)
    for record in bundle.kernels:
        source = record.source_stage()
        assert source is not None and source.phase == "start" and record.stage("any").phase == "flow"
        if record.kind == "onnx":
            assert source.format == ONNX_PROTOBUF and source.model == {"opset": 17, "ir_version": 8}
            assert_weights_stored_once(bundle, record, bundle.blob(source.blob))
        else:
            assert source.format == MLIR_TEXT
            assert zlib.decompress(bundle.blob(source.blob)) == (MANIFEST.parent / f"{record.name}.mlir").read_bytes()


def assert_weights_stored_once(bundle, record, data: bytes) -> None:
    """An ONNX source stage holds the model as the bundle keeps it (its MatMul weights transposed,
    `portable.onnx_layout`) except the initializers that are parameters: those have no bytes, are
    marked as the bundle's parameters and are named as in its section."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    model, original = onnx.load_model_from_string(data), onnx.load(MANIFEST.parent / "mlp.onnx")
    assert transpose_matmul_weights(original, ELEMENTS_THRESHOLD) == ["W1", "W2"]
    marked = {t.name for t in model.graph.initializer if uses_external_data(t)}
    assert marked and marked == {p.name for p in record.parameters}
    for tensor, written in zip(model.graph.initializer, original.graph.initializer, strict=True):
        if tensor.name in marked:
            assert not tensor.raw_data and [(e.key, e.value) for e in tensor.external_data] == [("location", PARAMETER_LOCATION)]
            assert tuple(tensor.dims) == tuple(written.dims) and tensor.data_type == written.data_type
        else:
            assert tensor == written
    assert model.graph.node == original.graph.node
    assert len(data) < 2048 < sum(p.size for p in record.parameters) == (64 * 128 + 128 * 16) * 4


@pytest.mark.parametrize("name", ["gemm_bias_relu", "gemm_glu", "mlp"])
def test_a_foreign_release_bundle_runs_from_its_source_stage(foreign, store, rng, name):
    with pytest.warns(CompatibilityWarning, match=f"built with IREE {OTHER}, IREE {installed_compiler().version} is installed"):
        bundle = portkern.load(foreign, store=store)
    kernel = bundle.kernel(name)
    assert kernel.stage == f"source (built with IREE {OTHER})" and kernel.origin == "finalized"
    assert_example(kernel, rng, name)
    (entry,) = [e for e in store.entries() if e.kernel == name]
    assert entry.stage == kernel.stage  # what `cache ls` shows


def test_a_same_release_bundle_uses_its_flow_stage(examples_bundle, store):
    kernel = portkern.load(examples_bundle, store=store).kernel("gemm_rowsum")
    assert kernel.stage == "any/flow"


def test_format_versions_older_readers_refuse_and_headers_must_hold_the_stages(examples_bundle):
    from portkern.base import framing
    from portkern.base.errors import MalformedBundleError, UnsupportedVersionError
    from portkern.portable import bundle as bundle_format

    data = examples_bundle.read_bytes()
    for minor in (0, 1):  # readers of 1.0 and of 1.1 (parameter sections)
        with pytest.raises(UnsupportedVersionError, match=rf"1\.2 is not supported \(this portkern reads 1\.0 to 1\.{minor}\)"):
            framing.unpack_prefix(bundle_format.file_format(minor), data)
    built = read_bundle(examples_bundle)
    kernels = tuple(k for k in built.kernels if not k.parameters)
    blobs = {s.blob: built.blob(s.blob) for k in kernels for s in k.stages}
    plain = replace(built, kernels=kernels, blobs=blobs, parameters=None)
    understated = framing.pack(bundle_format.file_format(1), {"meta": {**plain.meta(), "version": [1, 1]}, "blobs": blobs})
    with pytest.raises(MalformedBundleError, match="source stages need format 1.2; the header says 1.1"):
        bundle_format.decode(understated)


def test_a_no_source_bundle_is_refused_across_releases(tmp_path):
    built = tmp_path / "plain.pkb"
    build_file(MANIFEST, built, source=False)
    assert read_bundle(built).version == (1, 1)  # the oldest version that holds it (mlp has parameters)
    kernels = read_bundle(built).kernels
    assert kernels and all(record.source_stage() is None for record in kernels)
    with pytest.raises(IncompatibleProducerError, match=f"built with IREE {OTHER}, but IREE {installed_compiler().version}"):
        portkern.load(reseal(built, tmp_path / "plain-foreign.pkb", OTHER))


#: A release name that would steer a terminal shown as it is: a right-to-left override, then an
#: escape sequence that clears the screen; and how messages write it.
STEERING, STEERING_SHOWN = "3.12.0\u202e\x1b[2J", "3.12.0\\u202e\\u001b[2J"


def test_a_release_name_that_could_steer_a_terminal_is_written_escaped(examples_bundle, tmp_path, store, rng):
    """A bundle's producer version is the bundle's text: the warning, the kernel's stage and the
    refusals that name it write its control and format characters escaped."""
    with pytest.warns(CompatibilityWarning) as caught:
        bundle = portkern.load(reseal(examples_bundle, tmp_path / "steering.pkb", STEERING), store=store)
    (message,) = [str(w.message) for w in caught if issubclass(w.category, CompatibilityWarning)]
    assert f"built with IREE {STEERING_SHOWN}, IREE {installed_compiler().version} is installed" in message
    kernel = bundle.kernel("gemm_bias_relu")
    assert kernel.stage == f"source (built with IREE {STEERING_SHOWN})"
    assert_example(kernel, rng, "gemm_bias_relu")
    with pytest.raises(IncompatibleProducerError) as refusal:
        check_release(Producer("iree", STEERING))
    assert f"built with IREE {STEERING_SHOWN}, but IREE" in str(refusal.value)
    for text in (message, kernel.stage, str(refusal.value)):
        assert "\u202e" not in text and "\x1b" not in text


def refused(path: Path, store, name: str, why: str):
    """The bundle at `path` (of release OTHER), loaded, after its kernel `name` was refused with an
    IncompatibleProducerError naming both releases and saying `why`."""
    with pytest.warns(CompatibilityWarning):
        bundle = portkern.load(path, store=store)
    with pytest.raises(IncompatibleProducerError) as caught:
        bundle.kernel(name)
    message = str(caught.value)
    assert f"built with IREE {OTHER}" in message and f"installed IREE {installed_compiler().version}" in message and why in message
    return bundle


@pytest.mark.parametrize(
    "blob, why",
    [
        (zlib.compress(b"func.func @gemm_bias_relu(%a: tensor<4xf32> -> {"), "expected"),
        (b"not zlib at all", "damaged"),
        (zlib.compress(b"x" * 100)[:-4], "truncated"),
    ],
    ids=["unparseable", "not-zlib", "truncated"],
)
def test_an_unreadable_source_stage_names_both_releases(examples_bundle, tmp_path, store, rng, blob, why):
    bundle = refused(reseal(examples_bundle, tmp_path / "bad.pkb", OTHER, {"gemm_bias_relu": blob}), store, "gemm_bias_relu", why)
    kernel = bundle.kernel("gemm_glu")  # the other kernels still run
    assert kernel.stage.startswith("source")
    assert_example(kernel, rng)


def _model_source(examples_bundle, change) -> bytes:
    """The mlp's source stage model after `change(model)`."""
    import onnx

    bundle = read_bundle(examples_bundle)
    model = onnx.load_model_from_string(bundle.blob(bundle.kernel("mlp").source_stage().blob))
    change(model)
    return model.SerializeToString()


def _external(location: str, which: int):
    def change(model):
        tensor = model.graph.initializer[which]
        for field in ("raw_data", "float_data"):
            tensor.ClearField(field)
        del tensor.external_data[:]
        tensor.data_location = 1  # EXTERNAL
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", location
    return change


def _unknown_operator(model):
    model.graph.node[0].op_type = "NoSuchOperator"


@pytest.mark.parametrize(
    "change, why",
    [
        (None, "not an ONNX model"),
        (_external("../../../etc/passwd", 0), "refers to external data '../../../etc/passwd', not to the bundle's parameters"),
        (_external(PARAMETER_LOCATION, -1), "ONNX import failed"),  # one the importer keeps in the code: no bytes there
        (_unknown_operator, "IREE cannot compile ONNX operator"),
    ],
    ids=["not-onnx", "escaping-external-data", "marked-but-inline", "unknown-operator"],
)
def test_an_unreadable_onnx_source_stage_names_both_releases(examples_bundle, tmp_path, store, change, why):
    blob = b"\x08\x08garbage" if change is None else _model_source(examples_bundle, change)
    refused(reseal(examples_bundle, tmp_path / "bad.pkb", OTHER, {"mlp": blob}), store, "mlp", why)
    assert not [e for e in store.entries() if e.kernel == "mlp"]  # nothing cached for it


def test_cli_build_no_source_and_inspect_show_the_stages(tmp_path, capsys):
    status, with_source = cli_json(capsys, "build", MANIFEST, "-o", tmp_path / "a.pkb")
    assert status == 0
    status, without = cli_json(capsys, "build", MANIFEST, "-o", tmp_path / "b.pkb", "--no-source")
    assert status == 0
    assert with_source["format_version"] == "1.2"
    phases = {k["name"]: [s["phase"] for s in k["stages"]] for k in with_source["kernels"]}
    assert phases["gemm_glu"] == ["flow", "start"] and phases["mlp"] == ["flow", "start"]
    assert [k["name"] for k in without["kernels"]] == [k["name"] for k in with_source["kernels"]]
    assert all([s["phase"] for s in k["stages"]] == ["flow"] for k in without["kernels"])
    assert main(["inspect", str(tmp_path / "a.pkb")]) == 0
    shown = capsys.readouterr().out
    assert "source (mlir-text-zlib)" in shown and "source (onnx-protobuf, opset 17, IR v8)" in shown


@pytest.mark.parametrize("external", [False, True], ids=["weights-in-model", "external-data"])
def test_a_model_with_parameters_keeps_its_weights_once_and_runs_from_source(tmp_path, store, external):
    from portkern.examples.large_mlp import reference, weight_bytes, write_mlp

    widths, batch = (64, 512, 256, 256), 8
    write_mlp(tmp_path / "m.onnx", widths, batch, 5, external)
    (tmp_path / "manifest.yaml").write_text("bundle: mlp\nkernels:\n  - name: mlp\n    source: m.onnx\n")
    build_file(tmp_path / "manifest.yaml", tmp_path / "with.pkb")
    build_file(tmp_path / "manifest.yaml", tmp_path / "without.pkb", source=False)
    record = read_bundle(tmp_path / "with.pkb").kernel("mlp")
    assert sum(p.size for p in record.parameters) == weight_bytes(widths)
    # the source stage, and what it adds to the bundle, are far smaller than the weights
    assert record.source_stage().size < weight_bytes(widths) // 100
    growth = (tmp_path / "with.pkb").stat().st_size - (tmp_path / "without.pkb").stat().st_size
    assert 0 <= growth < weight_bytes(widths) // 100
    foreign = reseal(tmp_path / "with.pkb", tmp_path / "foreign.pkb", OTHER)
    with pytest.warns(CompatibilityWarning):
        kernel = portkern.load(foreign, store=store).kernel("mlp")
    assert kernel.stage == f"source (built with IREE {OTHER})"
    x = np.random.default_rng(2).standard_normal((batch, widths[0]), dtype=np.float32)
    np.testing.assert_allclose(kernel(x), reference(x, widths, 5), rtol=1e-4, atol=1e-4)


def test_an_older_opset_model_is_kept_as_the_build_imported_it_and_runs_from_source(tmp_path, store):
    import onnx
    from helpers import dense_onnx
    from onnx import numpy_helper

    (tmp_path / "dense.onnx").write_bytes(dense_onnx(opset=13))
    bundle = read_bundle(one_kernel_bundle(tmp_path, "dense.onnx", "dense"))
    record = bundle.kernel("dense")
    source = record.source_stage()
    assert source.model == {"opset": 17, "ir_version": 8}  # upgraded as the build's import did
    assert [p.name for p in record.parameters] == ["W"]
    assert onnx.load_model_from_string(bundle.blob(source.blob)).opset_import[0].version == 17
    with pytest.warns(CompatibilityWarning):
        kernel = portkern.load(reseal(tmp_path / "dense.pkb", tmp_path / "foreign.pkb", OTHER), store=store).kernel("dense")
    assert kernel.stage == f"source (built with IREE {OTHER})"
    model = onnx.load_model_from_string(dense_onnx())
    w, b = (numpy_helper.to_array(t) for t in model.graph.initializer)
    x = np.random.default_rng(3).standard_normal((4, 16), dtype=np.float32)
    np.testing.assert_allclose(kernel(x), np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)


def test_cli_run_and_cache_ls_say_the_code_came_from_the_source_stage(foreign, tmp_path, capsys, rng):
    example = EXAMPLES["gemm_transpose_add"]
    inputs = example.inputs(rng)
    paths = [tmp_path / f"in{i}.npy" for i in range(len(inputs))]
    for path, array in zip(paths, inputs):
        np.save(path, array)
    cache = ["--cache-dir", str(tmp_path / "cache")]
    status = main(["run", str(foreign), "gemm_transpose_add", "--inputs", *map(str, paths), "--out", str(tmp_path / "out.npz"), *cache, "--json"])
    out, err = capsys.readouterr()
    assert status == 0 and json.loads(out)["stage"] == f"source (built with IREE {OTHER})"
    assert err.count(f"warning: {foreign}: built with IREE {OTHER}") == 1  # one line
    with np.load(tmp_path / "out.npz") as saved:
        np.testing.assert_allclose(saved["result0"], example.reference(*inputs)[0], rtol=example.rtol, atol=example.atol)
    assert main(["cache", "ls", *cache]) == 0
    assert f"source (built with IREE {OTHER})" in capsys.readouterr().out.replace("\n", " ")


def test_a_bytecode_source_keeps_a_text_source_stage(tmp_path, store, rng):
    from portkern.portable.compiler import Compiler, bytecode

    module = Compiler().parse((MANIFEST.parent / "gemm_glu.mlir").read_bytes())
    (tmp_path / "gemm_glu.mlirbc").write_bytes(bytecode(module))
    bundle = read_bundle(one_kernel_bundle(tmp_path, "gemm_glu.mlirbc", "gemm_glu", bundle="bc"))
    text = zlib.decompress(bundle.blob(bundle.kernel("gemm_glu").source_stage().blob))
    assert b"func.func @gemm_glu" in text and not text.startswith(b"ML\xefR")
    with pytest.warns(CompatibilityWarning):
        kernel = portkern.load(reseal(tmp_path / "bc.pkb", tmp_path / "foreign.pkb", OTHER), store=store).kernel("gemm_glu")
    assert kernel.stage.startswith("source")
    assert_example(kernel, rng)


def test_a_foreign_release_bundle_is_tuned_from_its_source_stage(foreign, store, rng):
    """`tune="quick"` on another release's bundle searches, compiling its candidates from the
    source stage with this IREE, and the tuned kernel matches NumPy."""
    with pytest.warns(CompatibilityWarning):
        bundle = portkern.load(foreign, store=store)
    kernel = bundle.kernel("gemm_transpose_add", tune="quick")
    assert kernel.tuning is not None and kernel.tuning.source == "search" and kernel.tuning.best_s > 0
    assert kernel.stage == f"source (built with IREE {OTHER})"
    assert_example(kernel, rng, "gemm_transpose_add")
    stages = [e.stage for e in store.entries() if e.kernel == "gemm_transpose_add"]
    assert stages and all(stage == kernel.stage for stage in stages)
