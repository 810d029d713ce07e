"""Parameter spaces of OpenCL kernels: manifest `tune:` sections, valid points, expressions over
parameters, and the points' records in a bundle. None of these tests needs the toolchain or a device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from portkern.base.errors import LaunchSpecError, ManifestError
from portkern.jit.args import bind_launch
from portkern.portable.launch import MAX_POINTS, Launch, from_manifest, point_config
from portkern.portable.manifest import load_manifest
from portkern.tuner import kernel_config, registry
from portkern.tuner.opencl_family import OpenclConfig

GEMM = {
    "args": [
        {"name": "A", "dtype": "float32", "role": "in", "shape": ["M", "K"]},
        {"name": "B", "dtype": "float32", "role": "in", "shape": ["K", "N"]},
        {"name": "C", "dtype": "float32", "role": "out", "shape": ["M", "N"]},
        {"name": "K", "dtype": "int32", "value": "K"},
    ],
    "global": ["N // TX", "M // TY"],
    "local": ["BX", "BY"],
    "requires": ["K % 16 == 0"],
    "tune": {
        "params": {"BX": [8, 16, 32], "BY": [8, 16], "TX": [1, 2, 4], "TY": [1, 3]},
        "restrict": ["BX * TX <= 64", "BX * BY <= 256"],
        "at": {"M": 96, "N": 128, "K": 64},
    },
}


def space(**changes) -> tuple[Launch, tuple]:
    return from_manifest({**GEMM, **changes}, "opencl", Path(__file__))


def test_points_obey_restrictions_and_whole_work_groups_at_the_tuning_shapes():
    launch, sources = space()
    points = [dict(v.params) for v in launch.variants]
    assert launch.tunable and launch.params == ("BX", "BY", "TX", "TY") and len(sources) == len(points)
    expected = [
        {"BX": bx, "BY": by, "TX": tx, "TY": ty}
        for bx in (8, 16, 32) for by in (8, 16) for tx in (1, 2, 4) for ty in (1, 3)
        if bx * tx <= 64 and bx * by <= 256 and (128 // tx) % bx == 0 and (96 // ty) % by == 0
    ]  # fmt: skip
    assert points == expected and len(points) == 28  # of 36 combinations
    for variant, source in zip(launch.variants, sources):
        values = dict(variant.params)
        assert variant.local == (values["BX"], values["BY"])
        assert dict(source.defines) == {k: str(v) for k, v in values.items()}
    assert launch.tune_at == (("K", 64), ("M", 96), ("N", 128))
    assert launch.tuning_shapes() == [(96, 64), (64, 128)]


def test_default_point_is_the_defines_when_valid_else_the_first_valid_point():
    launch, sources = space(defines={"BX": 16, "BY": 8, "TX": 2, "TY": 3, "EXTRA": 1})
    assert dict(launch.variants[0].params) == {"BX": 16, "BY": 8, "TX": 2, "TY": 3}
    assert ("EXTRA", "1") in sources[0].defines and dict(sources[0].defines)["TX"] == "2"
    assert len({v.params for v in launch.variants}) == 28
    invalid, _ = space(defines={"BX": 32, "BY": 16, "TX": 4, "TY": 1})  # breaks BX * TX <= 64
    assert invalid.variants[0].params == (("BX", 8), ("BY", 8), ("TX", 1), ("TY", 1))


def test_parameters_are_symbols_of_the_global_size_and_scalar_values():
    options = {**GEMM, "args": [*GEMM["args"][:3], {"name": "K", "dtype": "int32", "value": "K // TX"}]}
    launch, _ = from_manifest(options, "opencl", Path(__file__))
    variant = launch.point(point_config((("BX", 16), ("BY", 8), ("TX", 2), ("TY", 3))))
    a, b = np.zeros((96, 64), np.float32), np.zeros((64, 128), np.float32)
    bound = bind_launch("gemm", launch, variant.local, [a, b], variant.params)
    assert bound.global_size == (64, 32) and int(bound.scalars["K"]) == 32 and bound.shapes["C"] == (96, 128)


def test_points_travel_through_the_bundle_record():
    launch, _ = space()
    again = Launch.from_dict(launch.to_dict())
    assert again == launch and again.point("default") == launch.variants[0]
    with pytest.raises(LaunchSpecError, match="names no point"):
        again.point(point_config((("BX", 7), ("BY", 8), ("TX", 1), ("TY", 1))))
    tampered = launch.to_dict()
    tampered["variants"][1]["params"] = tampered["variants"][0]["params"]
    with pytest.raises(LaunchSpecError, match="no point may repeat"):
        Launch.from_dict(tampered)
    huge = {**launch.to_dict(), "tune_at": {"K": 1 << 20, "M": 1 << 20, "N": 1 << 20}}
    with pytest.raises(LaunchSpecError, match="bytes; at most"):
        Launch.from_dict(huge)
    with pytest.raises(LaunchSpecError, match="must give every shape symbol"):
        Launch.from_dict({k: v for k, v in launch.to_dict().items() if k != "tune_at"})


def test_point_configs_are_the_tuner_family_configs():
    launch, _ = space()
    for variant in launch.variants:
        parsed = kernel_config.parse(variant.config)
        config = parsed.get(0)
        assert isinstance(config, OpenclConfig) and config.params == variant.params and str(parsed) == variant.config
    assert registry.parse("opencl:v1:BX=16,BY=8").rank == 2


@pytest.mark.parametrize(
    "change, where, message",
    [
        ({"restrict": ["BX * Q <= 64"]}, "tune.restrict[0]", "uses Q, which no parameter of `tune: params:` names"),
        ({"params": {"BX": [8, 8]}}, "tune.params.BX", "distinct integers"),
        ({"params": {"BX": [8], "BY": [8], "TX": [1], "TY": [1], "M": [8]}}, "tune.params.M", "also a shape symbol"),
        ({"params": {"BX": [8], "round_up": [1]}}, "tune.params.round_up", "not a parameter name"),
        ({"at": {"M": 96}}, "tune.at", "every shape symbol (K, M, N)"),
        ({"at": {"M": 65536, "N": 65536, "K": 64}}, "tune.at", "bytes; at most 1073741824"),
        ({"restrict": ["BX > 1000"]}, "tune.restrict", "no point of the parameter space is valid"),
        ({"params": {f"P{i}": list(range(9)) for i in range(6)}}, "tune.params", "combinations"),
        ({"params": {"BX": [8], "BY": [8], "TX": [1], "TY": [1], "P": list(range(20)), "Q": list(range(20))}}, "tune.params", f"at most {MAX_POINTS} are built"),
    ],
)
def test_bad_spaces_are_refused_with_their_manifest_line(tmp_path, change, where, message):
    import yaml

    kernel = {"name": "gemm", "source": "k.cl", **GEMM, "tune": {**GEMM["tune"], **change}}
    (tmp_path / "k.cl").write_text("__kernel void gemm() {}\n")
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"bundle": "b", "kernels": [kernel]}, sort_keys=False))
    with pytest.raises(ManifestError) as caught:
        load_manifest(tmp_path / "m.yaml")
    text = str(caught.value)
    assert f"kernels[0].{where}" in text and message in text
    assert text.startswith(f"{tmp_path / 'm.yaml'}:") and text.split(":")[1].isdigit()


def test_spaces_need_opencl_c_and_no_subgroup_variants():
    with pytest.raises(LaunchSpecError, match="only OpenCL C sources have a parameter space"):
        from_manifest(GEMM, "spirv", Path(__file__))
    with pytest.raises(LaunchSpecError, match="cannot also have sub-group `variants:`"):
        space(variants=[{"subgroup_size": 32}])
