"""GPU family stages: lowered once on the build host for a placeholder arch that no real GPU has."""

from __future__ import annotations

import re

import pytest

from portkern.base.errors import CompileError
from portkern.examples import MANIFEST
from portkern.portable.builder import build_file
from portkern.portable.bundle import read_bundle
from portkern.portable.compiler import Compiler, bytecode
from portkern.portable.family import FAMILIES, FAMILY_PHASE, has_encodings, lower_family_stage, target_sites

#: Anything that names a real GPU arch.
REAL_ARCH = re.compile(r"gfx[0-9]|sm_[0-9]|MFMA|WMMA|NV_MMA")


def test_bundle_records_a_stage_per_family(gpu_bundle):
    record = read_bundle(gpu_bundle).kernel("gemm_bias_relu")
    stages = {s.family: s for s in record.stages if not s.is_source}
    assert set(stages) == {"any", "amdgpu", "cuda"} and record.source_stage() is not None
    assert stages["any"].phase == "flow" and stages["any"].placeholder is None
    for name in ("amdgpu", "cuda"):
        assert stages[name].phase == FAMILY_PHASE == "executable-sources"
        assert stages[name].placeholder == FAMILIES[name].placeholder
    assert record.stage("amdgpu") is stages["amdgpu"] and record.stage("opencl") is stages["any"]


@pytest.mark.parametrize("name", ["amdgpu", "cuda"])
def test_family_stage_names_only_the_placeholder(gpu_bundle, name):
    bundle = read_bundle(gpu_bundle)
    stage = bundle.kernel("gemm_bias_relu").stage(name)
    data = bundle.blob(stage.blob)
    assert not REAL_ARCH.search(data.decode("latin-1"))
    module = Compiler().parse(data)
    sites = target_sites(module)
    assert {n for _, n in sites} == {"target", "initial_value"}  # the variant and the device global
    assert all(f'portkern.placeholder = "{FAMILIES[name].placeholder}"' in str(op.attributes[n]) for op, n in sites)
    assert f'"{FAMILIES[name].format}"' in str(module)


def test_placeholder_stage_cannot_be_compiled_as_it_is(gpu_bundle):
    bundle = read_bundle(gpu_bundle)
    stage = bundle.kernel("gemm_bias_relu").stage("amdgpu")
    compiler = Compiler()
    with pytest.raises(CompileError, match="missing GPU target"):
        compiler.to_vmfb(compiler.parse(bundle.blob(stage.blob)), from_phase=stage.phase)


def test_gpu_bundle_build_is_deterministic(gpu_bundle, tmp_path):
    again = tmp_path / "again.pkb"
    build_file(gpu_bundle.parent / "manifest.yaml", again)
    assert again.read_bytes() == gpu_bundle.read_bytes()


def test_data_tiled_module_keeps_only_the_flow_stage():
    """Encodings are resolved per arch on the way to executable-sources: no portable family stage exists."""
    source = (MANIFEST.parent / "gemm_bias_relu.mlir").read_bytes()
    tiled = Compiler(("--iree-opt-data-tiling",))
    flow = bytecode(tiled.lower(tiled.parse(source), from_phase="start", to_phase="flow"))
    assert has_encodings(flow)
    assert lower_family_stage(Compiler(), flow, FAMILIES["amdgpu"], "k") is None
    plain = Compiler()
    assert not has_encodings(bytecode(plain.lower(plain.parse(source), from_phase="start", to_phase="flow")))


def test_inspect_shows_family_stages(gpu_bundle, capsys):
    import json

    from portkern.cli.main import main

    assert main(["inspect", str(gpu_bundle), "--json"]) == 0
    (kernel,) = json.loads(capsys.readouterr().out)["kernels"]
    assert [(s["family"], s["phase"], s.get("placeholder")) for s in kernel["stages"]] == [
        ("any", "flow", None),
        ("amdgpu", "executable-sources", "portkern-placeholder-amdgpu"),
        ("cuda", "executable-sources", "portkern-placeholder-cuda"),
        ("any", "start", None),  # the source stage, for other IREE releases
    ]
