"""Assertions, bundles, CLI runs and skip reasons shared by the tests."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

#: Skips a CI run expects (tests/conftest.py fails a run under CI on any other skip): a skip
#: whose reason starts with `[kind] ` (`expected_skip`) is one of these kinds.
EXPECTED_SKIPS = {
    "cpu": "this host's CPU decides: its features (AVX-512 for x86-64-v4 code), ISA level or architecture",
    "device": "a GPU, a GPU driver or runtime, or an OpenCL device's capability decides (CI has no GPU)",
    "torch": "needs the torch extra, which only CI's torch step installs (./dev.sh torch runs these tests)",
}


def expected_skip(kind: str, why: str) -> str:
    """The reason of a skip that CI expects: `why`, marked as a skip of `kind` (`EXPECTED_SKIPS`)."""
    if kind not in EXPECTED_SKIPS:
        raise ValueError(f"{kind!r} is not an expected kind of skip ({', '.join(EXPECTED_SKIPS)})")
    return f"[{kind}] {why}"


def assert_matches(outputs, references, rtol: float, atol: float) -> None:
    """Every output equals its NumPy reference within rtol/atol."""
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    assert len(outputs) == len(references)
    for got, want in zip(outputs, references):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def assert_example(kernel, rng: np.random.Generator, name: str | None = None) -> None:
    """The kernel, run on inputs of the shipped example `name` (default: the kernel's own name)
    drawn from `rng`, gives the example's NumPy reference within its tolerances."""
    from portkern.examples.reference import EXAMPLES

    example = EXAMPLES[name or kernel.name]
    inputs = example.inputs(rng)
    assert_matches(kernel(*inputs), example.reference(*inputs), example.rtol, example.atol)


def cli_json(capsys, *argv) -> tuple[int, object]:
    """`portkern ARGV... --json` run in this process: its exit status and the JSON it printed."""
    from portkern.cli.main import main

    status = main([*map(str, argv), "--json"])
    return status, json.loads(capsys.readouterr().out)


def one_kernel_bundle(where: Path, source, name: str = "k", extra: str = "", bundle: str | None = None) -> Path:
    """A bundle `<where>/<bundle>.pkb` (`bundle` defaults to `name`) of one kernel `name` from
    `source` (a file in `where`, or a path), with `extra` manifest lines for the kernel;
    its manifest is `<where>/<bundle>.yaml`."""
    from portkern.portable.builder import build_file

    bundle = bundle or name
    manifest = where / f"{bundle}.yaml"
    manifest.write_text(f"bundle: {bundle}\nkernels:\n  - name: {name}\n    source: {source}\n{extra}")
    build_file(manifest, where / f"{bundle}.pkb")
    return where / f"{bundle}.pkb"


def example_manifest(where: Path, bundle: str, name: str = "gemm_bias_relu") -> Path:
    """A manifest `<where>/<bundle>.yaml` of a bundle `bundle` holding the shipped example kernel `name` alone."""
    from portkern.examples import MANIFEST
    from portkern.portable.manifest import load_manifest

    source = next(k.source for k in load_manifest(MANIFEST).kernels if k.name == name)
    manifest = where / f"{bundle}.yaml"
    manifest.write_text(f"bundle: {bundle}\nkernels:\n  - name: {name}\n    source: {source}\n")
    return manifest


def prebuilt_example(where: Path, bundle: str, targets=(), name: str = "gemm_bias_relu") -> Path:
    """The shipped example kernel `name` alone in a bundle `<where>/<bundle>.pkb`, built by
    `portkern build` with native code for each of `targets` (device specs; `--prebuild`)."""
    from portkern.cli.main import main

    out = where / f"{bundle}.pkb"
    prebuild = ["--prebuild", ",".join(targets)] if targets else []
    assert main(["build", str(example_manifest(where, bundle, name)), "-o", str(out), *prebuild, "--json"]) == 0
    return out


#: A script, `python -c RUN_EXAMPLES BUNDLE NAME...`: loads each shipped example kernel NAME
#: from BUNDLE, runs it on seeded inputs and prints one line of JSON: each kernel's origin
#: ("origins"), whether every result matched its NumPy reference ("ok"), the warnings raised
#: ("warnings") and the workers the process's worker pool started ("workers_started").
RUN_EXAMPLES = textwrap.dedent(
    """
    import json, logging, sys, warnings
    import numpy as np
    import portkern
    from portkern.examples.reference import EXAMPLES
    report = {"origins": {}, "ok": True}
    logged = []  # portkern's logged warnings count with the warnings
    keep = logging.Handler(logging.WARNING)
    keep.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("portkern").addHandler(keep)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bundle = portkern.load(sys.argv[1])
        for name in sys.argv[2:]:
            kernel = bundle.kernel(name)
            example = EXAMPLES[name]
            inputs = example.inputs(np.random.default_rng(7))
            out = kernel(*inputs)
            report["ok"] &= bool(np.allclose(out, example.reference(*inputs)[0], rtol=example.rtol, atol=example.atol))
            report["origins"][name] = kernel.origin
    report["warnings"] = [str(w.message) for w in caught] + logged
    from portkern.jit.workers import shared_pool
    report["workers_started"] = shared_pool().spawned
    print(json.dumps(report))
    """
)


def spawn(script: str, *argv, cache_dir: Path) -> subprocess.Popen:
    """`python -c SCRIPT ARGV...` started with the default cache at `cache_dir` (output piped)."""
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(cache_dir)}
    return subprocess.Popen([sys.executable, "-c", script, *map(str, argv)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_past_a_pipe(pipe: Path, argv: list[str], what: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The file at `pipe` replaced by a named pipe (whose opening waits for a writer), then `argv`
    run in a fresh process (output captured); the test fails where that process is still waiting
    after 120 s (it waited on the pipe: `what`) or exits with another status than 0."""
    pipe.unlink()
    os.mkfifo(pipe)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} waited on a named pipe at {pipe.name}")
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def last_json(proc: subprocess.Popen | subprocess.CompletedProcess) -> dict:
    """The JSON a process printed on its last line, once it has exited with status 0."""
    if isinstance(proc, subprocess.Popen):
        out, err = proc.communicate(timeout=600)
    else:
        out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def opencl_toolchain_missing() -> str:
    """Why OpenCL C cannot be built here ("" when it can)."""
    from portkern.portable.opencl import APT_HINT, missing_tools

    missing = missing_tools("opencl")
    return f"needs {', '.join(missing)} ({APT_HINT})" if missing else ""


def opencl_device_missing() -> str:
    """Why no OpenCL device can run kernels here ("" when one can)."""
    from portkern.jit import opencl

    probe = opencl.probe()
    return "" if probe.devices else f"needs an OpenCL device: {probe.reason}"


def build_mlir(where: Path, name: str = "k", **sources: str) -> Path:
    """A bundle `<where>/<name>.pkb` of MLIR kernels, one per keyword (kernel name=source text)."""
    from portkern.portable.builder import build_file

    lines = [f"bundle: {name}", "kernels:"]
    for kernel, text in sources.items():
        (where / f"{kernel}.mlir").write_text(text)
        lines += [f"  - name: {kernel}", f"    source: {kernel}.mlir"]
    (where / f"{name}.yaml").write_text("\n".join(lines) + "\n")
    build_file(where / f"{name}.yaml", where / f"{name}.pkb")
    return where / f"{name}.pkb"


#: Two small static kernels (`build_mlir(where, name, **ADD_AND_SCALE)`) for tests of policy, not of code.
ADD_AND_SCALE = {
    "add": """
func.func @add(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %r = arith.addf %a, %b : tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
""",
    "scale": """
func.func @scale(%x: tensor<16xf32>) -> tensor<16xf32> {
  %two = arith.constant dense<2.0> : tensor<16xf32>
  %r = arith.mulf %x, %two : tensor<16xf32>
  return %r : tensor<16xf32>
}
""",
}


def reseal(path: Path, out: Path, version: str, sources: dict[str, bytes] | None = None) -> Path:
    """`path` with every stage's producer set to IREE `version` (a bundle of another release,
    as far as the loader can tell), and the named kernels' source stage bytes replaced by
    `sources[name]`, sealed again as a valid bundle (with the same parameters)."""
    import dataclasses

    from portkern.portable.bundle import Bundle, read_bundle, sha256, write_bundle
    from portkern.portable.parameters import ParameterData, file_pieces

    bundle = read_bundle(path)
    blobs = dict(bundle.blobs)
    kernels = []
    section = bundle.parameters
    parameters = tuple(
        ParameterData(record.name, p.scope, p.name, p.size, file_pieces(path, section.offset + p.offset, p.size))
        for record in bundle.kernels for p in record.parameters
    )
    for record in bundle.kernels:
        stages = []
        for stage in record.stages:
            stage = dataclasses.replace(stage, producer=dataclasses.replace(stage.producer, version=version))
            if stage.is_source and record.name in (sources or {}):
                data = sources[record.name]
                blobs.pop(stage.blob, None)
                stage = dataclasses.replace(stage, blob=sha256(data), size=len(data))
                blobs[stage.blob] = data
            stages.append(stage)
        kernels.append(dataclasses.replace(record, stages=tuple(stages), parameters=()))
    write_bundle(Bundle(bundle.name, tuple(kernels), blobs, parameter_data=parameters), out)
    return out


def dense_onnx(opset: int = 17) -> bytes:
    """A tiny ONNX model of `opset`, relu(x @ W + b) with x 4x16, W 16x16 (a parameter once built), b 16;
    seeded values."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    weight = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [weight, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def attention_mlir(batch: int, length: int, dim: int) -> str:
    """An MLIR kernel `@attention(q, k, v)` of IREE's attention op (scale 0.125), all BxLxD f32."""
    t = f"tensor<{batch}x{length}x{dim}xf32>"
    return f"""
func.func @attention(%q: {t}, %k: {t}, %v: {t}) -> {t} {{
  %scale = arith.constant 0.125 : f32
  %empty = tensor.empty() : {t}
  %r = iree_linalg_ext.attention <{{indexing_maps = [affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d3)>,
      affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d3)>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2)>,
      affine_map<(d0, d1, d2, d3, d4) -> ()>, affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2)>]}}>
      ins(%q, %k, %v, %scale : {t}, {t}, {t}, f32)
      outs(%empty : {t}) {{
    ^bb0(%score: f32):
      iree_linalg_ext.yield %score : f32
  }} -> {t}
  return %r : {t}
}}
"""


def logged(caplog, pattern: str) -> list[str]:
    """The messages of portkern's log records (warnings and above) that `pattern` matches (`re.search`)."""
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("portkern") and r.levelno >= logging.WARNING]
    return [m for m in messages if re.search(pattern, m)]


@contextmanager
def logged_messages() -> Iterator[list[str]]:
    """The messages portkern logs (warnings and above) while the block runs, as they come."""
    messages: list[str] = []
    keep = logging.Handler(logging.WARNING)
    keep.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("portkern")
    logger.addHandler(keep)
    try:
        yield messages
    finally:
        logger.removeHandler(keep)
