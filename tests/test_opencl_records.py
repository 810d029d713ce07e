"""OpenCL tuning records of bundles built from one `.cl` source with different parameter spaces
(or none) are kept apart: tuning one and loading another leaves the first's tuned winner in use."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from helpers import opencl_device_missing, opencl_toolchain_missing

import portkern
from portkern.cache import keys
from portkern.portable.builder import build_file
from portkern.portable.bundle import read_bundle

pytestmark = [
    pytest.mark.skipif(bool(opencl_toolchain_missing()), reason=opencl_toolchain_missing() or "-"),
    pytest.mark.skipif(bool(opencl_device_missing()), reason=opencl_device_missing() or "-"),
]

# y = 2x; each work-item stores its value REPS times (volatile: none is dropped), so REPS=1 is
# the fastest point and the default point (REPS=256) the slowest.
SOURCE = """
__kernel void scale(__global const float *x, __global float *y, const int n) {
  const int i = get_global_id(0);
  const float v = x[i] * 2.0f;
  volatile __global float *out = y + i;
  int r = 0;
  do { *out = v; } while (++r < REPS);
}
"""


def entry(space: dict | None) -> dict:
    spec = {
        "name": "scale",
        "source": "scale.cl",
        "args": [
            {"name": "x", "dtype": "float32", "role": "in", "shape": ["n"]},
            {"name": "y", "dtype": "float32", "role": "out", "shape": ["n"]},
            {"name": "n", "dtype": "int32", "value": "n"},
        ],
        "global": ["n"],
        "local": [16],
        "requires": ["n % 16 == 0"],
        "defines": {"REPS": 256},
    }
    if space is not None:
        spec["tune"] = {"params": space, "at": {"n": 16384}}
    return spec


def bundle(where, space: dict | None):
    where.mkdir()
    (where / "scale.cl").write_text(SOURCE)
    (where / "m.yaml").write_text(yaml.safe_dump({"bundle": "scale", "kernels": [entry(space)]}, sort_keys=False))
    build_file(where / "m.yaml", where / "scale.pkb")
    return where / "scale.pkb"


def test_bundles_of_one_source_keep_their_own_tuning_records(tmp_path, store):
    tuned_path = bundle(tmp_path / "tuned", {"REPS": [256, 1]})
    plain_path = bundle(tmp_path / "plain", None)
    other_path = bundle(tmp_path / "other", {"REPS": [256, 2]})
    records = [read_bundle(p).kernels[0] for p in (tuned_path, plain_path, other_path)]
    # the premise: one kernel as far as its default stage goes, three launch descriptions
    digests = {keys.kernel_digest(r.kind, r.entry, r.stages[r.launch["variants"][0]["stages"][0]].blob) for r in records}
    assert len(digests) == 1
    assert len({keys.opencl_space(r.launch, [s.blob for s in r.stages]) for r in records}) == 3

    x = np.random.default_rng(5).uniform(-1, 1, 16384).astype(np.float32)
    tuned = portkern.load(tuned_path, store=store).kernel("scale", device="opencl", tune="full")
    assert tuned.tuning.source == "search" and "REPS=1" in tuned.config
    np.testing.assert_allclose(tuned(x), 2 * x, rtol=1e-6)

    for path in (plain_path, other_path):
        kernel = portkern.load(path, store=store).kernel("scale", device="opencl")
        assert kernel.config == "default"  # the other bundle's winner is not its record
        np.testing.assert_allclose(kernel(x), 2 * x, rtol=1e-6)

    again = portkern.load(tuned_path, store=store).kernel("scale", device="opencl")
    assert again.config == tuned.config and again.origin == "cache"
    np.testing.assert_allclose(again(x), 2 * x, rtol=1e-6)
