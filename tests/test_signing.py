"""Signed bundles in the OpenSSF Model Signing format: keys, `build --sign`, `inspect`, and the
loader's one trust rule: with trusted keys, a signature that does not verify with one of them
refuses the bundle (prebuilt code or only code to compile here); under require, so does none."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("model_signing", reason="signatures need the 'fleet' extra (model-signing)")

from helpers import assert_example, assert_matches, build_mlir, cli_json  # noqa: E402

import portkern  # noqa: E402
from portkern.base import signing  # noqa: E402
from portkern.base.errors import KeyFileError, UnsignedError, UntrustedKeyError  # noqa: E402
from portkern.cli.main import main  # noqa: E402


@pytest.fixture(scope="module")
def signed_fat_bundle(gpu_bundle, keys, tmp_path_factory):
    """The GPU example manifest built with prebuilt native code for cpu:haswell, signed by `trusted`."""
    out = tmp_path_factory.mktemp("signed") / "fat.pkb"
    status = main(["build", str(gpu_bundle.parent / "manifest.yaml"), "-o", str(out), "--prebuild", "cpu:haswell",
                   "--sign", str(keys / "trusted.key"), "--json"])
    assert status == 0
    return out


def test_keys_new_writes_a_private_pkcs8_key_and_a_public_key(tmp_path, capsys):
    status, made = cli_json(capsys, "keys", "new", str(tmp_path / "k"))
    assert status == 0 and made["private_key"] == str(tmp_path / "k.key")
    private, public = tmp_path / "k.key", tmp_path / "k.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")  # PKCS8, unencrypted
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert made["fingerprint"] == signing.read_trusted_keys(public)[0].short

    before = private.read_bytes()
    assert main(["keys", "new", str(tmp_path / "k")]) == 1
    assert "exists; not overwriting" in capsys.readouterr().err
    assert private.read_bytes() == before


def test_a_signed_bundle_passes_the_standard_model_signing_cli(signed_fat_bundle, keys):
    sig = signing.signature_path(signed_fat_bundle)
    assert json.loads(sig.read_text())["dsseEnvelope"]["payloadType"] == "application/vnd.in-toto+json"
    verify = [sys.executable, "-m", "model_signing", "verify", "key", str(signed_fat_bundle),
              "--signature", str(sig), "--public_key"]
    good = subprocess.run([*verify, str(keys / "trusted.pub")], capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert subprocess.run([*verify, str(keys / "stranger.pub")], capture_output=True).returncode != 0


def test_inspect_shows_the_trusted_key_that_signed(signed_fat_bundle, keys, capsys, monkeypatch):
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted-keys.pem"))
    status, shown = cli_json(capsys, "inspect", str(signed_fat_bundle))
    trusted = signing.read_trusted_keys(keys / "trusted.pub")[0]
    assert status == 0 and shown["signature"] == {
        "signed": True, "trusted": True, "key": trusted.short, "key_label": "build farm", "reason": None}

    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "stranger.pub"))
    status, shown = cli_json(capsys, "inspect", str(signed_fat_bundle))
    assert shown["signature"]["signed"] and not shown["signature"]["trusted"]
    assert "untrusted key " + trusted.short in shown["signature"]["reason"]


def test_required_signature_admits_a_trusted_bundle_and_it_runs(signed_fat_bundle, keys, store, rng, monkeypatch):
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted-keys.pem"))
    monkeypatch.setenv("PORTKERN_REQUIRE_SIGNATURE", "1")
    kernel = portkern.load(signed_fat_bundle, store=store).kernel("gemm_bias_relu", device="cpu:haswell")
    assert kernel.origin == "prebuilt"
    assert_example(kernel, rng, "gemm_bias_relu")


def test_required_signature_refuses_unsigned_untrusted_and_mismatched_bundles(
    signed_fat_bundle, gpu_bundle, keys, store, tmp_path, monkeypatch
):
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted-keys.pem"))
    monkeypatch.setenv("PORTKERN_REQUIRE_SIGNATURE", "1")
    unsigned = tmp_path / "unsigned.pkb"
    shutil.copy(signed_fat_bundle, unsigned)
    with pytest.raises(UnsignedError, match="refused .* not signed"):
        portkern.load(unsigned, store=store)

    signing.sign_file(unsigned, keys / "stranger.key")
    with pytest.raises(UntrustedKeyError, match="untrusted key"):
        portkern.load(unsigned, store=store)

    # a trusted signature beside other bytes: the signature of the bundle without native code
    plain = tmp_path / "plain.pkb"
    shutil.copy(gpu_bundle, plain)
    signing.sign_file(plain, keys / "trusted.key")
    shutil.copy(signing.signature_path(plain), signing.signature_path(unsigned))
    with pytest.raises(UntrustedKeyError, match="does not verify"):
        portkern.load(unsigned, store=store)

    # under require, a bundle with no native code needs a signature too: its code would be built here
    with pytest.raises(UnsignedError, match="refused .* not signed"):
        portkern.load(gpu_bundle, store=store)


def test_a_signature_that_is_a_pipe_is_refused_not_waited_on(signed_fat_bundle, keys, store, tmp_path, monkeypatch, capsys):
    """FILE.sig comes with the bundle: whoever can write beside it can put a named pipe there,
    whose opening would wait for a writer."""
    bundle = tmp_path / "piped.pkb"
    shutil.copy(signed_fat_bundle, bundle)
    os.mkfifo(signing.signature_path(bundle))
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted-keys.pem"))
    assert main(["inspect", str(bundle), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["signature"]["reason"].endswith("piped.pkb.sig: cannot read signature: not a regular file")
    monkeypatch.setenv("PORTKERN_REQUIRE_SIGNATURE", "1")
    with pytest.raises(UntrustedKeyError, match="not a regular file"):
        portkern.load(bundle, store=store)


def test_required_signature_without_trusted_keys_is_an_error(gpu_bundle, store, monkeypatch):
    monkeypatch.delenv("PORTKERN_TRUSTED_KEYS", raising=False)
    monkeypatch.setenv("PORTKERN_REQUIRE_SIGNATURE", "1")
    with pytest.raises(KeyFileError, match="names no trusted key"):
        portkern.load(gpu_bundle, store=store)


def test_a_value_signature_binds_its_name_and_bytes(keys):
    trusted = signing.read_trusted_keys(keys / "trusted-keys.pem")
    sig = signing.sign_value("abc123", b"native code", keys / "trusted.key")
    assert signing.verify_value("abc123", b"native code", sig, trusted).key.label == "build farm"
    assert "does not verify" in signing.verify_value("abc124", b"native code", sig, trusted).reason
    assert "does not verify" in signing.verify_value("abc123", b"native codE", sig, trusted).reason
    assert "not an OMS signature" in signing.verify_value("abc123", b"native code", b"\x00garbage", trusted).reason
    assert not signing.verify_value("abc123", b"native code", sig, signing.read_trusted_keys(keys / "stranger.pub")).trusted


def test_bad_key_files_are_typed_errors(tmp_path):
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(KeyFileError, match="no PEM public key"):
        signing.read_trusted_keys(tmp_path / "junk.pem")
    with pytest.raises(KeyFileError, match="not an unencrypted PEM private key"):
        signing.check_signing_key(tmp_path / "junk.pem")
    with pytest.raises(KeyFileError, match="cannot read"):
        signing.check_signing_key(tmp_path / "missing.key")


def test_the_verifier_agrees_with_model_signing(keys, tmp_path):
    import model_signing

    original = b"native code " * 100
    path = tmp_path / "f.bin"
    path.write_bytes(original)
    signature = signing.signature_path(path)
    signing.sign_file(path, keys / "trusted.key")
    good = signature.read_bytes()
    document = json.loads(good)
    statement = json.loads(base64.b64decode(document["dsseEnvelope"]["payload"]))
    statement["predicate"]["resources"][0]["digest"] = hashlib.sha256(b"other").hexdigest()
    document["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    forged = json.dumps(document).encode()
    cases = [
        (original, good, "trusted.pub", True),
        (original + b"!", good, "trusted.pub", False),
        (original, good, "other.pub", False),
        (b"other", forged, "trusted.pub", False),
    ]
    for data, sig, public, expected in cases:
        path.write_bytes(data)
        signature.write_bytes(sig)
        try:
            model_signing.verifying.Config().use_elliptic_key_verifier(public_key=keys / public).verify(path, signature)
            theirs = True
        except Exception:  # noqa: BLE001 - model-signing raises ValueError and others
            theirs = False
        ours = signing.verify_value(None, data, sig, signing.read_trusted_keys(keys / public)).trusted
        assert ours == theirs == expected, (public, expected)


SOFTMAX = """
func.func @act(%x: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %empty = tensor.empty() : tensor<8x32xf32>
  %r = linalg.softmax dimension(1) ins(%x : tensor<8x32xf32>) outs(%empty : tensor<8x32xf32>) -> tensor<8x32xf32>
  return %r : tensor<8x32xf32>
}
"""

SIGMOID = """
func.func @act(%x: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %empty = tensor.empty() : tensor<8x32xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<8x32xf32>) outs(%empty : tensor<8x32xf32>) {
  ^bb0(%in: f32, %out: f32):
    %one = arith.constant 1.0 : f32
    %neg = arith.negf %in : f32
    %e = math.exp %neg : f32
    %d = arith.addf %one, %e : f32
    %s = arith.divf %one, %d : f32
    linalg.yield %s : f32
  } -> tensor<8x32xf32>
  return %r : tensor<8x32xf32>
}
"""


@pytest.fixture(scope="module")
def softmax_and_forgery(keys, tmp_path_factory):
    """A Softmax bundle signed by `trusted`, and a Sigmoid bundle of the same name beside the
    Softmax bundle's signature (changed after signing)."""
    signed = build_mlir(tmp_path_factory.mktemp("softmax"), "act", act=SOFTMAX)
    signing.sign_file(signed, keys / "trusted.key")
    forged = build_mlir(tmp_path_factory.mktemp("sigmoid"), "act", act=SIGMOID)
    shutil.copy(signing.signature_path(signed), signing.signature_path(forged))
    return signed, forged


@pytest.mark.parametrize("require", ["", "1"])
def test_a_bundle_changed_after_signing_is_refused_though_it_carries_no_native_code(
    softmax_and_forgery, keys, store, rng, capsys, monkeypatch, require
):
    signed, forged = softmax_and_forgery
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted-keys.pem"))
    monkeypatch.setenv("PORTKERN_REQUIRE_SIGNATURE", require)
    status, shown = cli_json(capsys, "inspect", str(forged))
    assert status == 0 and not shown["signature"]["trusted"] and "does not verify" in shown["signature"]["reason"]
    with pytest.raises(UntrustedKeyError, match="refused .*does not verify"):
        portkern.load(forged, store=store)
    status, failed = cli_json(capsys, "run", str(forged), "act")
    assert status == 1 and failed["error"] == "UntrustedKeyError"

    kernel = portkern.load(signed, store=store).kernel("act")
    x = rng.standard_normal((8, 32), dtype=np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    assert_matches(kernel(x), (e / e.sum(axis=1, keepdims=True),), 1e-5, 1e-6)


def test_trusted_keys_refuse_a_bundle_signed_by_another_key_and_require_refuses_an_unsigned_one(
    softmax_and_forgery, keys, store, rng, tmp_path, monkeypatch
):
    signed, _ = softmax_and_forgery
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted-keys.pem"))
    monkeypatch.delenv("PORTKERN_REQUIRE_SIGNATURE", raising=False)
    copy = tmp_path / "act.pkb"
    shutil.copy(signed, copy)
    kernel = portkern.load(copy, store=store).kernel("act")  # unsigned, not required: built here
    x = rng.standard_normal((8, 32), dtype=np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    assert_matches(kernel(x), (e / e.sum(axis=1, keepdims=True),), 1e-5, 1e-6)

    monkeypatch.setenv("PORTKERN_REQUIRE_SIGNATURE", "1")
    with pytest.raises(UnsignedError, match="not signed"):
        portkern.load(copy, store=store)
    monkeypatch.delenv("PORTKERN_REQUIRE_SIGNATURE")
    signing.sign_file(copy, keys / "stranger.key")
    with pytest.raises(UntrustedKeyError, match="untrusted key"):
        portkern.load(copy, store=store)
