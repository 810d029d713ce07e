"""Loggers for modules on a warm process's path: `logging` is imported at a module's first event."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import logging

__all__ = ["logger"]


class _Deferred:
    """`logging.getLogger(name)`, looked up (and `logging` imported) at its first use."""

    __slots__ = ("name", "found")

    def __init__(self, name: str) -> None:
        self.name = name
        self.found: logging.Logger | None = None

    def __getattr__(self, attribute: str) -> Any:
        found = self.found
        if found is None:
            import logging

            found = self.found = logging.getLogger(self.name)
        return getattr(found, attribute)


def logger(name: str) -> logging.Logger:
    """The logger `name` (`logging.getLogger`), `logging` imported only when it is first used."""
    return cast("logging.Logger", _Deferred(name))
