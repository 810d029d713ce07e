"""What a calling process imports: neither IREE's compiler nor a JSON-schema library, warm or
on a fresh device with baseline code (the compiler runs in workers only); warm, nothing that
only compiling, tuning, signing, repairing the cache, logging an event, removing files or IREE's Python-level
call glue needs, with parameters (weights) read from the bundle or not."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest
from helpers import expected_skip, prebuilt_example

CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import portkern
    from portkern.examples.reference import EXAMPLES
    from portkern.cache.store import default_store
    kernel_name = sys.argv[2]
    kernel = portkern.load(sys.argv[1]).kernel(kernel_name)
    origin = kernel.origin  # before the exact code built in the background may replace baseline code
    again = portkern.load(sys.argv[1]).kernel(kernel_name)
    example = EXAMPLES[kernel_name]
    inputs = example.inputs(np.random.default_rng(0))
    result = kernel(*inputs)
    # What only compiling, signing, tuning, repairing the cache, counting a compile or refusal, logging an
    # event, removing files or IREE's Python-level call glue needs (taken before the reference, which imports its own).
    unneeded = sorted(name for name in sys.modules if name.split(".")[0] in ("model_signing", "logging", "platformdirs") or name == "iree.runtime"
                      or name in ("portkern.jit.workers", "portkern.jit.finalize", "portkern.tuner.session", "portkern.jit.background",
                                 "portkern.cache.remote", "portkern.base.signing", "portkern.cache.repair", "portkern.cache.metrics",
                                 "shutil", "tempfile"))
    error = float(np.max(np.abs(result - example.reference(*inputs))))
    probes = len(list(default_store().records("p")))
    kernel.wait()
    heavy = sorted(name for name in sys.modules if name.split(".")[0] in ("jsonschema", "fastjsonschema") or name.startswith("iree.compiler"))
    print(json.dumps({"origin": origin, "again": again.origin, "error": error, "heavy": heavy, "unneeded": unneeded, "probes": probes}))
    """
)


def run_child(bundle, cache, name: str = "gemm_bias_relu") -> dict:
    # (a home directory as most users have: the user config dir then needs no platformdirs)
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(cache), "HOME": str(cache.parent)}
    env.pop("XDG_CONFIG_HOME", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(bundle), name], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["gemm_bias_relu", "mlp"])  # mlp reads parameters (weights) from its bundle
def test_a_warm_process_imports_neither_the_compiler_nor_a_schema_library(tmp_path, capsys, name):
    bundle = prebuilt_example(tmp_path, "startup", name=name)
    capsys.readouterr()
    cold = run_child(bundle, tmp_path / "cache", name)
    assert cold["origin"] == "finalized" and cold["error"] < 1e-3
    warm = run_child(bundle, tmp_path / "cache", name)
    assert warm["origin"] == "cache" and warm["again"] == "cache" and warm["error"] < 1e-3
    assert warm["heavy"] == []
    assert warm["unneeded"] == []  # nor the worker pool, the tuner, model-signing, logging, platformdirs, shutil or iree.runtime's Python layer


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason=expected_skip("cpu", "x86-64 ISA levels"))
def test_a_fresh_device_serves_baseline_code_without_llvm_in_the_caller(tmp_path, capsys):
    """A new cache, a bundle with ISA-level code: served at once, with no CPU probe (no LLVM
    child process) and nothing of the compiler imported, not even while the exact code is built
    (in a worker)."""
    bundle = prebuilt_example(tmp_path, "startup", ["cpu:x86-64-v2"])
    capsys.readouterr()
    fresh = run_child(bundle, tmp_path / "cache")
    assert fresh["origin"] == "baseline" and fresh["error"] < 1e-3
    assert fresh["heavy"] == [] and fresh["probes"] == 0
