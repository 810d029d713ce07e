"""Signature checks that passed are remembered per device (`portkern.cache.verified`): a later
process loading the same signed bundle does not import model-signing and serves the same
results, while other bytes, another signature or a changed trusted key set are verified again."""

from __future__ import annotations

import base64
import json
import shutil

import numpy as np
import pytest

pytest.importorskip("model_signing", reason="signatures need the 'fleet' extra (model-signing)")

from helpers import build_mlir, last_json, one_kernel_bundle, spawn  # noqa: E402

import portkern  # noqa: E402
from portkern.base import signing  # noqa: E402
from portkern.base.errors import UntrustedKeyError  # noqa: E402
from portkern.cache.verified import RECORD_KIND  # noqa: E402

SCALE = """
func.func @scale(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %r = arith.addf %x, %x : tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
"""

ZERO = """
func.func @scale(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %r = arith.subf %x, %x : tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
"""

# Loads a bundle, runs its kernel ARGV[2] on 0..N-1 shaped ARGV[3:] and says whether model-signing was imported.
CHILD = """
import json, sys
import numpy as np
import portkern
shape = tuple(int(d) for d in sys.argv[3:])
kernel = portkern.load(sys.argv[1]).kernel(sys.argv[2])
y = kernel(np.arange(np.prod(shape), dtype=np.float32).reshape(shape))
print(json.dumps({"model_signing": "model_signing" in sys.modules, "origin": kernel.origin, "y": y.ravel().tolist()}))
"""

EXPECTED = (2 * np.arange(32, dtype=np.float32)).tolist()


@pytest.fixture
def signed(keys, tmp_path):
    """A one-kernel bundle (y = 2x) signed by `trusted`."""
    path = build_mlir(tmp_path, "scale", scale=SCALE)
    signing.sign_file(path, keys / "trusted.key")
    return path


def run(bundle, cache_dir, monkeypatch, trusted) -> dict:
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(trusted))
    monkeypatch.setenv("PORTKERN_REQUIRE_SIGNATURE", "1")
    return last_json(spawn(CHILD, bundle, "scale", 4, 8, cache_dir=cache_dir))


def test_a_second_process_serves_a_signed_bundle_without_model_signing(signed, keys, tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    first = run(signed, cache_dir, monkeypatch, keys / "trusted.pub")
    assert first["model_signing"] and first["y"] == EXPECTED
    second = run(signed, cache_dir, monkeypatch, keys / "trusted.pub")
    assert not second["model_signing"], "a check that passed here before imported model-signing again"
    assert second["origin"] == "cache" and second["y"] == EXPECTED

    # another trusted key set (the signer's key still in it) is verified again, then remembered
    changed = run(signed, cache_dir, monkeypatch, keys / "trusted-keys.pem")
    assert changed["model_signing"] and changed["y"] == EXPECTED
    assert not run(signed, cache_dir, monkeypatch, keys / "trusted-keys.pem")["model_signing"]


def test_importing_portkern_and_loading_without_trusted_keys_does_not_import_model_signing(signed, tmp_path, monkeypatch):
    monkeypatch.delenv("PORTKERN_TRUSTED_KEYS", raising=False)
    monkeypatch.delenv("PORTKERN_REQUIRE_SIGNATURE", raising=False)
    shown = last_json(spawn(CHILD, signed, "scale", 4, 8, cache_dir=tmp_path / "cache"))
    assert not shown["model_signing"] and shown["y"] == EXPECTED


def test_a_remembered_check_does_not_admit_other_bytes_or_another_signature(signed, keys, store, tmp_path, monkeypatch):
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted-keys.pem"))
    monkeypatch.setenv("PORTKERN_REQUIRE_SIGNATURE", "1")
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    assert portkern.load(signed, store=store).kernel("scale")(x).ravel().tolist() == EXPECTED
    remembered = [record for _, record in store.records(RECORD_KIND)]
    assert len(remembered) == 1 and remembered[0]["key"] == signing.read_trusted_keys(keys / "trusted.pub")[0].fingerprint

    # other bytes beside the remembered signature: y = x - x under the name of y = 2x
    (tmp_path / "forged").mkdir()
    forged = build_mlir(tmp_path / "forged", "scale", scale=ZERO)
    shutil.copy(signing.signature_path(signed), signing.signature_path(forged))
    with pytest.raises(UntrustedKeyError, match="does not verify"):
        portkern.load(forged, store=store)

    # the remembered bytes beside a signature whose signature bytes were changed
    tampered = tmp_path / "tampered.pkb"
    shutil.copy(signed, tampered)
    document = json.loads(signing.signature_path(signed).read_bytes())
    raw = bytearray(base64.b64decode(document["dsseEnvelope"]["signatures"][0]["sig"]))
    raw[-1] ^= 1
    document["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(raw)).decode()
    signing.signature_path(tampered).write_text(json.dumps(document))
    with pytest.raises(UntrustedKeyError, match="does not verify"):
        portkern.load(tampered, store=store)

    # a key no longer trusted is refused whatever was remembered under it
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "other.pub"))
    with pytest.raises(UntrustedKeyError, match="untrusted key"):
        portkern.load(signed, store=store)
    assert len(list(store.records(RECORD_KIND))) == 1  # refusals remember nothing


def test_a_remembered_value_check_is_bound_to_its_name_bytes_and_signature(keys, store):
    from portkern.cache.verified import VerifiedSignatures

    memo = VerifiedSignatures(store)
    trusted = signing.read_trusted_keys(keys / "trusted-keys.pem")
    sig = signing.sign_value("abc123", b"native code", keys / "trusted.key")
    assert signing.verify_value("abc123", b"native code", sig, trusted, memo).trusted
    assert signing.verify_value("abc123", b"native code", sig, trusted, memo).trusted  # remembered
    assert "does not verify" in signing.verify_value("abc124", b"native code", sig, trusted, memo).reason
    assert "does not verify" in signing.verify_value("abc123", b"native codE", sig, trusted, memo).reason
    other = signing.sign_value("abc123", b"other code", keys / "trusted.key")
    assert "does not verify" in signing.verify_value("abc123", b"native code", other, trusted, memo).reason
    assert len(list(store.records(RECORD_KIND))) == 1


def test_a_bundle_with_a_parameter_section_is_remembered_and_a_changed_weight_refused(keys, store, tmp_path, monkeypatch):
    pytest.importorskip("onnx", reason="ONNX models need the 'onnx' package")
    from portkern.examples.large_mlp import reference, write_mlp

    widths = (64, 256, 64)
    write_mlp(tmp_path / "m.onnx", widths, 8, seed=3)
    path = one_kernel_bundle(tmp_path, "m.onnx", "mlp", bundle="mlp")
    signing.sign_file(path, keys / "trusted.key")
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted.pub"))
    monkeypatch.setenv("PORTKERN_REQUIRE_SIGNATURE", "1")
    expected = reference(np.arange(8 * 64, dtype=np.float32).reshape(8, 64), widths, 3).ravel()
    runs = [last_json(spawn(CHILD, path, "mlp", 8, 64, cache_dir=tmp_path / "cache")) for _ in range(2)]
    assert [r["model_signing"] for r in runs] == [True, False]
    for r in runs:
        np.testing.assert_allclose(r["y"], expected, rtol=1e-4, atol=1e-4)

    assert portkern.load(path, store=store).bundle.parameters is not None  # checked whole, then remembered
    with open(path, "r+b") as f:  # one weight's byte in the parameter section, the signature kept
        f.seek(-64, 2)
        byte = f.read(1)
        f.seek(-64, 2)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(UntrustedKeyError, match="does not verify"):
        portkern.load(path, store=store)
