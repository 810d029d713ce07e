"""`portkern profile`: every dispatch of a kernel timed alone, for the default and another config."""

from __future__ import annotations

import json

import jsonschema
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
                                "calls": {"type": "integer", "minimum": 1},
                                "call_s": {"type": "number", "exclusiveMinimum": 0},
                                "time_s": {"type": "number", "exclusiveMinimum": 0},
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
