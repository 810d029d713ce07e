"""Problem and probe keys, formed in `cache.keys` only, stay what earlier releases stored under
(a changed key would miss every tuning record and probe already in a cache). Changed on purpose:
an OpenCL kernel's selection is keyed by its launch description and stages too (`space:`), so
bundles of one `.cl` source with other parameter spaces keep their own records; selections an
earlier release stored for OpenCL kernels are not found (they are tuned again)."""

from __future__ import annotations

import dataclasses
import hashlib

from portkern.base.signing import Verified
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


def test_an_opencl_selection_is_keyed_by_its_launch_description_and_stages():
    launch = {"global": ["N"], "local": [64], "params": {"TILE": [8, 16]}}
    space = keys.opencl_space(launch, ["s1", "s2"])
    assert space == hashlib.sha256(b'[{"global": ["N"], "local": [64], "params": {"TILE": [8, 16]}}, ["s1", "s2"]]').hexdigest()
    digest = keys.kernel_digest("opencl", "vadd", "ab" * 32)
    assert keys.selection_problem(digest, space) == f"kernel:{digest} space:{space}"
    assert keys.selection_problem(digest, keys.opencl_space({**launch, "params": {"TILE": [8]}}, ["s1"])) != (
        keys.selection_problem(digest, space))
    assert keys.selection_problem(digest) == f"kernel:{digest}"  # kernels without a launch description: as stored


def test_a_remembered_signature_check_is_keyed_by_every_part_of_it():
    check = Verified(content="c" * 64, name="a-key", signature="s" * 64, key="k" * 64, trusted="t" * 64)
    others = [dataclasses.replace(check, **{field.name: "x"}) for field in dataclasses.fields(check)]
    assert len({keys.signature_key(c) for c in (check, *others)}) == 1 + len(others)
