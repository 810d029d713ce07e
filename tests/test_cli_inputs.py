"""The CLI under odd files: every unreadable `.npy` input is one line and exit 1 (`--json`: one
error object on stdout), and text from a bundle reaches the terminal escaped."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import assert_matches, reseal

from portkern.examples.reference import EXAMPLES


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "portkern", *args], capture_output=True, text=True, timeout=300)


def npy_header(shape: tuple[int, ...], dtype: str = "<f4") -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": dtype, "fortran_order": False, "shape": shape})
    return out.getvalue()


def bad_inputs() -> dict[str, tuple[bytes, str]]:
    """File contents by name, with what the one line must say."""
    whole = io.BytesIO()
    np.save(whole, np.ones((64, 64), np.float32))
    return {
        "empty": (b"", "cannot read a .npy array"),
        "huge": (npy_header((10**12,)), "header says 1000000000000 elements"),
        "truncated": (whole.getvalue()[: len(whole.getvalue()) // 2], "elements of float32"),
        "not-npy": (b"hello, world\n", "cannot read a .npy array"),
    }


@pytest.mark.parametrize("name", ["empty", "huge", "truncated", "not-npy"])
def test_an_unreadable_input_is_one_line_and_exit_1(examples_bundle, tmp_path, name):
    data, says = bad_inputs()[name]
    path = tmp_path / f"{name}.npy"
    path.write_bytes(data)
    plain = cli("run", str(examples_bundle), "gemm_rowsum", "--inputs", str(path))
    assert plain.returncode == 1 and plain.stdout == ""
    assert len(plain.stderr.splitlines()) == 1 and plain.stderr.startswith("portkern: error: input 0") and says in plain.stderr
    as_json = cli("run", str(examples_bundle), "gemm_rowsum", "--inputs", str(path), "--json")
    assert as_json.returncode == 1
    error = json.loads(as_json.stdout)  # one JSON document, nothing else on stdout
    assert error["error"] == "ArgumentTypeError" and says in error["message"]


def test_good_inputs_still_run_and_match_numpy(examples_bundle, tmp_path, rng):
    example = EXAMPLES["gemm_rowsum"]
    inputs = example.inputs(rng)
    paths = []
    for i, array in enumerate(inputs):
        paths.append(str(tmp_path / f"in{i}.npy"))
        np.save(paths[-1], array)
    done = cli("run", str(examples_bundle), "gemm_rowsum", "--inputs", *paths, "--out", str(tmp_path / "out.npz"))
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "out.npz") as results:
        outputs = tuple(results[f"result{i}"] for i in range(len(results.files)))
    assert_matches(outputs, example.reference(*inputs), example.rtol, example.atol)


def test_text_from_a_bundle_is_escaped_before_it_is_printed(examples_bundle, tmp_path):
    hostile = reseal(examples_bundle, tmp_path / "hostile.pkb", "3.13.0\u202e[red]gnp.exe\x1b[2J")
    shown = cli("inspect", str(hostile))
    assert shown.returncode == 0, shown.stderr
    assert "producer: " in shown.stdout
    assert "\u202e" not in shown.stdout and "\x1b" not in shown.stdout
    assert "3.13.0\\u202e[red]gnp.exe\\u001b[2J" in shown.stdout  # escaped, and not taken as markup
    as_json = cli("inspect", str(hostile), "--json")
    assert as_json.returncode == 0 and "\u202e" not in as_json.stdout
    versions = {stage["producer"]["version"] for kernel in json.loads(as_json.stdout)["kernels"] for stage in kernel["stages"]}
    assert versions == {"3.13.0\u202e[red]gnp.exe\x1b[2J"}  # the data itself is kept, as JSON escapes
