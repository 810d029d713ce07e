"""`portkern cache ...`: every command with --json and --cache-dir; export/import between machines."""

from __future__ import annotations

import tempfile

import pytest
from helpers import cli_json
from test_cache_store import flip_byte

import portkern
from portkern.base import framing
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.cache.transfer import FORMAT
from portkern.cli.main import main


def cache(capsys, directory, *argv) -> tuple[int, object]:
    return cli_json(capsys, "cache", *argv, "--cache-dir", directory)


@pytest.fixture
def filled(examples_bundle, tmp_path):
    """A cache holding gemm_glu for this CPU and for haswell, and mlp for this CPU."""
    store = Store(CacheConfig(tmp_path / "cache" / "v1", 1 << 30, False))
    bundle = portkern.load(examples_bundle, store=store)
    bundle.kernel("gemm_glu")
    bundle.kernel("gemm_glu", device="cpu:haswell")
    bundle.kernel("mlp")
    return tmp_path / "cache", store


def test_ls_show_stats(filled, capsys):
    directory, store = filled
    status, entries = cache(capsys, directory, "ls")
    assert status == 0 and sorted(e["kernel"] for e in entries) == ["gemm_glu", "gemm_glu", "mlp"]
    status, only = cache(capsys, directory, "ls", "--device", "cpu:haswell")
    assert [e["device_label"] for e in only] == ["cpu:haswell"]
    status, shown = cache(capsys, directory, "show", only[0]["key"][:10])
    assert status == 0 and shown["kernel"] == "gemm_glu" and shown["size"] > 0
    status, stats = cache(capsys, directory, "stats")
    assert stats["entries"] == 3 and set(stats["devices"]) >= {"cpu:haswell"} and stats["misses"] == 3
    assert main(["cache", "ls", "--cache-dir", str(directory)]) == 0
    assert "gemm_glu" in capsys.readouterr().out


def test_show_unknown_key_is_a_one_line_error(filled, capsys):
    directory, _ = filled
    assert main(["cache", "show", "ffffffff", "--cache-dir", str(directory)]) == 1
    assert capsys.readouterr().err.strip() == "portkern: error: no cache entry with key 'ffffffff'"


def test_verify_reports_and_evicts_corruption(filled, capsys, monkeypatch, tmp_path):
    directory, store = filled
    # verify also reports scratch directories of gone processes in the temp directory: a private
    # one keeps other processes' leftovers on this machine out of this test.
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    assert cache(capsys, directory, "verify") == (0, {"checked": 3, "found": []})
    victim = store.entries()[0]
    flip_byte(store, victim.key)
    status, report = cache(capsys, directory, "verify")
    assert status == 1 and [(f["name"], f["problem"]) for f in report["found"]] == [(victim.key, "artifact does not match its sha256")]
    assert cache(capsys, directory, "verify")[0] == 0


def test_prune_and_clear(filled, capsys):
    directory, store = filled
    assert main(["cache", "prune", "--cache-dir", str(directory)]) == 1
    capsys.readouterr()
    largest = max(e.size for e in store.entries())
    status, pruned = cache(capsys, directory, "prune", "--max-size", str(largest))
    assert status == 0 and len(pruned["evicted"]) == 2
    status, cleared = cache(capsys, directory, "clear")
    assert cleared["removed"] == 1 and store.entries() == []


def test_export_import_serves_only_the_matching_device(filled, examples_bundle, tmp_path, capsys):
    directory, store = filled
    status, exported = cache(capsys, directory, "export", str(tmp_path / "fleet.pkcx"))
    assert status == 0 and exported["entries"] == 3
    other = tmp_path / "other-machine"
    status, imported = cache(capsys, other, "import", str(tmp_path / "fleet.pkcx"), "--allow-unsigned")
    assert status == 0 and imported["entries"] == 3 and imported["rejected"] == []
    target = Store(CacheConfig(other / "v1", 1 << 30, False))
    bundle = portkern.load(examples_bundle, store=target)
    assert bundle.kernel("gemm_glu").origin == "cache"
    assert bundle.kernel("gemm_glu", device="cpu:haswell").origin == "cache"
    assert bundle.kernel("gemm_rowsum").origin == "finalized"
    status, again = cache(capsys, other, "import", str(tmp_path / "fleet.pkcx"), "--allow-unsigned")
    assert again["skipped"] == 3 and again["entries"] == 0


def test_export_one_device(filled, tmp_path, capsys):
    directory, _ = filled
    status, exported = cache(capsys, directory, "export", str(tmp_path / "h.pkcx"), "--device", "cpu:haswell")
    assert exported["entries"] == 1


def _tamper(path, change):
    _, _, document = framing.unpack(FORMAT, path.read_bytes())
    change(document)
    path.write_bytes(framing.pack(FORMAT, document))


def test_import_rejects_an_entry_claiming_another_device(filled, tmp_path, capsys):
    directory, _ = filled
    path = tmp_path / "evil.pkcx"
    cache(capsys, directory, "export", str(path), "--device", "cpu:haswell")

    def relabel(document):
        document["meta"]["entries"][0]["device"]["arch"] = "znver5-but-not-really"

    _tamper(path, relabel)
    status, report = cache(capsys, tmp_path / "victim", "import", str(path), "--allow-unsigned")
    assert status == 1 and report["entries"] == 0
    assert "device label does not match" in report["rejected"][0] or "key does not match" in report["rejected"][0]


def test_import_rejects_swapped_code(filled, tmp_path, capsys):
    directory, _ = filled
    path = tmp_path / "swap.pkcx"
    cache(capsys, directory, "export", str(path))

    def swap(document):
        first, second = document["meta"]["entries"][:2]
        first["sha256"], second["sha256"] = second["sha256"], first["sha256"]

    _tamper(path, swap)
    status, report = cache(capsys, tmp_path / "victim", "import", str(path), "--allow-unsigned")
    assert status == 1 and len(report["rejected"]) == 2 and report["entries"] == 1


@pytest.mark.parametrize(
    "data, message",
    [
        (b"hello", "not a portkern cache export"),
        (b"\x89PKX\r\n\x1a\n" + b"\x00" * 4, "truncated"),
    ],
)
def test_import_of_a_bad_file_is_one_line(tmp_path, capsys, data, message):
    path = tmp_path / "bad.pkcx"
    path.write_bytes(data)
    assert main(["cache", "import", str(path), "--cache-dir", str(tmp_path / "c")]) == 1
    assert message in capsys.readouterr().err


def test_import_refuses_schema_violations(tmp_path, capsys):
    path = tmp_path / "odd.pkcx"
    path.write_bytes(framing.pack(FORMAT, {"meta": {"format": "portkern-cache-export", "version": [1, 0], "entries": [{"key": "../x"}], "records": []}, "blobs": {}}))
    assert main(["cache", "import", str(path), "--cache-dir", str(tmp_path / "c")]) == 1
    assert "cache-export schema at entries/0" in capsys.readouterr().err


def _valid_meta() -> dict:
    from dataclasses import asdict

    from test_cache_scale import synthetic

    key, data, entry = synthetic(1)
    entry.size, entry.sha256, entry.kernel_digest = len(data), "0" * 64, "1" * 64
    return {"format": "portkern-cache-export", "version": [1, 0], "entries": [asdict(entry)], "records": []}


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m["entries"][0].update(key="../../x"),
        lambda m: m["entries"][0].update(size=-1),
        lambda m: m["entries"][0].update(size="12"),
        lambda m: m["entries"][0].update(unexpected=1),
        lambda m: m["entries"][0].pop("sha256"),
        lambda m: m["entries"][0]["device"].update(kind="../x"),
        lambda m: m["entries"][0].update(config="x" * 5000),
        lambda m: m["entries"][0].update(format="elf"),
        lambda m: m.update(records=[{"kind": "p", "key": "0" * 64, "record": {}}]),
        lambda m: m.update(version=[1]),
    ],
)
def test_the_compiled_export_check_refuses_what_the_schema_refuses(change):
    from portkern.base.errors import CacheError
    from portkern.cache.transfer import check_meta
    from portkern.schemas import validator

    meta = _valid_meta()
    check_meta(meta)
    assert validator("cache-export").is_valid(meta)
    change(meta)
    assert not validator("cache-export").is_valid(meta)
    with pytest.raises(CacheError, match="does not match the cache-export schema at"):
        check_meta(meta)
