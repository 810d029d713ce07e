"""The CLI under odd files: every unreadable `.npy` input is one line and exit 1 (`--json`: one
error object on stdout), and text from a bundle reaches the terminal escaped."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import threading

import numpy as np
import pytest
from helpers import assert_matches, reseal

from portkern.examples.reference import EXAMPLES


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "portkern", *args], capture_output=True, text=True, timeout=timeout)


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


@pytest.mark.parametrize("command", ["inspect", "run", "finalize", "cache import"])
def test_a_device_or_a_named_pipe_in_place_of_a_file_is_refused_at_once(tmp_path, command):
    """Neither read to its end (/dev/zero never ends) nor waited on (a named pipe's opening waits
    for a writer): a bundle or a cache export must be a regular file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        args = {
            "inspect": ["inspect", path],
            "run": ["run", path, "gemm_rowsum"],
            "finalize": ["finalize", path, "--target", "cpu"],
            "cache import": ["cache", "import", path, "--cache-dir", str(tmp_path / "cache")],
        }[command]
        done = cli(*args, timeout=60)
        assert done.returncode == 1 and done.stdout == "", (path, done.stderr)
        assert done.stderr.splitlines() == [f"portkern: error: {path}: cannot read {'cache export' if command == 'cache import' else 'bundle'}: not a regular file"]


def test_an_export_to_a_pipe_streams_into_it_and_leaves_it_a_pipe(examples_bundle, tmp_path):
    """A device or a pipe at the output path is written into, never replaced by a file (as root,
    `-o /dev/null` had replaced the system's /dev/null); what the pipe carried imports whole."""
    cache = str(tmp_path / "cache")
    filled = cli("finalize", str(examples_bundle), "--target", "cpu", "--kernel", "gemm_rowsum", "--cache-dir", cache)
    assert filled.returncode == 0, filled.stderr
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    carried = bytearray()
    reader = threading.Thread(target=lambda: carried.extend(fifo.read_bytes()))
    reader.start()
    exported = cli("cache", "export", str(fifo), "--cache-dir", cache, timeout=120)
    reader.join(timeout=60)
    assert exported.returncode == 0, exported.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and not reader.is_alive()
    (tmp_path / "carried.pkx").write_bytes(bytes(carried))
    imported = cli("cache", "import", str(tmp_path / "carried.pkx"), "--allow-unsigned", "--cache-dir", str(tmp_path / "other"), "--json")
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["entries"] >= 1


def test_a_build_to_what_is_not_a_regular_file_is_refused_before_it_builds(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for output in (fifo, tmp_path):
        done = cli("build", "/nonexistent/manifest.yaml", "-o", str(output), timeout=60)
        assert done.returncode == 1 and done.stderr.splitlines() == [
            f"portkern: error: {output}: not a regular file: a bundle is written to a file, which the build reads back to check"
        ]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_an_export_to_a_socket_is_refused_and_leaves_it(tmp_path):
    """A socket (or a block device) at the output path is neither written into nor replaced."""
    import socket

    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        done = cli("cache", "export", str(path), "--cache-dir", str(tmp_path / "cache"), timeout=60)
    assert done.returncode == 1 and done.stderr.splitlines() == [f"portkern: error: cannot write {path}: it is a socket"]
    assert stat.S_ISSOCK(os.stat(path).st_mode)
