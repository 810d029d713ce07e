"""Signed cache exports: native code is imported only from a file a trusted key signed; tuning
results import either way; `--allow-unsigned` takes unsigned code and says so."""

from __future__ import annotations

import hashlib
import shutil

import pytest

pytest.importorskip("model_signing", reason="signatures need the 'fleet' extra (model-signing)")

from helpers import assert_example, cli_json  # noqa: E402

import portkern  # noqa: E402
from portkern.base import (
    framing,  # noqa: E402
    signing,  # noqa: E402
)
from portkern.cache.config import CacheConfig  # noqa: E402
from portkern.cache.store import Store  # noqa: E402
from portkern.cache.transfer import FORMAT  # noqa: E402
from portkern.cli.main import main  # noqa: E402
from portkern.jit import devices  # noqa: E402
from portkern.jit.loader import compiler_id, selection_problem  # noqa: E402


@pytest.fixture
def exported(examples_bundle, tmp_path, keys):
    """An export of gemm_bias_relu and gemm_transpose_add for this CPU plus one tuning result,
    signed by `trusted`; returns the file."""
    store = Store(CacheConfig(tmp_path / "farm" / "v1", 1 << 30, False))
    bundle = portkern.load(examples_bundle, store=store)
    record, target = bundle.record("gemm_bias_relu"), devices.resolve("cpu", store)
    bundle.kernel("gemm_bias_relu")
    bundle.kernel("gemm_transpose_add")
    store.put_tuning(selection_problem(record, target), target.fingerprint, compiler_id(record),
                     {"kind": "kernel", "config": "default", "strategy": "quick"})
    path = tmp_path / "fleet.pkcx"
    assert main(["cache", "export", str(path), "--cache-dir", str(tmp_path / "farm"), "--sign", str(keys / "trusted.key")]) == 0
    assert signing.signature_path(path).exists()
    return path


def import_json(capsys, path, cache_dir, *extra) -> tuple[int, dict]:
    return cli_json(capsys, "cache", "import", path, "--cache-dir", cache_dir, *extra)


def swap_native_code(path) -> None:
    """Put gemm_transpose_add's code in gemm_bias_relu's entry, sizes and digests recomputed."""
    _, _, document = framing.unpack(FORMAT, path.read_bytes())
    entries = {e["kernel"]: e for e in document["meta"]["entries"]}
    victim, other = entries["gemm_bias_relu"], entries["gemm_transpose_add"]
    code = document["blobs"][other["sha256"]]
    del document["blobs"][victim["sha256"]]
    victim["sha256"], victim["size"] = hashlib.sha256(code).hexdigest(), len(code)
    document["meta"]["entries"] = [victim]
    framing.write_atomic(path, framing.pack(FORMAT, document), OSError)


def test_a_signed_export_from_a_trusted_key_imports_and_runs(exported, examples_bundle, keys, tmp_path, capsys, monkeypatch, rng):
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted.pub"))
    status, report = import_json(capsys, exported, tmp_path / "device")
    assert status == 0 and report["entries"] == 2 and report["records"] == 1 and report["rejected"] == []
    assert report["signature"]["trusted"] and not report["unsigned_allowed"]
    kernel = portkern.load(examples_bundle, store=Store(CacheConfig(tmp_path / "device" / "v1", 1 << 30, False))).kernel("gemm_bias_relu")
    assert kernel.origin == "cache"
    assert_example(kernel, rng, "gemm_bias_relu")


@pytest.mark.parametrize("signer, reason", [(None, "not signed"), ("stranger", "untrusted key"), ("farm-before-swap", "does not verify")])
def test_an_export_with_swapped_native_code_is_refused(exported, keys, tmp_path, capsys, monkeypatch, signer, reason):
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted.pub"))
    signature = signing.signature_path(exported)
    kept = signature.read_bytes()
    swap_native_code(exported)
    signature.unlink()
    if signer == "stranger":
        signing.sign_file(exported, keys / "stranger.key")
    elif signer == "farm-before-swap":
        signature.write_bytes(kept)
    status, report = import_json(capsys, exported, tmp_path / "device")
    assert status == 1 and report["entries"] == 0
    (why,) = report["rejected"]
    assert why.startswith("gemm_bias_relu on ") and "native code refused" in why and reason in why
    assert report["records"] == 1  # the tuning result is a suggestion: it imports, its code is built here
    assert Store(CacheConfig(tmp_path / "device" / "v1", 1 << 30, False)).entries() == []


def test_allow_unsigned_imports_and_says_so(exported, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PORTKERN_TRUSTED_KEYS", raising=False)
    signing.signature_path(exported).unlink()
    status, report = import_json(capsys, exported, tmp_path / "device", "--allow-unsigned")
    assert status == 0 and report["entries"] == 2 and report["unsigned_allowed"]
    assert main(["cache", "import", str(exported), "--cache-dir", str(tmp_path / "again"), "--allow-unsigned"]) == 0
    assert "WITHOUT a trusted signature" in capsys.readouterr().out


def test_signing_key_from_the_environment_and_stale_signatures(exported, keys, tmp_path, capsys, monkeypatch):
    copy = tmp_path / "copy.pkcx"
    shutil.copy(exported, copy)
    shutil.copy(signing.signature_path(exported), signing.signature_path(copy))
    monkeypatch.delenv("PORTKERN_SIGNING_KEY", raising=False)
    assert main(["cache", "export", str(copy), "--cache-dir", str(tmp_path / "farm")]) == 0
    assert not signing.signature_path(copy).exists()  # the old signature would not match the new file
    assert main(["cache", "export", str(copy), "--cache-dir", str(tmp_path / "farm"), "--sign"]) == 1
    assert "needs PORTKERN_SIGNING_KEY" in capsys.readouterr().err
    monkeypatch.setenv("PORTKERN_SIGNING_KEY", str(keys / "trusted.key"))
    status, report = cli_json(capsys, "cache", "export", copy, "--cache-dir", tmp_path / "farm")
    assert status == 0 and report["signed"] == str(signing.signature_path(copy))


def test_finalize_export_is_signed_and_imports_where_the_signer_is_trusted(examples_bundle, keys, tmp_path, capsys, monkeypatch):
    path = tmp_path / "farm.pkcx"
    status, report = cli_json(capsys, "finalize", examples_bundle, "--target", "cpu:haswell", "--kernel", "gemm_rowsum", "--export", path,
                              "--sign", keys / "trusted.key", "--cache-dir", tmp_path / "farm")
    assert status == 0 and report["exported"]["signed"] == str(signing.signature_path(path))
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted-keys.pem"))
    status, report = import_json(capsys, path, tmp_path / "device")
    assert status == 0 and report["entries"] == 1 and report["signature"]["key_label"] == "build farm"


def test_an_unsigned_export_says_how_it_will_be_received(exported, tmp_path, capsys, monkeypatch, keys):
    monkeypatch.delenv("PORTKERN_SIGNING_KEY", raising=False)
    path = tmp_path / "unsigned.pkcx"
    assert main(["cache", "export", str(path), "--cache-dir", str(tmp_path / "farm")]) == 0
    shown = capsys.readouterr().out
    assert "note: not signed" in shown and "refuses its 2 native-code entries unless given --allow-unsigned" in shown
    status, report = cli_json(capsys, "cache", "export", path, "--cache-dir", tmp_path / "farm")
    assert status == 0
    assert report["signed"] is False and report["entries"] == 2 and "--allow-unsigned" in report["note"]
    assert not signing.signature_path(path).exists()
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted.pub"))
    status, imported = import_json(capsys, path, tmp_path / "device")  # received as the note says
    assert status == 1 and imported["entries"] == 0 and len(imported["rejected"]) == 2 and imported["records"] == 1


def test_an_export_signed_with_the_configured_key_imports_under_require(exported, examples_bundle, keys, tmp_path, capsys, monkeypatch, rng):
    monkeypatch.setenv("PORTKERN_SIGNING_KEY", str(keys / "trusted.key"))
    path = tmp_path / "signed.pkcx"
    status, report = cli_json(capsys, "cache", "export", path, "--cache-dir", tmp_path / "farm")
    assert status == 0
    assert report["signed"] == str(signing.signature_path(path)) and report["note"] is None
    monkeypatch.delenv("PORTKERN_SIGNING_KEY")
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted-keys.pem"))
    monkeypatch.setenv("PORTKERN_REQUIRE_SIGNATURE", "1")
    status, imported = import_json(capsys, path, tmp_path / "device")
    assert status == 0 and imported["entries"] == 2 and imported["rejected"] == [] and imported["signature"]["key_label"] == "build farm"
    monkeypatch.delenv("PORTKERN_REQUIRE_SIGNATURE")  # the examples bundle itself is not signed
    kernel = portkern.load(examples_bundle, store=Store(CacheConfig(tmp_path / "device" / "v1", 1 << 30, False))).kernel("gemm_bias_relu")
    assert kernel.origin == "cache"
    assert_example(kernel, rng, "gemm_bias_relu")
