"""Signatures in the OpenSSF Model Signing (OMS) format, with bring-your-own EC P-256 keys.

A signed file `F` has a detached signature `F.sig` beside it: a Sigstore bundle
whose DSSE envelope carries an in-toto statement over the file's sha256, written
and checked by the `model-signing` library (imported when a signature is made or checked),
so `model_signing verify key F --signature F.sig --public_key KEY.pub` accepts it as well.
Signed values that
are not files (remote cache entries) are signed as a one-file model whose file
is named after the value's key, so a signature binds both the key and the bytes.

The environment says what this machine trusts and signs with:

- `PORTKERN_TRUSTED_KEYS=FILE`: one or more public PEM keys in one file; a line of
  text just above a key (`# build farm`) names it;
- `PORTKERN_REQUIRE_SIGNATURE=1`: native code only from values signed by a trusted key;
- `PORTKERN_SIGNING_KEY=FILE`: the private key that signs what this machine publishes
  (only on publishers: a build farm);
- `PORTKERN_ROLE=publisher|reader`: whether this machine publishes native code to the fleet's
  remote tier; default `publisher` with a signing key, else `reader`.

One trust rule: with trusted keys configured, nothing whose signature does not verify, or
that a key not trusted here signed, is compiled or run (`check_bundle`, `check_value`);
with `PORTKERN_REQUIRE_SIGNATURE=1` nothing unsigned either, except that remote values
must be signed by a trusted key whenever trusted keys are configured.

A signature is checked with the trusted key its key hint names, by model-signing's
verifier, over the bytes the caller holds (written to a private scratch directory first,
so a file swapped on disk after reading cannot pass).

A caller may give a `Memo` (the device's local store, `cache.verified`): a check that passed
is remembered there as a `Verified` record (the content's sha256, the signature's sha256, the
name it was signed under, the trusted key that verified it and the whole trusted key set),
and the same check found there later passes without model-signing, which is then not even
imported. Anything else (other bytes, another signature, a changed trusted key set) is
verified again. Only a passed check is remembered, and only by this module.

Everything read here (signatures, key files) is untrusted input: sizes are
bounded and every failure is a `SignatureError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from portkern.base import settings
from portkern.base.errors import KeyFileError, SignatureError, UnsignedError, UntrustedKeyError, brief
from portkern.base.framing import open_regular, read_bounded
from portkern.base.records import frozen_record

#: Suffix of a detached signature file.
SIGNATURE_SUFFIX = ".sig"
#: A signature is a few KiB of JSON; anything much larger is refused unread.
MAX_SIGNATURE_BYTES = 1 << 20
MAX_KEY_FILE_BYTES = 1 << 20
TRUSTED_KEYS_ENV = settings.TRUSTED_KEYS
REQUIRE_ENV = settings.REQUIRE_SIGNATURE
SIGNING_KEY_ENV = settings.SIGNING_KEY
ROLE_ENV = settings.ROLE
#: Roles: a publisher (build farm) signs and publishes native code; a reader (device) only verifies.
PUBLISHER, READER = "publisher", "reader"

_PEM_BLOCK = re.compile(rb"-----BEGIN PUBLIC KEY-----.+?-----END PUBLIC KEY-----", re.S)


@frozen_record
class TrustedKey:
    """One public key this machine trusts."""

    #: sha256 of the key's SubjectPublicKeyInfo PEM (model-signing's key hint).
    fingerprint: str
    #: The text line above the key in the trusted-keys file, else "key N".
    label: str
    pem: bytes

    @property
    def short(self) -> str:
        return f"sha256:{self.fingerprint[:16]}"


@frozen_record
class Verdict:
    """Whether a value is signed, and by which trusted key if its signature verifies."""

    signed: bool
    key: TrustedKey | None = None
    reason: str | None = None

    @property
    def trusted(self) -> bool:
        return self.key is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "signed": self.signed,
            "trusted": self.trusted,
            "key": self.key.short if self.key else None,
            "key_label": self.key.label if self.key else None,
            "reason": self.reason,
        }

    def describe(self) -> str:
        if self.key is not None:
            return f"signed by trusted key {self.key.label} ({self.key.short})"
        return self.reason or "not signed"


@frozen_record
class Verified:
    """What one passed signature check covers: a memo's record of it."""

    #: sha256 of the signed bytes.
    content: str
    #: The file name the bytes were signed as (a value's key), "" for a lone file.
    name: str
    #: sha256 of the signature's bytes.
    signature: str
    #: Fingerprint of the trusted key that verified it.
    key: str
    #: sha256 over the fingerprints of every trusted key at the time (a changed set checks again).
    trusted: str


class Memo(Protocol):
    """Where passed checks are remembered (a device's local store: `cache.verified`)."""

    def verified(self, check: Verified) -> bool:
        """Whether exactly this check passed here before."""
        ...

    def remember(self, check: Verified) -> None:
        """Remember a check that passed (called only after model-signing's verifier passed it)."""
        ...


@frozen_record
class Policy:
    """What this machine trusts, requires and signs with (`from_env()` reads it)."""

    trusted: tuple[TrustedKey, ...] = ()
    required: bool = False
    signing_key: Path | None = None
    role: str = READER

    @property
    def publishes(self) -> bool:
        """Whether this machine publishes native code to the remote tier."""
        return self.role == PUBLISHER

    def check_bundle(self, path: str | Path, data: bytes | None, memo: Memo | None = None) -> Verdict | None:
        """The verdict on a bundle file (`data`: its bytes as read, None to hash the file), or
        the typed error that refuses it: a signature that does not verify with a trusted key,
        when trusted keys are configured; no signature, under `require`. None: nothing to check
        (no trusted keys). `memo`: where passed checks are remembered."""
        if not self.trusted:
            return None
        verdict = verify_file(path, data, self.trusted, memo)
        if verdict.signed or self.required:
            why = f"{REQUIRE_ENV}=1" if not verdict.signed else f"its signature must verify with a key in {TRUSTED_KEYS_ENV}"
            require_trusted(verdict, f"{path}: refused ({why})")
        return verdict

    def check_value(self, name: str, data: bytes, signature: bytes | None, what: str, memo: Memo | None = None) -> TrustedKey | None:
        """The trusted key that signed a remote value, or the typed error that refuses it: with
        trusted keys configured (or under `require`) a value must be signed by one of them.
        `memo`: where passed checks are remembered."""
        if not self.trusted and not self.required:
            return None
        verdict = verify_value(name, data, signature, self.trusted, memo) if signature is not None else Verdict(False, reason="not signed")
        return require_trusted(verdict, what)


def _crypto() -> tuple[ModuleType, ModuleType]:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError:  # pragma: no cover - installed with the `fleet` extra
        raise SignatureError("signatures need the 'model-signing' package (pip install 'portkern[fleet]')") from None
    return serialization, ec


def _model_signing() -> ModuleType:
    try:
        import model_signing.signing
        import model_signing.verifying
    except ImportError:  # pragma: no cover - installed with the `fleet` extra
        raise SignatureError("signatures need the 'model-signing' package (pip install 'portkern[fleet]')") from None
    return model_signing


# --- keys --------------------------------------------------------------------


def new_key_pair(prefix: str | Path) -> tuple[Path, Path]:
    """Write a new EC P-256 key pair: `PREFIX.key` (PKCS8 PEM, mode 0600) and `PREFIX.pub`.

    Existing files are never overwritten.
    """
    serialization, ec = _crypto()
    private, public = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    for path in (private, public):
        if path.exists():
            raise KeyFileError(f"{path} exists; not overwriting a key")
    key = ec.generate_private_key(ec.SECP256R1())
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(private_pem)
        os.chmod(private, 0o600)
        with open(public, "xb") as f:
            f.write(public_pem)
    except OSError as exc:
        raise KeyFileError(f"cannot write key pair {prefix}: {exc.strerror or exc}") from None
    return private, public


def check_signing_key(path: str | Path) -> Path:
    """The path of a usable private signing key (EC P-256 PEM), or a `KeyFileError`."""
    serialization, ec = _crypto()
    path = Path(path)
    data = read_bounded(path, MAX_KEY_FILE_BYTES, "signing key", KeyFileError)
    try:
        key = serialization.load_pem_private_key(data, None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise KeyFileError(f"{path}: signing keys must be EC P-256 (make one with `portkern keys new`)")
    return path


def _fingerprint(public_key: Any) -> str:
    serialization, _ = _crypto()
    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def read_trusted_keys(path: str | Path) -> tuple[TrustedKey, ...]:
    """The public keys in a trusted-keys file (one or more PEM blocks)."""
    serialization, ec = _crypto()
    path = Path(path)
    data = read_bounded(path, MAX_KEY_FILE_BYTES, "trusted keys file", KeyFileError)
    keys, previous_end = [], 0
    for i, match in enumerate(_PEM_BLOCK.finditer(data)):
        try:
            public = serialization.load_pem_public_key(match.group(0))
        except (ValueError, TypeError) as exc:
            raise KeyFileError(f"{path}: key {i + 1} is not a PEM public key ({exc})") from None
        if not isinstance(public, ec.EllipticCurvePublicKey):
            raise KeyFileError(f"{path}: key {i + 1} is not an EC key (model-signing verifies EC keys)")
        between = data[previous_end : match.start()].decode("utf-8", "replace").splitlines()
        names = [line.strip().lstrip("#").strip() for line in between if line.strip().lstrip("#").strip()]
        label = names[-1][:80] if names else f"{path.name} key {i + 1}"
        previous_end = match.end()
        pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        keys.append(TrustedKey(_fingerprint(public), label, pem))
    if not keys:
        raise KeyFileError(f"{path}: no PEM public key in it")
    if len(keys) == 1 and keys[0].label == f"{path.name} key 1":
        keys[0] = TrustedKey(keys[0].fingerprint, path.name, keys[0].pem)
    return tuple(keys)


def from_env() -> Policy:
    """The signing policy the environment sets (see the module docstring)."""
    trusted_file = settings.trusted_keys_file()
    signing_key = settings.signing_key_file()
    required = settings.require_signature()
    trusted = _trusted_cached(trusted_file, *_stamp(trusted_file)) if trusted_file else ()
    if required and not trusted:
        raise KeyFileError(f"{REQUIRE_ENV} is set but {TRUSTED_KEYS_ENV} names no trusted key")
    role = settings.role() or (PUBLISHER if signing_key else READER)
    if role not in (PUBLISHER, READER):
        raise KeyFileError(f"{ROLE_ENV} must be {PUBLISHER!r} or {READER!r}, not {role[:40]!r}")
    return Policy(trusted, required, Path(signing_key) if signing_key and role == PUBLISHER else None, role)


def key_to_sign_with(choice: str | None) -> Path | None:
    """The private key a command signs with: `--sign KEY`; for `--sign` alone (`""`) or no
    `--sign` (None), `PORTKERN_SIGNING_KEY` (None if unset: no signature)."""
    if choice:
        return Path(choice)
    key = settings.signing_key_file()
    if choice == "" and not key:
        raise KeyFileError(f"--sign without a KEY needs {SIGNING_KEY_ENV}")
    return Path(key) if key else None


def _stamp(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
        return st.st_mtime_ns, st.st_size
    except OSError:
        return 0, 0


@lru_cache(maxsize=8)
def _trusted_cached(path: str, mtime_ns: int, size: int) -> tuple[TrustedKey, ...]:
    return read_trusted_keys(path)


# --- signing and verifying ----------------------------------------------------


def signature_path(path: str | Path) -> Path:
    """Where the detached signature of a file lives (`FILE.sig`)."""
    return Path(f"{path}{SIGNATURE_SUFFIX}")


def sign_file(path: str | Path, key: str | Path) -> Path:
    """Sign a file with a private key; write and return `FILE.sig`."""
    model_signing = _model_signing()
    key = check_signing_key(key)
    target = signature_path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        model_signing.signing.Config().use_elliptic_key_signer(private_key=key).sign(Path(path), tmp)
        os.replace(tmp, target)
    except OSError as exc:
        raise SignatureError(f"cannot sign {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # model-signing's refusals (a symlink, a path it cannot serialise)
        raise SignatureError(f"cannot sign {path}: {exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def sign_value(name: str, data: bytes, key: str | Path) -> bytes:
    """An OMS signature (JSON bytes) over `data` as a file called `name` (a cache key)."""
    model_signing = _model_signing()
    key = check_signing_key(key)
    with tempfile.TemporaryDirectory(prefix=f"portkern-sign-{os.getpid()}-") as where:
        model = Path(where) / "model"
        model.mkdir()
        (model / _checked_name(name)).write_bytes(data)
        try:
            model_signing.signing.Config().use_elliptic_key_signer(private_key=key).sign(model, Path(where) / "sig")
        except (OSError, ValueError) as exc:
            raise SignatureError(f"cannot sign {name}: {exc}") from None
        return (Path(where) / "sig").read_bytes()


def verify_file(path: str | Path, data: bytes | None, trusted: tuple[TrustedKey, ...], memo: Memo | None = None) -> Verdict:
    """Check `FILE.sig` over `data`, the file's bytes as the caller read them (so a file
    swapped after reading cannot pass), against the trusted keys. `data` None: the file
    is larger than the caller read (a bundle's parameter section), and is hashed here.
    `memo`: where passed checks are remembered."""
    sig = signature_path(path)
    if not sig.exists():
        return Verdict(False, reason=f"not signed (no {sig.name})")
    try:
        signature = read_bounded(sig, MAX_SIGNATURE_BYTES, "signature", SignatureError, regular=True)  # (a pipe there would block)
    except SignatureError as exc:
        return Verdict(True, reason=f"signed, but {exc}")
    if data is None:
        return _verify_path(Path(path), signature, trusted, memo)
    return verify_value(None, data, signature, trusted, memo)


def verify_value(name: str | None, data: bytes, signature: bytes, trusted: tuple[TrustedKey, ...], memo: Memo | None = None) -> Verdict:
    """Check an OMS signature over `data` (as a file called `name`, or as a lone file when
    `name` is None) against the trusted keys. Never raises for a bad signature.
    `memo`: where passed checks are remembered."""

    def model(where: Path) -> Path:
        if name is None:
            (where / "model").write_bytes(data)
        else:
            (where / "model").mkdir()
            (where / "model" / _checked_name(name)).write_bytes(data)
        return where / "model"

    def check_of(key: TrustedKey) -> Verified:
        return _check(hashlib.sha256(data).hexdigest(), name or "", signature, key, trusted)

    return _verify(signature, trusted, model, memo, check_of)


def _verify_path(path: Path, signature: bytes, trusted: tuple[TrustedKey, ...], memo: Memo | None) -> Verdict:
    """Check a signature over a file model-signing reads itself. A passed check is remembered
    only when the file kept its identity (device, inode, size, mtime, ctime) from before it
    was hashed here until after model-signing read it, so the digest remembered is the one
    model-signing checked."""
    before: list[tuple[int, ...]] = []

    def check_of(key: TrustedKey) -> Verified | None:
        try:  # (a named pipe swapped in is refused, not waited on)
            f, _ = open_regular(path, "a signed file", OSError)
            with f:
                before.append(_identity(os.fstat(f.fileno())))
                content = _sha256(f)
        except OSError:
            return None
        return _check(content, "", signature, key, trusted)

    def unchanged() -> bool:
        try:
            return bool(before) and _identity(os.stat(path)) == before[0]
        except OSError:
            return False

    return _verify(signature, trusted, lambda where: path, memo, check_of, unchanged)


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _sha256(f: Any) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def _check(content: str, name: str, signature: bytes, key: TrustedKey, trusted: tuple[TrustedKey, ...]) -> Verified:
    keyset = hashlib.sha256("\n".join(sorted(k.fingerprint for k in trusted)).encode()).hexdigest()
    return Verified(content, name, hashlib.sha256(signature).hexdigest(), key.fingerprint, keyset)


def _verify(
    signature: bytes,
    trusted: tuple[TrustedKey, ...],
    model: Callable[[Path], Path],
    memo: Memo | None = None,
    check_of: Callable[[TrustedKey], Verified | None] | None = None,
    unchanged: Callable[[], bool] = lambda: True,
) -> Verdict:
    """The verdict of model-signing's verifier on `signature` over the model `model(scratch)`
    puts in (or names outside) a scratch directory, with the trusted key the signature's key
    hint names. With a `memo`, `check_of(key)` is this check's record: found there, it passes
    without model-signing; passed by model-signing (and `unchanged()`), it is remembered there."""
    if len(signature) > MAX_SIGNATURE_BYTES:
        return Verdict(True, reason="signed, but the signature is larger than the limit")
    hint = _key_hint(signature)
    if hint is None:
        return Verdict(True, reason="signed, but the signature is not an OMS signature bundle")
    key = next((k for k in trusted if k.fingerprint == hint), None)
    if key is None:
        return Verdict(True, reason=f"signed by an untrusted key sha256:{hint[:16]} (not in {TRUSTED_KEYS_ENV})")
    check = check_of(key) if memo is not None and check_of is not None else None
    if memo is not None and check is not None and memo.verified(check):
        return Verdict(True, key=key)
    verdict = _model_signing_verdict(signature, key, model)
    if memo is not None and check is not None and verdict.trusted and unchanged():
        memo.remember(check)
    return verdict


def _model_signing_verdict(signature: bytes, key: TrustedKey, model: Callable[[Path], Path]) -> Verdict:
    """model-signing's verifier on `signature` over `model(scratch)` with `key`."""
    model_signing = _model_signing()
    from cryptography.exceptions import InvalidSignature

    with tempfile.TemporaryDirectory(prefix=f"portkern-verify-{os.getpid()}-") as scratch:
        where = Path(scratch)
        (where / "key.pub").write_bytes(key.pem)
        (where / "signature").write_bytes(signature)
        try:
            checked = model(where)
        except OSError as exc:
            return Verdict(True, reason=f"signed, but the signed content cannot be read or written ({exc.strerror or exc})")
        config = model_signing.verifying.Config().use_elliptic_key_verifier(public_key=where / "key.pub")
        try:
            config.verify(checked, where / "signature")
        except InvalidSignature:
            return Verdict(True, reason="signed, but the signature does not verify (not made by that key over this statement)")
        except OSError as exc:
            return Verdict(True, reason=f"signed, but the signed content cannot be read ({exc.strerror or exc})")
        except Exception as exc:  # noqa: BLE001 - hostile input: model-signing raises ValueError, and
            # KeyError, IndexError, TypeError... for a malformed bundle or statement; every one refuses
            if str(exc).startswith("Signature mismatch"):  # the statement verified, the content differs
                return Verdict(True, reason="signed, but the signature does not verify (it is for other content)")
            return Verdict(True, reason=f"signed, but the signature does not verify (model-signing: {brief(exc, limit=160)})")
    return Verdict(True, key=key)


def _key_hint(signature: bytes) -> str | None:
    """The key hint (sha256 of the signer's public key) an OMS key signature names, or None."""
    try:
        hint = json.loads(signature)["verificationMaterial"]["publicKey"]["hint"]
    except (ValueError, LookupError, TypeError, RecursionError):
        return None
    return hint if isinstance(hint, str) and hint else None


def require_trusted(verdict: Verdict, what: str) -> TrustedKey:
    """The trusted key of a verdict, or the typed error that says why there is none."""
    if verdict.key is not None:
        return verdict.key
    error = UnsignedError if not verdict.signed else UntrustedKeyError
    raise error(f"{what}: {verdict.describe()}")


def _checked_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}", name):
        raise SignatureError(f"cannot sign a value named {name[:40]!r}")
    return name
