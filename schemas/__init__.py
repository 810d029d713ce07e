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
