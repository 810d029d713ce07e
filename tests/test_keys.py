"""Problem and probe keys, formed in `cache.keys` only, stay what earlier releases stored under
(a changed key would miss every tuning record and probe already in a cache)."""

from __future__ import annotations

import hashlib

from portkern.cache import keys


def test_problem_keys_are_the_ones_already_stored():
    description = "linalg.matmul* 64x32x16 f32"
    assert keys.dispatch_problem(description, "local-task", 8) == "driver=local-task threads=8 | linalg.matmul* 64x32x16 f32"
    digest = keys.kernel_digest("mlir", "main", "ab" * 32)
    assert keys.selection_problem(digest) == f"kernel:{digest}"
    assert keys.index_problem(keys.selection_problem(digest)) == f"kernel:{digest} buckets"


def test_opencl_problem_key_covers_the_launch_and_the_stages():
    launch = {"global": ["N"], "local": [64], "params": {"TILE": [8, 16]}}
    built = hashlib.sha256(b'[{"global": ["N"], "local": [64], "params": {"TILE": [8, 16]}}, ["s1", "s2"]]').hexdigest()
    expected = f"opencl:{keys.kernel_digest('opencl', 'vadd', built)} points=2 at "
    assert keys.opencl_problem("opencl", "vadd", launch, ["s1", "s2"], 2, "N=1024") == expected + "N=1024"
    assert keys.opencl_problem("opencl", "vadd", launch, ("s1", "s2"), 2, "") == expected + "static shapes"
    assert keys.opencl_problem("opencl", "vadd", launch, ["s1", "s3"], 2, "") != expected + "static shapes"


def test_probe_key_is_the_digest_of_its_parts_and_the_compiler():
    assert keys.probe_key(("cpu", "host"), "3.13.0", "abc") == hashlib.sha256(b"cpu|host|3.13.0|abc").hexdigest()
    assert keys.probe_key(("cpu", "host"), "3.13.0", "abc") != keys.probe_key(("cpu", "host"), "3.14.0", "abc")
