"""The schema checks on the reader's path agree with jsonschema, the reference implementation."""

from __future__ import annotations

import copy
import json
import random

import jsonschema
import pytest
import yaml

from portkern import schemas
from portkern.examples import MANIFEST
from portkern.portable.bundle import read_bundle

NAMES = ("bundle", "manifest", "cache-export", "remote-entry")
#: Values put in place of a document's values: wrong types, out-of-range numbers, odd strings.
ODD = [None, True, 0, -1, 1.5, 2**40, "", "x" * 300, "a b", "../x", "0", [], [1], {}, {"x": 1}]


def keywords(node, out: set) -> set:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("properties", "$defs"):
                for sub in value.values():
                    keywords(sub, out)
            else:
                out.add(key)
                keywords(value, out)
    elif isinstance(node, list):
        for item in node:
            keywords(item, out)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_schema_keeps_to_the_keywords_the_checker_applies(name):
    assert keywords(schemas.schema(name), set()) <= schemas.KEYWORDS


def paths(value, path=()):
    """Every path into a JSON document."""
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, path + (index,))


def mutated(document, rng: random.Random):
    """`document` with one value replaced, one key added or one key or item removed."""
    doc = copy.deepcopy(document)
    path = rng.choice(list(paths(doc))[1:])
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    action = rng.randrange(3)
    if action == 0:
        parent[path[-1]] = copy.deepcopy(rng.choice(ODD))
    elif action == 1 and isinstance(parent, dict):
        parent["unexpected"] = 1
    else:
        del parent[path[-1]]
    return doc


def agree(name: str, document) -> None:
    reference = sorted(jsonschema.Draft202012Validator(schemas.schema(name)).iter_errors(document), key=lambda e: list(e.absolute_path))
    found = schemas.violations(name, document)
    assert bool(found) == bool(reference), (json.dumps(document)[:400], [e.message for e in reference], found[:1])
    if found:
        assert list(found[0].path) == list(reference[0].absolute_path)


def test_the_checker_agrees_with_jsonschema_on_a_bundle_and_its_mutations(examples_bundle):
    meta = read_bundle(examples_bundle).meta()
    assert schemas.violations("bundle", meta) == []
    rng = random.Random(40)
    for _ in range(400):
        agree("bundle", mutated(meta, rng))


def test_the_checker_agrees_with_jsonschema_on_a_manifest_and_its_mutations():
    manifest = yaml.safe_load(MANIFEST.read_text())
    assert schemas.violations("manifest", manifest) == []
    rng = random.Random(41)
    for _ in range(300):
        agree("manifest", mutated(manifest, rng))
