"""`portkern tune --report`: one static page with a plot per section, the run's data beside it."""

from __future__ import annotations

import base64
import json
import os
from html.parser import HTMLParser

import pytest
from helpers import assert_example, cli_json, example_manifest

import portkern
from portkern.cli.main import main
from portkern.portable.builder import build_file
from portkern.tuner.report import SECTIONS


class _Page(HTMLParser):
    """The images of each section of a page, and its embedded data."""

    def __init__(self) -> None:
        super().__init__()
        self.images: dict[str, list[str]] = {}
        self.section: str | None = None
        self.in_data = False
        self.data = ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.section = attrs["id"]
            self.images[self.section] = []
        elif tag == "img" and self.section is not None:
            self.images[self.section].append(attrs["src"])
        elif tag == "script" and attrs.get("type") == "application/json":
            self.in_data = True

    def handle_endtag(self, tag):
        if tag == "section":
            self.section = None
        elif tag == "script":
            self.in_data = False

    def handle_data(self, data):
        if self.in_data:
            self.data += data


def test_report_has_a_plot_per_section_and_lists_the_runs_candidates(tmp_path, store, capsys, rng):
    bundle_path = tmp_path / "gemm.pkb"
    build_file(example_manifest(tmp_path, "gemm", "gemm_bias_relu"), bundle_path)
    page = tmp_path / "out" / "tune.html"
    status, run = cli_json(
        capsys, "tune", bundle_path, "--strategy", "quick", "--budget", "1", "--retune", "--workers", "2",
        "--report", page, "--cache-dir", store.config.directory,
    )
    assert status == 0, run
    assert run["report"] == {"html": str(page), "json": str(page.with_suffix(".json"))}

    parser = _Page()
    parser.feed(page.read_text())
    assert list(parser.images) == [key for key, _, _ in SECTIONS]
    for images in parser.images.values():
        assert len(images) == 1
        prefix = "data:image/svg+xml;base64,"
        assert images[0].startswith(prefix) and b"<svg" in base64.b64decode(images[0][len(prefix):])

    beside = json.loads(page.with_suffix(".json").read_text())
    assert json.loads(parser.data) == beside
    (kernel,) = beside["kernels"]
    (searched,) = run["kernels"]
    assert kernel["evaluations"], "the run evaluated candidates"
    assert [e["config"] for e in kernel["evaluations"]] == [e["config"] for e in searched["evaluations"]]
    assert kernel["config"] == searched["config"]
    (profile,) = beside["profiles"]
    roles = ["default"] if kernel["config"] == "default" else ["default", "tuned"]
    assert [c["role"] for c in profile["configs"]] == roles
    assert [c["config"] for c in profile["configs"]] == list(dict.fromkeys(["default", kernel["config"]]))
    for config in profile["configs"]:
        assert config["whole_s"] > 0 and config["sum_s"] > 0
        assert sum(d["share"] for d in config["dispatches"] if d["share"] is not None) == pytest.approx(1.0)

    # the tuned kernel, as the loader serves it now, still computes the reference's numbers
    assert_example(portkern.load(bundle_path, store=store).kernel("gemm_bias_relu"), rng)
    # and `profile` reads the stored choice as the tuned config
    status, again = cli_json(capsys, "profile", bundle_path, "gemm_bias_relu", "--cache-dir", store.config.directory)
    assert status == 0 and [c["config"] for c in again["configs"]] == [c["config"] for c in profile["configs"]]


@pytest.mark.parametrize("argv, page", [(["--compile-only"], "r.html"), (["--shapes", "a=1x2"], "r.html"), ([], "r.json")])
def test_report_refused_before_any_work(tmp_path, capsys, argv, page):
    status = main(["tune", str(tmp_path / "missing.pkb"), *argv, "--report", str(tmp_path / page), "--json"])
    assert status == 1
    assert json.loads(capsys.readouterr().out)["error"] == "TuningError"
    assert not (tmp_path / page).exists()


def test_a_report_to_a_pipe_is_refused_before_any_work(tmp_path, capsys):
    """The page's data would go to a new file beside it (`--report /dev/null` made /dev/null.json)."""
    pipe = tmp_path / "page"
    os.mkfifo(pipe)
    status = main(["tune", str(tmp_path / "missing.pkb"), "--report", str(pipe), "--json"])
    assert status == 1
    error = json.loads(capsys.readouterr().out)
    assert error["error"] == "TuningError" and error["message"].endswith(f"{pipe}: not a regular file: the page is written to a file, its data beside it as .json")
    assert not pipe.with_suffix(".json").exists()
