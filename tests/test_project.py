"""The project's promises about itself: README's two opening commands, and CI running the second."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def opening_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    match = re.match(r"# portkern\s*\n+```sh\n(.*?)\n```", text, re.S)
    assert match, "README.md must open with a fenced block of commands right after its title"
    return [line for line in match.group(1).splitlines() if line.strip()]


def test_readme_opens_with_the_demo_and_the_test_command():
    assert opening_commands() == ["./dev.sh demo", "./dev.sh test"]


def ci_steps() -> list[str]:
    """The commands `.ci/run` runs as steps (`step NAME COMMAND...`, each run even when another fails)."""
    ci = (ROOT / ".ci" / "run").read_text()
    steps = [m.group(1).split("#")[0].strip() for m in re.finditer(r"^step \S+ (.+)$", ci, re.M)]
    assert steps, ".ci/run must run its commands as `step NAME COMMAND` lines"
    return steps


def test_ci_runs_the_readme_test_command():
    assert opening_commands()[1] in ci_steps()


def pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements() -> list:
    """Every requirement pyproject.toml states: dependencies and extras (not portkern's own)."""
    from packaging.requirements import Requirement

    project = pyproject()["project"]
    named = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [Requirement(r) for r in named if not r.startswith("portkern")]


def constraints(name: str) -> dict[str, str]:
    """Package (normalised name) -> exact version, of the lines whose marker holds here."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate():
                (spec,) = req.specifier
                assert spec.operator == "==", line
                assert canonicalize_name(req.name) not in pins, f"{name}: {req.name} pinned twice for this Python"
                pins[canonicalize_name(req.name)] = spec.version
    return pins


def test_dependencies_are_ranges_and_the_lock_pins_each_inside_its_range():
    from packaging.utils import canonicalize_name

    lock = constraints("constraints.txt")
    for req in requirements():
        name = canonicalize_name(req.name)
        assert name in lock, f"constraints.txt does not pin {req.name}"
        assert req.specifier.contains(lock[name], prereleases=True), f"constraints.txt pins {req.name}=={lock[name]}, outside {req}"
        exact = [s for s in req.specifier if s.operator == "=="]
        assert not exact or name.startswith("iree-base-"), f"{req} is pinned exactly in pyproject.toml; state a range"


def test_lowest_constraints_are_the_lower_bounds_of_the_ranges():
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    project = pyproject()["project"]
    lowest = constraints("constraints-lowest.txt")
    tested = project["dependencies"] + project["optional-dependencies"]["test"]
    for req in (r for r in requirements() if str(r) in tested):
        bounds = [s.version for s in req.specifier if s.operator == ">="]
        if bounds:
            pinned = lowest.get(canonicalize_name(req.name))
            assert pinned and Version(pinned) == Version(bounds[0]), f"constraints-lowest.txt must pin {req.name}=={bounds[0]}"


def test_ci_smoke_tests_exactly_the_supported_pythons():
    from packaging.specifiers import SpecifierSet

    project = pyproject()["project"]
    dev = (ROOT / "dev.sh").read_text()
    match = re.search(r"^PYTHONS=\(([^)]*)\)", dev, re.M)
    assert match, "dev.sh must list the supported Pythons in PYTHONS=(...)"
    pythons = match.group(1).split()
    classified = [c.rsplit(" :: ", 1)[1] for c in project["classifiers"] if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert pythons == classified
    admitted = SpecifierSet(project["requires-python"])
    assert all(f"{v}.0" in admitted for v in pythons)
    assert f"3.{int(pythons[0].split('.')[1]) - 1}.99" not in admitted and f"3.{int(pythons[-1].split('.')[1]) + 1}.0" not in admitted
    assert "./dev.sh compat" in ci_steps()
