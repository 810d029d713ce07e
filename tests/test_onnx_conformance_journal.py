"""The conformance bench's journal (`bench/onnx_conformance.py --journal`): what a re-run skips, what
it runs again, and the report it makes from the journal. No compiles: the journal is written here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnx", reason="the conformance cases come from the onnx package (portkern[onnx])")

BENCH = Path(__file__).resolve().parents[1] / "bench" / "onnx_conformance.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("onnx_conformance_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cases(bench):
    wanted = {"test_abs", "test_relu"}
    return [c for c in bench.conf.node_cases() if c.name in wanted]


def entry(bench, keys, name, side, kind, commit="c1"):
    extra = {"commit": commit} if side == "portkern" else {"versions": keys.iree}
    return {"name": name, "side": side, "key": keys.of(side, name), "kind": kind, "detail": "", "s": 0.1, **extra}


def test_rerun_skips_what_the_journal_holds_for_the_same_code(bench, cases, tmp_path):
    keys = bench.keys_for(cases)
    path = tmp_path / "journal.jsonl"
    journal = bench.Journal(path)
    journal.add(entry(bench, keys, "test_abs", "portkern", "correct"))
    journal.add(entry(bench, keys, "test_abs", "iree", "correct"))
    journal.add(entry(bench, keys, "test_relu", "iree", "wrong"))
    with path.open("a") as f:
        f.write('{"name": "test_relu", "side": "portk')  # a line cut short by a killed run
    again = bench.Journal(path)
    assert len(again.entries) == 3
    tasks = bench.plan(["test_abs", "test_relu"], again, keys)
    assert [(t.name, t.sides) for t in tasks] == [("test_relu", ["portkern"])]
    # other portkern code: its side runs again, IREE's never does for the same case and versions
    changed = bench.Keys("other-code", "c2", keys.iree, keys.cases)
    tasks = bench.plan(["test_abs", "test_relu"], again, changed)
    assert [(t.name, t.sides) for t in tasks] == [("test_abs", ["portkern"]), ("test_relu", ["portkern"])]
    # forced (--only-from-journal): portkern again even for the same code
    assert [t.sides for t in bench.plan(["test_abs"], again, keys, frozenset({"test_abs"}))] == [["portkern"]]


def test_report_comes_from_the_journal_and_names_commits(bench, cases, tmp_path):
    keys = bench.keys_for(cases)
    journal = bench.Journal(tmp_path / "journal.jsonl")
    journal.add(entry(bench, keys, "test_abs", "portkern", "wrong", commit="old"))
    journal.add(entry(bench, keys, "test_abs", "iree", "correct"))
    old = bench.rows_of(cases, journal, keys)
    assert bench.summary(old)["counts"]["portkern"]["wrong"] == 1
    assert bench.summary(old)["not_run"] == {"portkern": 1, "iree": 1}
    newer = bench.Keys("fixed-code", "new", keys.iree, keys.cases)
    journal.add(entry(bench, newer, "test_abs", "portkern", "correct", commit="new"))
    journal.add(entry(bench, newer, "test_relu", "portkern", "refused at build", commit="new"))
    result = bench.summary(bench.rows_of(cases, journal, newer))
    assert result["counts"]["portkern"]["wrong"] == 0 and result["counts"]["portkern"]["correct"] == 1
    assert result["portkern_commits"] == {"new": 2}
    assert [r["name"] for r in result["differ"]] == []  # test_relu has no IREE result yet
    written = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert [w["kind"] for w in written] == ["wrong", "correct", "correct", "refused at build"]


def test_case_digest_changes_with_the_case(bench, cases):
    abs_case, relu_case = sorted(cases, key=lambda c: c.name)
    assert bench.case_digest(abs_case) == bench.case_digest(abs_case)
    assert bench.case_digest(abs_case) != bench.case_digest(relu_case)
    import dataclasses

    looser = dataclasses.replace(abs_case, rtol=abs_case.rtol * 10)
    assert bench.case_digest(looser) != bench.case_digest(abs_case)


def test_shards_split_the_cases(bench, cases):
    halves = [bench.shard(cases, f"{k}/2") for k in (1, 2)]
    assert sorted(c.name for half in halves for c in half) == sorted(c.name for c in cases)
    with pytest.raises(SystemExit):
        bench.shard(cases, "3/2")
