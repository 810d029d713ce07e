"""Deploy-time CLI: `build --prebuild` and `finalize` keep going past a failing target;
`cache export/import --device` take every spelling `finalize --target` takes."""

from __future__ import annotations

import pytest
from helpers import cli_json, example_manifest, opencl_device_missing

from portkern.cli.main import main
from portkern.portable.bundle import read_bundle


@pytest.fixture
def manifest(tmp_path):
    return example_manifest(tmp_path, "deploy")


@pytest.fixture
def opencl_device():
    if opencl_device_missing():
        pytest.skip(opencl_device_missing())


def test_prebuild_with_a_failing_target_still_writes_the_bundle(manifest, tmp_path, capsys, opencl_device):
    """An OpenCL device cannot take an MLIR kernel's prebuilt code: reported, exit 1, the
    CPU slice is still in the written bundle."""
    out = tmp_path / "b.pkb"
    status, report = cli_json(capsys, "build", str(manifest), "-o", str(out), "--prebuild", "cpu,opencl")
    assert status == 1
    (failure,) = report["prebuild_failures"]
    assert failure["kernel"] == "gemm_bias_relu" and failure["target"].startswith("opencl:") and "IREE" in failure["error"]
    (record,) = read_bundle(out).kernels
    assert [n.target.split(":")[0] for n in record.native] == ["cpu"]
    status, _ = cli_json(capsys, "build", str(manifest), "-o", str(tmp_path / "c.pkb"), "--prebuild", "cpu")
    assert status == 0


def test_finalize_keeps_going_and_exports_what_succeeded(examples_bundle, tmp_path, capsys, opencl_device):
    export = tmp_path / "fleet.pkc"
    cache = str(tmp_path / "cache")
    status, report = cli_json(
        capsys, "finalize", str(examples_bundle), "--target", "opencl,cpu", "--kernel", "mlp", "--export", str(export), "--cache-dir", cache
    )
    assert status == 1
    assert [(r["target"].split(":")[0], r["ok"]) for r in report["entries"]] == [("opencl", False), ("cpu", True)]
    assert report["exported"]["entries"] == 1 and export.exists()


@pytest.fixture(scope="module")
def fleet_export(examples_bundle, tmp_path_factory):
    """An export holding mlp for gfx942 and for this CPU."""
    where = tmp_path_factory.mktemp("fleet")
    status = main(["finalize", str(examples_bundle), "--target", "gfx942,cpu", "--kernel", "mlp",
                   "--export", str(where / "fleet.pkc"), "--cache-dir", str(where / "cache"), "--json"])
    assert status == 0
    return where


@pytest.mark.parametrize("spelling", ["gfx942", "amdgpu:gfx942", "hip:gfx942", "rocm:gfx942"])
def test_export_and_import_take_every_target_spelling(fleet_export, tmp_path, capsys, spelling):
    cache = str(fleet_export / "cache")
    status, exported = cli_json(capsys, "cache", "export", str(tmp_path / "one.pkc"), "--device", spelling, "--cache-dir", cache)
    assert status == 0 and exported["entries"] == 1
    status, imported = cli_json(capsys, "cache", "import", str(fleet_export / "fleet.pkc"), "--allow-unsigned", "--device", spelling, "--cache-dir", str(tmp_path / "c"))
    assert status == 0 and imported["entries"] == 1
    status, listed = cli_json(capsys, "cache", "ls", "--cache-dir", str(tmp_path / "c"))
    assert [e["device_label"] for e in listed] == ["amdgpu:gfx942"]


def test_device_cpu_means_this_host(fleet_export, capsys):
    status, listed = cli_json(capsys, "cache", "ls", "--device", "cpu", "--cache-dir", str(fleet_export / "cache"))
    assert status == 0 and [e["kernel"] for e in listed] == ["mlp"] and listed[0]["device_label"].startswith("cpu:")


@pytest.mark.parametrize("action", [["export", "x.pkc"], ["import", "fleet.pkc"], ["ls"]])
@pytest.mark.parametrize("spelling", ["nonsense", "amdgpu:gfx0"])
def test_unknown_device_spellings_are_refused(fleet_export, capsys, action, spelling):
    argv = ["cache", action[0], *[str(fleet_export / a) for a in action[1:]], "--device", spelling, "--cache-dir", str(fleet_export / "cache")]
    status = main(argv)
    err = capsys.readouterr().err
    assert status != 0 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (fleet_export / "x.pkc").exists()
