"""`Entry`: the metadata of one cached native artifact, and its strict decoding."""

from __future__ import annotations

import json
from dataclasses import MISSING, field, fields
from typing import Any, Callable

from portkern.base.errors import CacheError
from portkern.base.records import record, to_plain


class CorruptRecordError(CacheError):
    """A stored record cannot be decoded or does not have the shape of its kind."""


@record
class Entry:
    """Metadata of one cached native artifact."""

    key: str
    kernel: str
    bundle: str
    bundle_digest: str
    device: dict[str, Any]
    device_label: str
    config: str
    format: str
    size: int
    sha256: str
    compiler: str
    flags: list[str] = field(default_factory=list)
    kernel_digest: str = ""
    created: float = 0.0
    last_used: float = 0.0
    hits: int = 0
    finalize_s: float = 0.0
    kernel_time_s: float | None = None
    #: The bundle stage the code was compiled from ("any/flow", "source (built with IREE 3.12.0)", ...; "" unknown).
    stage: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain data."""
        return to_plain(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: Any) -> "Entry":
        """Decode a stored record; `CorruptRecordError` if it is not valid JSON of an entry's shape."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise CorruptRecordError(f"not JSON ({type(exc).__name__})") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> "Entry":
        """An entry from plain data, checking every field's type; unknown fields are ignored."""
        if not isinstance(data, dict):
            raise CorruptRecordError("not a JSON object")
        values = {}
        for name, required, check in _READ:
            if name not in data:
                if required:
                    raise CorruptRecordError(f"field {name!r} is missing")
                continue
            value = data[name]
            if not check(value):
                raise CorruptRecordError(f"field {name!r} has the wrong type")
            values[name] = value
        return cls(**values)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_REQUIRED = {f.name for f in fields(Entry) if f.default is MISSING and f.default_factory is MISSING}
_FIELD_CHECKS: dict[str, Callable[[Any], bool]] = {
    **{name: (lambda v: isinstance(v, str)) for name in (
        "key", "kernel", "bundle", "bundle_digest", "device_label", "config", "format", "sha256", "compiler", "kernel_digest", "stage")},
    "device": lambda v: isinstance(v, dict),
    "flags": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "size": _count,
    "hits": _count,
    "created": _number,
    "last_used": _number,
    "finalize_s": _number,
    "kernel_time_s": lambda v: v is None or _number(v),
}
#: Each field in order: its name, whether a record must have it, and its type check.
_READ = tuple((f.name, f.name in _REQUIRED, _FIELD_CHECKS[f.name]) for f in fields(Entry))
