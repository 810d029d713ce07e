"""`portkern`: the command-line entry point."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import warnings

from portkern import __version__
from portkern.cli.common import emit
from portkern.errors import PortkernError, UsageError, message_lines

#: Modules that each add one or more subcommands with `register(subparsers)`.
COMMANDS = (
    "portkern.cli.build",
    "portkern.cli.run",
    "portkern.cli.devices",
    "portkern.cli.cache",
    "portkern.cli.demo",
    "portkern.cli.finalize",
    "portkern.cli.tune",
)


class Parser(argparse.ArgumentParser):
    """argparse, with a bad command line raised as UsageError (so `--json` can report it)."""

    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def parser() -> argparse.ArgumentParser:
    root = Parser(
        prog="portkern",
        description="Build portable kernel bundles; finalise, tune, cache and run them on this machine.",
    )
    root.add_argument("--version", action="version", version=f"portkern {__version__}")
    sub = root.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return root


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"portkern: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser().parse_args(argv)
    except UsageError as exc:
        if "--json" in argv:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        print(f"portkern: error: {exc}", file=sys.stderr)
        return 2
    warnings.showwarning = _show_warning
    try:
        return emit(args.handler(args), getattr(args, "json", False))
    except PortkernError as exc:
        message = " ".join(message_lines(exc))
        if getattr(args, "json", False):
            print(json.dumps({"error": type(exc).__name__, "message": message}))
        print(f"portkern: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("portkern: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
