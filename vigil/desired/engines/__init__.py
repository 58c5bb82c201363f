"""Node-group engines, one module each (``base.Engine`` is the interface); a group file's
``backend`` names one. Found by scanning this package, so a new engine is a new module
with an ``ENGINE`` (and its unit template, if it has a unit of its own)."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from vigil.desired.engines.base import Engine
from vigil.errors import ConfigError


@cache
def registry() -> dict[str, Engine]:
    found: dict[str, Engine] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        engine = importlib.import_module(f"{__name__}.{info.name}").ENGINE
        found[engine.name] = engine
    return dict(sorted(found.items()))


def engine(name: str, file: str) -> Engine:
    """The engine a group file's ``backend`` names; one clear error for another name."""
    engines = registry()
    if name not in engines:
        raise ConfigError(f"backend {name!r} is not an engine vigil knows", file=file,
                          key="backend", fix=f"use one of: {', '.join(engines)}")
    return engines[name]
