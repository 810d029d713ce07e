"""The package layering of docs/architecture.md, read from the imports themselves.

Layers, bottom first: schemas <- base <- portable <- cache <- jit <- tuner <- api (portkern,
portkern.onnx) <- examples <- cli. A package imports only packages below it, counting
imports inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LAYERS = ("schemas", "base", "portable", "cache", "jit", "tuner", "api", "examples", "cli")
FOLDERS = {
    "schemas": "schemas", "base": "base", "portable": "portable", "cache": "cache", "jit": "jit",
    "tuner": "tuner", "api": "api", "examples": "examples", "cli": "api/cli",
}


def package_of_module(module: str) -> str | None:
    """The layer a dotted module name belongs to (None outside portkern)."""
    parts = module.split(".")
    if parts[0] != "portkern":
        return None
    if len(parts) == 1:
        return "api"
    return parts[1] if parts[1] in LAYERS else "api"


def package_of_file(path: Path, root: Path) -> str:
    rel = path.relative_to(root).as_posix()
    if rel.startswith("api/cli/") or rel == "api/__main__.py":
        return "cli"
    return rel.split("/", 1)[0]


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """Every portkern module a file imports, anywhere in it (functions included)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "portkern":
                found += [(node.lineno, f"portkern.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


def layering_violations(files, root: Path = ROOT) -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    out = []
    for path in files:
        own = package_of_file(path, root)
        for line, module in imported_modules(ast.parse(path.read_text(), str(path))):
            target = package_of_module(module)
            if target is None or target == own:
                continue
            if rank[target] > rank[own]:
                out.append(f"{path.relative_to(root)}:{line}: {own} imports {module} ({target} is above it)")
    return out


def all_files() -> list[Path]:
    return sorted(p for folder in set(FOLDERS.values()) for p in (ROOT / folder).rglob("*.py"))


def test_no_package_imports_one_above_it():
    files = all_files()
    assert len(files) > 100, "the source tree is found"
    assert layering_violations(files) == []


def test_the_check_sees_an_upward_import_even_inside_a_function(tmp_path):
    fake_root = tmp_path
    (fake_root / "jit").mkdir()
    bad = fake_root / "jit" / "bad.py"
    bad.write_text("def f():\n    from portkern.tuner import session\n    return session\n")
    fine = fake_root / "jit" / "fine.py"
    fine.write_text("from portkern.cache import keys\nfrom portkern.base.errors import PortkernError\n")
    found = layering_violations([bad, fine], fake_root)
    assert found == ["jit/bad.py:2: jit imports portkern.tuner (tuner is above it)"]
