"""JSON schemas of portkern's file formats, and validators for them."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

_HERE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def _text(name: str) -> str:
    return (_HERE / f"{name}.schema.json").read_text()


@functools.lru_cache(maxsize=None)
def schema(name: str) -> dict:
    """The JSON schema `name` (e.g. "manifest", "bundle") as a dict."""
    return json.loads(_text(name))


def digest(name: str) -> str:
    """sha256 of the schema `name`: what a "this passed validation" memo must be keyed on."""
    return hashlib.sha256(_text(name).encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def validator(name: str):
    """A reusable jsonschema validator for the schema `name`."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema(name))
    cls.check_schema(schema(name))
    return cls(schema(name))


@functools.lru_cache(maxsize=None)
def compiled(name: str):
    """A compiled validator (fastjsonschema) for the schema `name`: cheap to import and fast to
    run, for large documents and hot paths. The schemas keep to keywords draft 7 shares with
    2020-12 (`$defs` are plain JSON pointers)."""
    import fastjsonschema

    return fastjsonschema.compile({**schema(name), "$schema": "http://json-schema.org/draft-07/schema#"})


def check(name: str, document: object, error: type[Exception]) -> None:
    """Check `document` against the schema `name` (compiled); `error` at the first violation, saying where."""
    import fastjsonschema

    try:
        compiled(name)(document)
    except fastjsonschema.JsonSchemaValueException as exc:
        where = "/".join(str(part) for part in exc.path[1:]) or "meta"
        raise error(f"metadata does not match the {name} schema at {where}: {exc.message[:300]}") from None
