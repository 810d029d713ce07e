"""The start-up and finalisation benches in their short (CI) mode.

Whole fresh processes whose results match NumPy (checked by the processes themselves against
float64 NumPy at 1e-4), served as the bench says (baseline code on a fresh device, cached code
when warm), and finalisation from the bundle against compiling from source. Each bench also
guards against a regression: the ratio it measures (portkern against a compile from source,
both measured side by side in the same run, medians) must not be worse than twice the figure
README's headline table states for it (the first bold number of the row;
docs/benchmarks.md#the-ci-guard). No absolute time is judged.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import expected_skip

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
#: How much worse than README's figure a measured ratio may be before CI fails.
GUARD_FACTOR = 2.0


def run_bench(script: str) -> dict:
    done = subprocess.run([sys.executable, str(BENCH / script), "--short", "--json"], capture_output=True, text=True, timeout=1500, cwd=BENCH)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout[done.stdout.index("{"):])


def readme_figure(row: str) -> float:
    """The ratio README's headline table states in the row whose first cell starts with `row`:
    the first bold number of its figure cell."""
    for line in (ROOT / "README.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 3 and cells[0].startswith(row):
            found = re.search(r"\*\*(\d+(?:\.\d+)?)\*\*", cells[1])
            assert found, f"README's {row!r} row states no ratio in bold for the CI guard: {cells[1]!r}"
            return float(found.group(1))
    raise AssertionError(f"README's headline table has no {row!r} row")


def check_ratio(measured: float, row: str, what: str) -> None:
    stated = readme_figure(row)
    assert measured <= GUARD_FACTOR * stated, (
        f"{what}: {measured:.3f}, worse than {GUARD_FACTOR:g}x the {stated:g} README states ({row!r} row): a regression, "
        "or README's figure is out of date (re-measure with the row's command on a quiet machine)"
    )


def test_readme_states_every_guarded_ratio():
    for row in ("warm start from the cache", "finalise from the bundle", "cold start from a prebuilt baseline"):
        assert 0 < readme_figure(row) < 1, row  # portkern's side against a compile from source


def test_warm_start_bench_short():
    report = run_bench("warm_start.py")
    assert report["ok"] is True
    rows = report["rows"]
    assert rows["portkern, warm"]["origins"] == ["cache"] and rows["portkern, warm"]["ok"] is True
    assert rows["IREE from source"]["origins"] == ["source"] and rows["IREE from source"]["ok"] is True
    assert rows["portkern, warm"]["processes"] == rows["IREE from source"]["processes"] == report["processes"] >= 3
    assert rows["portkern, warm"]["further_s"] is not None  # the further kernels were asked for
    for row in rows.values():  # every part is a measured, non-negative time inside the whole
        assert all(row[f"{part}_s"] >= 0 for part in ("python", "numpy", "import", "load", "kernel", "call", "exit"))
        assert row["whole_s"] >= row["kernel_s"] + row["call_s"]
    assert set(report["figures"]) == {"first_kernel_ms", "further_kernel_ms", "whole_over_source", "cpu_over_source", *PART_FIGURES}
    check_part_at_goal(report["figures"], rows["IREE from source"])
    check_ratio(report["figures"]["whole_over_source"], "warm start from the cache", "warm process / source process (wall)")


#: What both whole-process benches add: portkern's own part, the rest of its process, and what the
#: own part could take for the whole process to be the goal's ratio of the source process.
PART_FIGURES = {"portkern_part_ms", "rest_of_process_ms", "part_at_goal_ms"}


def check_part_at_goal(figures: dict, source: dict) -> None:
    """The own part and the rest are measured times, and the part at the goal is the goal's share of
    the source process less the rest."""
    assert 0 < figures["portkern_part_ms"] and 0 < figures["rest_of_process_ms"]
    assert figures["part_at_goal_ms"] == pytest.approx(0.25 * source["whole_s"] * 1e3 - figures["rest_of_process_ms"], abs=1e-6)


def test_finalize_bench_short():
    report = run_bench("finalize_vs_source.py")
    assert report["ok"] is True
    assert {row["kernel"] for row in report["kernels"]} == {"gemm_bias_relu", "gemm_glu", "gemm_rowsum", "gemm_transpose_add", "mlp"}
    for row in report["kernels"]:  # both sides built code, from the same MLIR with the same flags
        assert row["sizes"]["source"] > 0 and row["sizes"]["bundle"] > 0
        assert row["ratio"] == pytest.approx(row["bundle_s"] / row["source_s"])
    assert report["amdgpu"] is None  # short: the CPU rows only
    check_ratio(report["median_ratio"], "finalise from the bundle", "finalise from the bundle / compile from source (median)")


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason=expected_skip("cpu", "x86-64 ISA levels"))
def test_cold_start_bench_short():
    report = run_bench("cold_start.py")
    whole = report["whole_processes"]
    assert whole["ok"] is True
    fresh, source = whole["rows"]["portkern, fresh device"], whole["rows"]["IREE from source"]
    assert fresh["origins"] == ["baseline"] and fresh["ok"] is True
    assert source["origins"] == ["source"] and source["ok"] is True
    assert fresh["processes"] == source["processes"] == whole["processes"] >= 3
    assert report["kernels"] == [] and report["prebuild"] == []  # short: whole processes only
    assert set(whole["figures"]) == {"whole_over_source", "cpu_over_source", *PART_FIGURES}
    check_part_at_goal(whole["figures"], whole["rows"]["IREE from source"])
    check_ratio(whole["figures"]["whole_over_source"], "cold start from a prebuilt baseline", "fresh-device process / source process (wall)")
