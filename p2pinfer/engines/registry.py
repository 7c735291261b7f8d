"""Engines are found through the entry point group ``p2pinfer.engines``.

A third-party package adds a backend by declaring, in its pyproject.toml::

    [project.entry-points."p2pinfer.engines"]
    my-engine = "my_package.module:MyEngine"

and ``load_engine("my-engine", **options)`` then builds it.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from .base import Engine

__all__ = ["ENTRY_POINT_GROUP", "UnknownEngineError", "available_engines", "engine_class", "load_engine"]

ENTRY_POINT_GROUP = "p2pinfer.engines"


class UnknownEngineError(LookupError):
    pass


def available_engines() -> list[str]:
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def engine_class(name: str) -> type[Engine]:
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not matches:
        raise UnknownEngineError(
            f"no engine named {name!r}; installed: {', '.join(available_engines()) or 'none'}"
        )
    cls = matches[0].load()
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise UnknownEngineError(f"entry point {name!r} does not name an Engine subclass")
    return cls


def load_engine(name: str, **options: Any) -> Engine:
    return engine_class(name).create(**options)
