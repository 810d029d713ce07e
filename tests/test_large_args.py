"""Large arguments on the CPU: what a call costs in memory beyond its arguments and results.

IREE's generated code assumes 64-byte aligned buffers, so an argument that is not is copied
once (`jit/vmcall.py`); an aligned one is used in place; one that is not C-contiguous is copied
once, to aligned memory, and used in place. Each case runs in its own process, whose peak
resident set (`ru_maxrss`) is read before and after one call of an add of two 256 MiB float32
arrays; the result (256 MiB) is part of every call's cost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import build_mlir
from test_call_path import ADD_DYNAMIC

MIB = 1 << 20
#: Each argument's size.
SIZE = 256 * MIB
#: What a call may take beyond the copies it makes and its result: runtime bookkeeping, page
#: tables, allocator rounding (far less than one argument, so one extra copy would break the bound).
SLACK = 64 * MIB

CHILD = r"""
import json, resource, sys
import numpy as np
import portkern

mode, size, bundle = sys.argv[1], int(sys.argv[2]), sys.argv[3]
n = size // 4
kernel = portkern.load(bundle).kernel("add")
small = np.ones(1024, np.float32)
kernel(small, small)

def argument(fill):
    if mode == "strided":  # every other element of a twice as large array: not C-contiguous
        array = np.empty(2 * n, np.float32)[::2]
    else:
        raw = np.empty(n + 64, np.float32)
        start = (-raw.ctypes.data % 64) // 4 + (1 if mode == "unaligned" else 0)  # 4 bytes past a boundary
        array = raw[start : start + n]
    array[...] = fill
    array[::4099] = np.arange(array[::4099].size, dtype=np.float32)  # values that differ along the array
    return array

a, b = argument(1.5), argument(2.25)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
result = kernel(a, b)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"alignment": a.ctypes.data % 64, "contiguous": bool(a.flags.c_contiguous),
                  "matches": bool(np.array_equal(result, a + b)), "peak_growth": after - before}))
"""


@pytest.fixture(scope="module")
def add_bundle(tmp_path_factory):
    return build_mlir(tmp_path_factory.mktemp("large"), "large", add=ADD_DYNAMIC)


def call_in_child(bundle, mode: str, cache_dir) -> dict:
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(SIZE), str(bundle)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("mode", "copies"), [("aligned", 0), ("unaligned", 2), ("strided", 2)])
def test_a_large_argument_costs_at_most_one_copy_of_itself(add_bundle, tmp_path, mode, copies):
    """Aligned: used in place (the call grows the peak by its result alone). Unaligned (a view
    4 bytes past a 64-byte boundary): one copy of each argument. Not C-contiguous: one copy of
    each (before, one to make it contiguous and one more into IREE's memory)."""
    found = call_in_child(add_bundle, mode, tmp_path / "cache")
    assert found["matches"], found
    assert (found["alignment"] == 4) == (mode == "unaligned") and found["contiguous"] == (mode != "strided"), found
    assert found["peak_growth"] <= SIZE + copies * SIZE + SLACK, (mode, found["peak_growth"] / MIB)
