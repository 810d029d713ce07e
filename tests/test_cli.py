"""The command line: JSON for scripts, one-line errors with a non-zero exit, no tracebacks."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from helpers import cli_json

from portkern.cli.main import main
from portkern.examples import MANIFEST
from portkern.examples.reference import EXAMPLES


def test_build_and_inspect(tmp_path, capsys):
    out = tmp_path / "b.pkb"
    status, built = cli_json(capsys, "build", str(MANIFEST), "-o", str(out))
    assert status == 0 and built["written"] == str(out)
    status, shown = cli_json(capsys, "inspect", str(out))
    assert status == 0 and shown["digest"] == built["digest"] and shown["format_version"] == "1.2"
    assert shown["size"] == out.stat().st_size == shown["parameters"]["offset"] + shown["parameters"]["size"]
    kernels = {k["name"]: k for k in shown["kernels"]}
    assert kernels["mlp"]["parameters"] == {"count": 2, "bytes": (64 * 128 + 128 * 16) * 4}
    assert kernels["gemm_rowsum"]["signature"]["results"] == [{"shape": [256], "dtype": "float32"}]
    assert kernels["mlp"]["stages"][0]["producer"]["compiler"] == "iree"


def test_run_writes_results_that_match_numpy(examples_bundle, tmp_path, capsys, rng):
    example = EXAMPLES["gemm_transpose_add"]
    inputs = example.inputs(rng)
    paths = []
    for i, array in enumerate(inputs):
        paths.append(tmp_path / f"in{i}.npy")
        np.save(paths[-1], array)
    status, report = cli_json(
        capsys, "run", str(examples_bundle), "gemm_transpose_add", "--inputs", *map(str, paths),
        "--out", str(tmp_path / "out.npz"), "--cache-dir", str(tmp_path / "cache"),
    )
    assert status == 0 and report["results"] == [{"name": "result0", "shape": [384, 256], "dtype": "float32"}]
    with np.load(tmp_path / "out.npz") as saved:
        np.testing.assert_allclose(saved["result0"], example.reference(*inputs)[0], rtol=example.rtol, atol=example.atol)


def test_run_refuses_pickled_inputs(examples_bundle, tmp_path, capsys):
    np.save(tmp_path / "evil.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    status = main(["run", str(examples_bundle), "mlp", "--inputs", str(tmp_path / "evil.npy")])
    assert status == 1
    assert "cannot read a .npy array" in capsys.readouterr().err


def test_devices_lists_this_cpu(capsys):
    status, report = cli_json(capsys, "devices")
    cpu = next(p for p in report if p["kind"] == "cpu")
    assert status == 0 and cpu["found"] and cpu["devices"][0]["label"].startswith("cpu:")
    assert len(cpu["devices"][0]["fingerprint"]) == 64


@pytest.mark.parametrize(
    "argv, message",
    [
        (["inspect", "/nonexistent.pkb"], "cannot read bundle"),
        (["inspect", __file__], "not a portkern bundle"),
        (["build", "/nonexistent.yaml", "-o", "/tmp/x.pkb"], "cannot read manifest"),
        (["run", "{bundle}", "gemm_glu", "--inputs"], r"gemm_glu\(\) takes 2 arguments"),
        (["run", "{bundle}", "gemm_glu", "--device", "tpu"], "unknown device kind 'tpu'"),
    ],
)
def test_errors_are_one_line_with_nonzero_exit(argv, message, examples_bundle, capsys):
    argv = [a.format(bundle=examples_bundle) for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("portkern: error: ") and "\n" not in err
    assert re.search(message, err)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["demo", "--seed", "-1"], "argument --seed: -1 is not from 0 to 2\\*\\*63-1"),
        (["demo", "--seed", "x"], "argument --seed: 'x' is not an integer"),
        (["run"], "the following arguments are required: bundle, kernel"),
        (["nonsense"], "invalid choice: 'nonsense'"),
    ],
)
def test_usage_errors_are_one_line_and_json_under_json(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("portkern: error: ") and "\n" not in err and re.search(message, err)
    assert main([*argv, "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["error"] == "UsageError" and re.search(message, report["message"])


@pytest.mark.parametrize("command", ["finalize", "build"])
@pytest.mark.parametrize("given", ["", " , "])
def test_an_empty_target_list_is_a_usage_error_not_a_success(examples_bundle, tmp_path, capsys, command, given):
    """`--target "$UNSET"` finalised nothing and said so with exit 0; `--prebuild ""` built without prebuilds."""
    argv = {
        "finalize": ["finalize", str(examples_bundle), "--target", given, "--cache-dir", str(tmp_path / "cache")],
        "build": ["build", str(MANIFEST), "-o", str(tmp_path / "b.pkb"), "--prebuild", given],
    }[command]
    assert main(argv) == 2
    flag = "--target" if command == "finalize" else "--prebuild"
    assert capsys.readouterr().err.strip() == f"portkern: error: {flag} names no target ({given!r}); e.g. " + (
        "--target cpu,gfx942" if command == "finalize" else "--prebuild cpu:x86-64-v3,gfx942"
    )
    assert not (tmp_path / "b.pkb").exists()


def test_run_refuses_an_out_name_that_is_not_npz(examples_bundle, tmp_path, capsys):
    status = main(["run", str(examples_bundle), "gemm_glu", "--out", str(tmp_path / "r.txt"), "--cache-dir", str(tmp_path / "cache")])
    assert status == 1 and "give a name ending in .npz" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_error_as_json(capsys):
    assert main(["inspect", "/nonexistent.pkb", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["error"] == "BundleError" and "cannot read bundle" in report["message"]


def test_console_script_has_no_traceback(tmp_path):
    bad = tmp_path / "bad.pkb"
    bad.write_bytes(b"\x89PKB\r\n\x1a\n" + b"\x00" * 10)
    done = subprocess.run([sys.executable, "-m", "portkern", "inspect", str(bad)], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip() == f"portkern: error: {bad}: truncated: 18 bytes, shorter than the 52-byte header"


def test_demo_builds_runs_and_checks_every_example(tmp_path, capsys):
    (tmp_path / "opencl-examples.pkb").write_bytes(b"someone else's bundle")
    status, report = cli_json(capsys, "demo", "-o", str(tmp_path / "demo.pkb"), "--cache-dir", str(tmp_path / "cache"))
    assert status == 0 and report["ok"]
    assert (tmp_path / "opencl-examples.pkb").read_bytes() == b"someone else's bundle"
    assert report["opencl"]["bundle"] == str(tmp_path / "demo-opencl.pkb")
    assert sorted(r["kernel"] for r in report["results"]) == sorted(EXAMPLES)
    assert all(r["max_abs_error"] <= r["atol"] + r["rtol"] for r in report["results"])
    assert len(report["cache"]) == len(EXAMPLES)
