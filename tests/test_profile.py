"""`portkern profile`: every dispatch of a kernel timed alone, for the default and another config."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from helpers import cli_json, example_manifest

import portkern
from portkern.cli.main import main
from portkern.jit import devices
from portkern.portable.builder import build_file

#: A config that changes dispatch 1 (the row sum) of the GEMM + row-sum example alone.
ROWSUM_CONFIG = "1=cpu:v1:32x0,4x0,0x32"

#: What `portkern profile --json` prints.
SCHEMA = {
    "type": "object",
    "required": ["json_format", "ok", "kernel", "device", "driver", "note", "configs"],
    "properties": {
        "json_format": {"const": 1},
        "ok": {"const": True},
        "configs": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role", "config", "whole_s", "sum_s", "note", "dispatches"],
                "properties": {
                    "role": {"enum": ["default", "tuned", "given"]},
                    "whole_s": {"type": "number", "exclusiveMinimum": 0},
                    "sum_s": {"type": "number", "exclusiveMinimum": 0},
                    "dispatches": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["index", "name", "root", "calls", "call_s", "time_s", "share", "batch", "note"],
                            "properties": {
                                "index": {"type": "integer", "minimum": 0},
                                "calls": {"type": "integer", "minimum": 0},
                                "call_s": {"type": "number", "exclusiveMinimum": 0},
                                "time_s": {"type": "number", "minimum": 0},
                                "share": {"type": "number", "minimum": 0, "maximum": 1},
                                "batch": {"type": "integer", "minimum": 1},
                            },
                        },
                    },
                },
            },
        },
    },
}


@pytest.fixture(scope="module")
def rowsum_bundle(tmp_path_factory):
    where = tmp_path_factory.mktemp("profile")
    path = where / "rowsum.pkb"
    build_file(example_manifest(where, "rowsum", "gemm_rowsum"), path)
    return path


def test_every_dispatch_timed_with_shares_and_the_whole_call(rowsum_bundle, store, capsys):
    status, data = cli_json(capsys, "profile", rowsum_bundle, "gemm_rowsum", "--config", ROWSUM_CONFIG, "--cache-dir", store.config.directory)
    assert status == 0
    jsonschema.validate(data, SCHEMA)
    assert data["kernel"] == "gemm_rowsum" and data["driver"] == "local-task"
    assert [c["role"] for c in data["configs"]] == ["default", "given"]
    assert [c["config"] for c in data["configs"]] == ["default", ROWSUM_CONFIG]
    # the dispatches are the tuner's, by index and name
    bundle = portkern.load(rowsum_bundle, store=store)
    natives, record = bundle.natives, bundle.record("gemm_rowsum")
    analysed = natives.analyse(natives.plan(record, devices.resolve("cpu", store))).dispatches
    for config in data["configs"]:
        assert [(d["index"], d["name"]) for d in config["dispatches"]] == [(d["index"], d["name"]) for d in analysed]
        assert sum(d["share"] for d in config["dispatches"]) == pytest.approx(1.0)
        assert config["sum_s"] == pytest.approx(sum(d["time_s"] for d in config["dispatches"]))
        assert all(d["time_s"] == pytest.approx(d["call_s"] * d["calls"]) for d in config["dispatches"])
    # the config changes dispatch 1 alone: dispatch 0 is the same code, timed once for both
    default, given = data["configs"]
    assert default["dispatches"][0]["call_s"] == given["dispatches"][0]["call_s"]


def test_a_config_with_module_options_is_profiled_in_its_own_module(rowsum_bundle, store, capsys):
    status, data = cli_json(capsys, "profile", rowsum_bundle, "gemm_rowsum", "--config", "data-tiling", "--cache-dir", store.config.directory)
    assert status == 0
    jsonschema.validate(data, SCHEMA)
    default, tiled = data["configs"]
    assert tiled["config"] == "data-tiling"
    # data tiling adds dispatches (the operands' encodings): every one listed, in order, and timed
    assert len(tiled["dispatches"]) > len(default["dispatches"])
    assert [d["index"] for d in tiled["dispatches"]] == list(range(len(tiled["dispatches"])))
    assert sum(d["share"] for d in tiled["dispatches"]) == pytest.approx(1.0)


def scaled_weight_model(where):
    """y = x @ (W * exp(S)), W and S in external data (parameters, as exporters write weights): IREE
    computes W * exp(S) in the module's initializer, once, when the module is loaded."""
    onnx = pytest.importorskip("onnx", reason="ONNX models need the 'onnx' package")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w, scale = rng.standard_normal((64, 128)).astype(np.float32), rng.standard_normal(128).astype(np.float32)
    nodes = [helper.make_node("Exp", ["S"], ["E"]), helper.make_node("Mul", ["W", "E"], ["V"]), helper.make_node("MatMul", ["x", "V"], ["y"])]
    graph = helper.make_graph(
        nodes, "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 128])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(scale, "S")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, where / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    (where / "manifest.yaml").write_text("bundle: scaled\nkernels:\n  - name: scaled\n    source: model.onnx\n")
    build_file(where / "manifest.yaml", where / "scaled.pkb")
    return where / "scaled.pkb", w * np.exp(scale)


def test_a_dispatch_only_the_initializer_runs_has_no_time_in_a_call_and_is_not_tuned(tmp_path, store, capsys):
    path, weight = scaled_weight_model(tmp_path)
    status, data = cli_json(capsys, "profile", path, "scaled", "--cache-dir", store.config.directory)
    assert status == 0
    jsonschema.validate(data, SCHEMA)
    (config,) = data["configs"]
    at_load = [d for d in config["dispatches"] if d["calls"] == 0]
    in_call = [d for d in config["dispatches"] if d["calls"] > 0]
    assert len(at_load) == 1 and "_initializer_" in at_load[0]["name"]
    assert at_load[0]["time_s"] == 0 and at_load[0]["share"] == 0 and "when the module is loaded" in at_load[0]["note"]
    assert at_load[0]["call_s"] > 0  # timed alone all the same
    assert [d["root"] for d in in_call] == ["linalg.matmul"] and in_call[0]["share"] == pytest.approx(1.0)
    assert config["sum_s"] == pytest.approx(in_call[0]["time_s"])
    # `full` tunes every dispatch a call runs, not the initializer's; the result matches NumPy
    status, tuned = cli_json(capsys, "tune", path, "--strategy", "full", "--budget", "2", "--cache-dir", store.config.directory, "--json")
    assert status == 0
    (kernel,) = tuned["kernels"]
    # (module options may be taken first: the tile search then runs on that module's dispatches)
    loading = [d for d in kernel["dispatches"] if "_initializer_" in d["name"]]
    assert loading and all(d["evaluated"] == 0 and "when the module is loaded" in d["note"] for d in loading)
    assert any(d["evaluated"] > 0 for d in kernel["dispatches"] if d not in loading)
    x = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    out = portkern.load(path, store=store).kernel("scaled")(x)
    np.testing.assert_allclose(out, x.astype(np.float64) @ weight, rtol=1e-4, atol=1e-3)


def test_profile_prints_a_table_per_config(rowsum_bundle, store, capsys):
    assert main(["profile", str(rowsum_bundle), "gemm_rowsum", "--cache-dir", str(store.config.directory)]) == 0
    out = capsys.readouterr().out
    assert "default config: default" in out and "gemm_rowsum_dispatch_1" in out
    assert "whole kernel call" in out
    assert "no tuned config is stored" in out


@pytest.mark.parametrize(
    "argv, error",
    [
        (["nope"], "KernelNotFoundError"),
        (["gemm_rowsum", "--config", "0=cpu:v1:bad"], "PerfConfigError"),
        (["gemm_rowsum", "--device", "gfx942"], "TuningError"),
    ],
)
def test_errors_are_one_typed_line(rowsum_bundle, store, capsys, argv, error):
    status = main(["profile", str(rowsum_bundle), *argv, "--cache-dir", str(store.config.directory), "--json"])
    captured = capsys.readouterr()
    assert status == 1
    assert json.loads(captured.out)["error"] == error
    assert len(captured.err.strip().splitlines()) == 1 and captured.err.startswith("portkern: error: ")


def test_refused_where_compiling_is_off(rowsum_bundle, store, capsys, monkeypatch):
    monkeypatch.setenv("PORTKERN_COMPILE", "never")
    status = main(["profile", str(rowsum_bundle), "gemm_rowsum", "--cache-dir", str(store.config.directory), "--json"])
    assert status == 1
    assert json.loads(capsys.readouterr().out)["error"] == "CompileForbiddenError"
