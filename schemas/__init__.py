"""JSON schemas of portkern's file formats, and validators for them."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

_HERE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def _text(name: str) -> str:
    return (_HERE / f"{name}.schema.json").read_text()


@functools.lru_cache(maxsize=None)
def schema(name: str) -> dict[str, Any]:
    """The JSON schema `name` (e.g. "manifest", "bundle") as a dict."""
    loaded: dict[str, Any] = json.loads(_text(name))
    return loaded


def digest(name: str) -> str:
    """sha256 of the schema `name`: what a "this passed validation" memo must be keyed on."""
    return hashlib.sha256(_text(name).encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def validator(name: str) -> Any:
    """A reusable jsonschema validator for the schema `name`."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema(name))
    cls.check_schema(schema(name))
    return cls(schema(name))


@functools.lru_cache(maxsize=None)
def compiled(name: str) -> Callable[[Any], Any]:
    """A compiled validator (fastjsonschema) for the schema `name`: cheap to import and fast to
    run, for large documents and hot paths. The schemas keep to keywords draft 7 shares with
    2020-12 (`$defs` are plain JSON pointers)."""
    import fastjsonschema

    validate: Callable[[Any], Any] = fastjsonschema.compile({**schema(name), "$schema": "http://json-schema.org/draft-07/schema#"})
    return validate


def check(name: str, document: object, error: type[Exception]) -> None:
    """Check `document` against the schema `name`; `error` at the first violation (as
    `violations` orders them), saying where and what."""
    found = violations(name, document)
    if found:
        first = found[0]
        raise error(f"metadata does not match the {name} schema at {first.where}: {first.detail[:300]}")


class Violation(NamedTuple):
    """Where a document breaks its schema (`path` into the document) and what rule."""

    path: tuple[str | int, ...]
    message: str
    #: The schema keyword broken ("type", "pattern", "required", ...).
    keyword: str
    #: The (sub)schema that holds the keyword.
    rule: Any
    #: The document's value at `path`.
    instance: Any

    @property
    def where(self) -> str:
        return "/".join(map(str, self.path)) or "meta"

    @property
    def detail(self) -> str:
        """The message; for a pattern that the schema describes, "VALUE is not DESCRIPTION"."""
        described = self.rule.get("description") if self.keyword == "pattern" and isinstance(self.rule, dict) else None
        return f"{self.instance!r} is not {described}" if described else self.message


def violations(name: str, document: object) -> list[Violation]:
    """Every way `document` breaks the schema `name`, shallowest path first (ordered as
    jsonschema's `iter_errors` sorted by path). An interpreter of the keywords the schemas
    use (`KEYWORDS`), so nothing is imported or generated per process."""
    root = schema(name)
    found: list[Violation] = []
    _validate(root, root, document, (), found)
    try:
        return sorted(found, key=lambda v: list(v.path))
    except TypeError:
        return sorted(found, key=lambda v: [str(part) for part in v.path])


#: The JSON Schema (2020-12) keywords `violations` applies; `tests/test_schemas.py` checks
#: that every schema keeps to them and that jsonschema agrees.
KEYWORDS = frozenset({
    "$schema", "$id", "$defs", "$ref", "title", "description", "type", "const", "enum", "anyOf",
    "minLength", "maxLength", "pattern", "minimum", "maximum", "minItems", "maxItems", "uniqueItems",
    "prefixItems", "items", "required", "properties", "additionalProperties", "propertyNames",
    "minProperties", "maxProperties",
})


@functools.lru_cache(maxsize=None)
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(text)


def _resolve(root: dict[str, Any], ref: str) -> Any:
    if not ref.startswith("#"):
        raise ValueError(f"only local references are supported, not {ref!r}")
    node: Any = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _is_type(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if isinstance(value, bool):
        return False
    if kind == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, (int, float))
    raise ValueError(f"unknown JSON type {kind!r}")


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: booleans are not numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _validate(root: dict[str, Any], node: Any, value: Any, path: tuple[str | int, ...], out: list[Violation]) -> None:
    if node is True:
        return
    if node is False:
        out.append(Violation(path, "False schema does not allow " + repr(value)[:100], "false", node, value))
        return

    def fail(keyword: str, message: str) -> None:
        out.append(Violation(path, message, keyword, node, value))

    if "$ref" in node:
        _validate(root, _resolve(root, node["$ref"]), value, path, out)
    kinds = node.get("type")
    if kinds is not None:
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if not any(_is_type(value, kind) for kind in kinds):
            fail("type", f"{value!r:.100} is not of type {', '.join(map(repr, kinds))}")
    if "const" in node and not _equal(value, node["const"]):
        fail("const", f"{node['const']!r} was expected")
    if "enum" in node and not any(_equal(value, item) for item in node["enum"]):
        fail("enum", f"{value!r:.100} is not one of {node['enum']!r}")
    if "anyOf" in node:
        for option in node["anyOf"]:
            trial: list[Violation] = []
            _validate(root, option, value, path, trial)
            if not trial:
                break
        else:
            fail("anyOf", f"{value!r:.100} is not valid under any of the given schemas")
    if isinstance(value, str):
        if "minLength" in node and len(value) < node["minLength"]:
            fail("minLength", f"{value!r:.100} is too short")
        if "maxLength" in node and len(value) > node["maxLength"]:
            fail("maxLength", f"{value!r:.100} is too long")
        if "pattern" in node and _pattern(node["pattern"]).search(value) is None:
            fail("pattern", f"{value!r:.100} does not match {node['pattern']!r}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in node and value < node["minimum"]:
            fail("minimum", f"{value!r} is less than the minimum of {node['minimum']!r}")
        if "maximum" in node and value > node["maximum"]:
            fail("maximum", f"{value!r} is greater than the maximum of {node['maximum']!r}")
    elif isinstance(value, list):
        if "minItems" in node and len(value) < node["minItems"]:
            fail("minItems", f"{value!r:.100} should be non-empty" if node["minItems"] == 1 else f"{value!r:.100} is too short")
        if "maxItems" in node and len(value) > node["maxItems"]:
            fail("maxItems", f"{value!r:.100} is too long")
        if node.get("uniqueItems") and any(_equal(a, b) for i, a in enumerate(value) for b in value[i + 1:]):
            fail("uniqueItems", f"{value!r:.100} has non-unique elements")
        prefix = node.get("prefixItems", ())
        for index, (item, rule) in enumerate(zip(value, prefix)):
            _validate(root, rule, item, path + (index,), out)
        if "items" in node:
            for index in range(len(prefix), len(value)):
                _validate(root, node["items"], value[index], path + (index,), out)
    elif isinstance(value, dict):
        for key in node.get("required", ()):
            if key not in value:
                fail("required", f"{key!r} is a required property")
        if "minProperties" in node and len(value) < node["minProperties"]:
            fail("minProperties", f"{value!r:.100} does not have enough properties")
        if "maxProperties" in node and len(value) > node["maxProperties"]:
            fail("maxProperties", f"{value!r:.100} has too many properties")
        properties = node.get("properties", {})
        for key, item in value.items():
            if key in properties:
                _validate(root, properties[key], item, path + (key,), out)
        extra = node.get("additionalProperties", True)
        others = [key for key in value if key not in properties]
        if extra is False and others:
            fail("additionalProperties", f"Additional properties are not allowed ({', '.join(map(repr, others))} unexpected)")
        elif isinstance(extra, dict):
            for key in others:
                _validate(root, extra, value[key], path + (key,), out)
        if "propertyNames" in node:
            for key in value:
                _validate(root, node["propertyNames"], key, path, out)
