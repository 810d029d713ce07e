"""JSON schemas of portkern's file formats, and validators for them."""

from __future__ import annotations

import functools
import json
from importlib import resources


@functools.lru_cache(maxsize=None)
def schema(name: str) -> dict:
    """The JSON schema `name` (e.g. "manifest", "bundle") as a dict."""
    return json.loads(resources.files(__name__).joinpath(f"{name}.schema.json").read_text())


@functools.lru_cache(maxsize=None)
def validator(name: str):
    """A reusable jsonschema validator for the schema `name`."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema(name))
    cls.check_schema(schema(name))
    return cls(schema(name))
