"""Smoke test of an installed portkern: build, load, finalise, run one kernel, `portkern inspect`.

CI runs the whole suite on one Python and this file on every other supported Python and
once with the lowest dependency versions (`./dev.sh compat`); it needs only the `test`
extra (no ONNX, OpenCL or GPU packages).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

import portkern
from portkern.examples import MANIFEST
from portkern.examples.reference import EXAMPLES
from portkern.portable.builder import build_file


def test_build_load_finalise_run_and_inspect(tmp_path, store):
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(f"bundle: smoke\nkernels:\n  - name: gemm_bias_relu\n    source: {MANIFEST.parent / 'gemm_bias_relu.mlir'}\n")
    bundle = tmp_path / "smoke.pkb"
    build_file(manifest, bundle)

    kernel = portkern.load(bundle, store=store).kernel("gemm_bias_relu")
    assert kernel.origin == "finalized"
    example = EXAMPLES["gemm_bias_relu"]
    inputs = example.inputs(np.random.default_rng(0))
    (want,) = example.reference(*inputs)
    np.testing.assert_allclose(kernel(*inputs), want, rtol=example.rtol, atol=example.atol)
    assert portkern.load(bundle, store=store).kernel("gemm_bias_relu").origin == "cache"

    done = subprocess.run([sys.executable, "-m", "portkern", "inspect", str(bundle), "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert [k["name"] for k in json.loads(done.stdout)["kernels"]] == ["gemm_bias_relu"]
