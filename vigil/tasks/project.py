"""The user's ops repository: the folder that holds their inventory, roles and state.

A ``vigil.yaml`` marks it (or an ``invoke.yaml``/``invoke.yml`` with a ``vigil:`` key);
the nearest one above the working directory wins, so a command run anywhere inside the
repository reads the same inventory. Every relative path — config values and path flags
alike — resolves against that folder, never against the working directory or vigil's own
installation. Without a marker, the working directory is the root.

Settings, lowest first: built-in defaults < the project file < Invoke's own config
(``~/.invoke.yaml``, ``INVOKE_VIGIL_*``) < a task's flags.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vigil.errors import ConfigError

CONFIG_FILE = "vigil.yaml"
INVOKE_FILES = ("invoke.yaml", "invoke.yml")
# Every key of the `vigil` settings, with its default. None: see where it is read.
DEFAULTS: Mapping[str, Any] = {
    "inventory": "inventory",
    "roles": "roles",  # the ops repo's own roles, searched before the built-in ones
    "templates": None,  # None: roles/service/templates of the repo, then the built-in ones
    "state_dir": "state",
    "poll_s": None,  # None: each host's own (the verify role's default)
    "history_min_samples": 3,
    "probe": "stream",
}


@dataclass(frozen=True)
class Project:
    root: Path
    config_file: Path | None = None  # None: no marker found, the working directory is root
    settings: Mapping[str, Any] = field(default_factory=dict)  # the project file's values

    def path(self, value: str | Path) -> Path:
        """A path from a setting or a flag: relative ones are the project's."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else self.root / p


def _vigil_section(path: Path) -> Mapping[str, Any] | None:
    from vigil.desired.yamlfile import read_yaml  # pydantic and yaml: when a task runs

    data = read_yaml(path)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping", file=str(path))
    section = data.get("vigil")
    if section is None:
        return None
    if not isinstance(section, dict):
        raise ConfigError("expected a mapping of vigil settings", file=str(path), key="vigil")
    return section


def _checked(settings: Mapping[str, Any], where: Path, prefix: str) -> dict[str, Any]:
    for key in settings:
        if key not in DEFAULTS:
            close = difflib.get_close_matches(str(key), list(DEFAULTS), n=1)
            raise ConfigError(
                f"unknown setting {key!r}", file=str(where), key=f"{prefix}{key}",
                fix=f"did you mean {close[0]!r}?" if close
                else f"known settings: {', '.join(DEFAULTS)}")
    return dict(settings)


def find(start: Path) -> Project:
    """The project around ``start``: the nearest folder with a marker, else ``start``."""
    from vigil.desired.yamlfile import read_yaml

    start = start.resolve()
    for folder in (start, *start.parents):
        marker = folder / CONFIG_FILE
        if marker.is_file():
            data = read_yaml(marker)
            if data is None:
                data = {}
            if not isinstance(data, dict):
                raise ConfigError("expected a mapping of vigil settings", file=str(marker),
                                  fix="e.g. inventory: inventory")
            return Project(folder, marker, _checked(data, marker, ""))
        for name in INVOKE_FILES:
            path = folder / name
            if path.is_file():
                section = _vigil_section(path)
                if section is not None:
                    return Project(folder, path, _checked(section, path, "vigil."))
    return Project(start)


def value(project: Project, config: Mapping[str, Any], key: str) -> Any:
    """One setting: Invoke's config (set there, not None) > the project file > default."""
    chosen = config.get(key)
    if chosen is None:
        chosen = project.settings.get(key)
    if chosen is None:
        chosen = DEFAULTS[key]
    return chosen
