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


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert opening_commands()[1] in ci.splitlines()
