"""`portkern cache export/import`: native code and tuning results moved between machines.

An export file is framed like a bundle (`portkern.base.framing`, magic
`\\x89PKX\\r\\n\\x1a\\n`); its payload is `{"meta": <schemas/cache-export.schema.json>,
"blobs": {<sha256>: <artifact bytes>}}`. Import treats the file as untrusted:
it checks the schema, every artifact's hash, and recomputes every key from the
parts the entry states, so an entry can only ever be served to the device it
was built for. Entries for other devices are kept (a fleet file may carry many)
but never match this one; a local entry that is intact is never replaced.

Native code is code this machine will run, so it is imported only from a file
whose signature (`FILE.sig`, `portkern.base.signing`) verifies with a key in
`PORTKERN_TRUSTED_KEYS`, unless the caller allows unsigned code; tuning results
are suggestions (their code is built here) and import either way.
"""

from __future__ import annotations

import hashlib
from dataclasses import field
from pathlib import Path
from typing import Any, Iterable

from portkern import schemas
from portkern.base import framing, signing
from portkern.base.errors import CacheError
from portkern.base.records import record, to_plain, wire
from portkern.cache import metrics
from portkern.cache.device import DeviceFingerprint
from portkern.cache.keys import artifact_key, tuning_key
from portkern.cache.store import Entry, Store, matches_device

MAGIC = b"\x89PKX\r\n\x1a\n"
FORMAT = framing.Format.with_error("cache export", MAGIC, 1, 0, CacheError)
MAX_EXPORT_BYTES = 16 << 30


@record
class TransferReport:
    """What an export or import moved, and what it refused."""

    path: str
    entries: int = 0
    records: int = 0
    bytes: int = 0
    skipped: int = 0
    rejected: list[str] = field(default_factory=list)
    #: The file's signature: written (export), or checked against the trusted keys (import).
    signature: signing.Verdict | None = field(default=None, metadata=wire(encode=lambda v: v.to_dict() if v else None))
    #: Native code was imported without a trusted signature because the caller allowed it.
    unsigned_allowed: bool = False
    #: The signature file an export wrote (`false` in `to_dict` when the export is not signed).
    signed: str | None = field(default=None, metadata=wire(encode=lambda path: path or False))
    #: How an unsigned export will be received where it is imported (None: signed, or no native code).
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)


def check_meta(meta: object) -> None:
    """Check an export's metadata against `schemas/cache-export.schema.json`; `CacheError` at the first
    violation. Compiled (fastjsonschema): an export can carry 65,536 entries."""
    schemas.check("cache-export", meta, CacheError)


def export(
    store: Store, path: str | Path, *, device: str | None = None, keys: Iterable[str] | None = None, sign_with: str | Path | None = None
) -> TransferReport:
    """Write the store's artifacts and tuning results (optionally one device's, or some keys) to a
    file, signed (`FILE.sig`) with the private key `sign_with` when given."""
    if sign_with is not None:
        signing.check_signing_key(sign_with)  # a bad key fails before the export
    wanted = set(keys) if keys is not None else None
    entries, blobs = [], {}
    for entry in store.entries():
        if wanted is not None and entry.key not in wanted:
            continue
        if device is not None and not matches_device(entry.device, device):
            continue
        data = store.read_raw(entry.key)
        if data is None or hashlib.sha256(data).hexdigest() != entry.sha256:
            continue  # corrupt entries stay behind; `portkern cache verify` reports them
        entries.append(entry.to_dict())
        blobs[entry.sha256] = data
    records = []
    if wanted is None:
        for key, record in store.records("t"):
            if all(k in record for k in ("problem", "device", "compiler")):
                if device is None or matches_device(record["device"], device):
                    records.append({"kind": "t", "key": key, "record": record})
    meta = {"format": "portkern-cache-export", "version": [FORMAT.major, FORMAT.minor], "entries": entries, "records": records}
    data = framing.pack(FORMAT, {"meta": meta, "blobs": {sha: blobs[sha] for sha in sorted(blobs)}})
    framing.write_atomic(path, data, CacheError)
    report = TransferReport(str(path), len(entries), len(records), sum(len(b) for b in blobs.values()))
    if sign_with is not None:
        report.signed = str(signing.sign_file(path, sign_with))
    else:
        signing.signature_path(path).unlink(missing_ok=True)  # a signature of an earlier file would not match
        if entries:
            report.note = (
                f"not signed (no --sign KEY, no {signing.SIGNING_KEY_ENV}): `portkern cache import` refuses its "
                f"{len(entries)} native-code entries unless given --allow-unsigned; its tuning results import either way. "
                f"Sign it on the publisher (--sign KEY or {signing.SIGNING_KEY_ENV}) for devices that trust that key "
                f"({signing.TRUSTED_KEYS_ENV})"
            )
    return report


def import_(store: Store, path: str | Path, *, device: str | None = None, allow_unsigned: bool = False) -> TransferReport:
    """Add an export file's entries and tuning results (optionally one device's) to the store;
    refuse anything that does not check out, and native code unless the file is signed by a
    trusted key (or `allow_unsigned`)."""
    path = Path(path)
    raw = framing.read_bounded(path, MAX_EXPORT_BYTES, "cache export", CacheError, regular=True)
    try:
        _, _, document = framing.unpack(FORMAT, raw)
        meta, blobs = framing.meta_and_blobs(document, "cache-export", CacheError, validate=False)
        check_meta(meta)
    except CacheError as exc:
        raise CacheError(f"{path}: {exc}") from None
    signature = signing.verify_file(path, raw, signing.from_env().trusted)
    report = TransferReport(str(path), signature=signature)
    refusal = None
    if not signature.trusted:
        if allow_unsigned:
            report.unsigned_allowed = bool(meta["entries"])
        else:
            refusal = f"native code refused: the file is {signature.describe()} (--allow-unsigned takes it anyway)"
    wanted = [item for item in meta["entries"] if device is None or matches_device(item["device"], device)]
    accepted = [found for item in wanted if (found := _checked_entry(store, Entry(**item), blobs, report, refusal))]
    report.entries = store.put_many(accepted)
    report.bytes = sum(len(data) for _, data, _ in accepted[: report.entries])
    for item in meta["records"]:
        record = item["record"]
        if device is not None and not matches_device(record["device"], device):
            continue
        fingerprint = DeviceFingerprint.from_dict(record["device"])
        if tuning_key(record["problem"], fingerprint, record["compiler"]) != item["key"]:
            report.rejected.append(f"tuning result {item['key'][:12]}: key does not match its problem/device/compiler")
            continue
        if store.put_record("t", item["key"], record):
            report.records += 1
    metrics.refused(store, metrics.IMPORT_ENTRY, len(report.rejected))
    return report


def _checked_entry(
    store: Store, entry: Entry, blobs: dict[str, bytes], report: TransferReport, refusal: str | None
) -> tuple[str, bytes, Entry] | None:
    """An entry to store, if it checks out, `refusal` (why native code from this file is not
    taken) is None, and it is not already here intact (else it is counted in `report`)."""
    name = f"{entry.kernel} on {entry.device_label} ({entry.key[:12]})"
    data = blobs.get(entry.sha256)
    if data is None or len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
        report.rejected.append(f"{name}: artifact missing or does not match its sha256")
        return None
    device = DeviceFingerprint.from_dict(entry.device)
    if device.label != entry.device_label:
        report.rejected.append(f"{name}: device label does not match its fingerprint")
        return None
    expected = artifact_key(entry.kernel_digest, device, entry.compiler, entry.config, entry.flags).hex
    if expected != entry.key:
        report.rejected.append(f"{name}: key does not match the kernel, device, compiler, config and flags it states")
        return None
    if refusal is not None:
        report.rejected.append(f"{name}: {refusal}")
        return None
    if store.get(entry.key, count=False) is not None:
        report.skipped += 1
        return None
    entry.last_used = 0.0
    return entry.key, data, entry
