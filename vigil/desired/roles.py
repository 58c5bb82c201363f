"""Roles as data: ``roles/<name>/`` holds a role's defaults, templates and files.

A role is a folder::

    roles/<name>/defaults.yml    every value a user may want to change (lowest precedence)
    roles/<name>/role.yml        user roles: files to place and units to enable
    roles/<name>/templates/*.j2  Jinja2 templates (StrictUndefined)

The built-in roles (preflight, runtime, service, verify) are planned by the engine; their
defaults are host variables (every key is a ``HostVars`` field). A user role is planned
from its ``role.yml`` alone: each file is rendered with the host's variables and the
role's own, written with its mode and owner, and restarts the unit it names when it
changes; the units it lists are enabled and kept running. Nothing in the engine changes
when a user adds one.

Precedence, lowest first: role defaults < group_vars/all < group < host < ``--set``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import jinja2
from pydantic import Field, field_validator

from vigil.desired.config import HostVars, Strict
from vigil.desired.render import BANNER
from vigil.desired.sandbox import Sandbox, render_template
from vigil.desired.yamlfile import parse_model, read_yaml
from vigil.errors import ConfigError

ROLES_DIR = Path(__file__).resolve().parents[1] / "roles"  # the built-in roles, shipped
BUILTIN: tuple[str, ...] = ("preflight", "runtime", "service", "verify")
# A role name is a folder name: lower-case words and dashes, never a path.
ROLE_NAME = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")
_VAR_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_SAFE = re.compile(r"^[^\x00-\x1f\x7f]*$")
_UNIT = r"^[A-Za-z0-9][A-Za-z0-9_.@-]*\.(service|timer|socket|path|target|mount)$"
_DEST = r"^/[^\x00-\x1f\x7f]+$"
UNIT_DIRS = ("/etc/systemd/system/", "/run/systemd/system/", "/usr/local/lib/systemd/system/")

Unit = Annotated[str, Field(pattern=_UNIT)]


class RoleFile(Strict):
    template: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                          description="a file in the role's templates/ folder")
    dest: str = Field(pattern=_DEST, description="absolute path on the host")
    mode: str = Field("0644", pattern=r"^0?[0-7]{3}$")
    owner: str = Field("root", pattern=r"^[a-z_][a-z0-9_-]*(:[a-z_][a-z0-9_-]*)?$")
    restart: Unit | None = Field(None, description="unit to restart when this file changes")

    @field_validator("dest")
    @classmethod
    def _plain(cls, v: str) -> str:
        # no `..`/`.`/empty component: the path says where the file goes, nothing else
        if any(part in ("", ".", "..") for part in v[1:].split("/")):
            raise ValueError(f"{v!r}: write a plain absolute path (no '..', '.', '//')")
        return v


class RoleSpec(Strict):
    files: list[RoleFile] = Field(default_factory=list)
    enable: list[Unit] = Field(default_factory=list, description="units enabled and running")

    @field_validator("files")
    @classmethod
    def _unique(cls, v: list[RoleFile]) -> list[RoleFile]:
        seen = [f.dest for f in v]
        dup = next((d for d in seen if seen.count(d) > 1), None)
        if dup:
            raise ValueError(f"{dup} is placed twice")
        return v


@dataclass(frozen=True)
class Role:
    name: str
    dir: Path
    defaults: Mapping[str, Any]
    spec: RoleSpec

    @property
    def builtin(self) -> bool:
        return self.name in BUILTIN

    @property
    def defaults_file(self) -> Path:
        return self.dir / "defaults.yml"


def check_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not ROLE_NAME.match(name):
        raise ConfigError(
            f"role name {name!r} is not valid", file=where, key="roles",
            fix="a role is a folder under roles/: lower-case letters, digits and dashes",
        )
    return name


def load_role(roles_dir: Path, name: str) -> Role:
    """One role folder, validated: defaults, role.yml and every template it names."""
    check_name(name, str(roles_dir))
    folder = roles_dir / name
    if not folder.is_dir():
        known = ", ".join(names(roles_dir)) or "(none)"
        raise ConfigError(f"no role named {name!r}", file=str(roles_dir), key="roles",
                          fix=f"use one of: {known}, or create roles/{name}/")
    dfile = folder / "defaults.yml"
    defaults = read_yaml(dfile) if dfile.is_file() else {}
    if defaults is None:
        defaults = {}
    if not isinstance(defaults, dict):
        raise ConfigError("expected a mapping of variables", file=str(dfile))
    for key in defaults:
        if name in BUILTIN and key not in HostVars.model_fields:
            raise ConfigError(f"unknown key {key!r}: a built-in role's defaults are host "
                              "variables", file=str(dfile), key=str(key))
        if name not in BUILTIN:
            if not isinstance(key, str) or not _VAR_NAME.match(key):
                raise ConfigError(f"variable name {key!r} is not valid", file=str(dfile),
                                  fix="lower-case letters, digits and '_'")
            if key in HostVars.model_fields:
                raise ConfigError(
                    f"{key!r} is a vigil host variable; a role may read it, not redefine it",
                    file=str(dfile), key=key, fix=f"rename it, e.g. {name.replace('-', '_')}_{key}",
                )
    sfile = folder / "role.yml"
    spec = parse_model(RoleSpec, read_yaml(sfile), str(sfile)) if sfile.is_file() else RoleSpec()
    for i, f in enumerate(spec.files):
        if not (folder / "templates" / f.template).is_file():
            raise ConfigError(f"template {f.template!r} not found in {folder / 'templates'}",
                              file=str(sfile), key=f"files.{i}.template")
    return Role(name, folder, dict(defaults), spec)


def names(roles_dir: Path) -> list[str]:
    if not roles_dir.is_dir():
        return []
    return sorted(p.name for p in roles_dir.iterdir() if p.is_dir() and ROLE_NAME.match(p.name))


RolesDirs = Path | Sequence[Path]


def search_path(roles_dir: RolesDirs) -> list[Path]:
    """The folders roles come from, first wins; the built-in roles always come last."""
    dirs = [roles_dir] if isinstance(roles_dir, Path) else list(roles_dir)
    return list(dict.fromkeys([*(Path(d) for d in dirs), ROLES_DIR]))


def load_all(roles_dir: RolesDirs) -> dict[str, Role]:
    """Every role on the search path (an ops repo's roles/, then the built-in ones): a
    role of an earlier folder replaces one of the same name. A replaced built-in role
    keeps its engine: it is loaded from the ops repo's folder only for the templates
    that folder has; see ``overlay``."""
    roles: dict[str, Role] = {}
    for folder in reversed(search_path(roles_dir)):
        for n in names(folder):
            role = load_role(folder, n)
            roles[n] = overlay(roles[n], role) if n in roles and n in BUILTIN else role
    missing = [n for n in BUILTIN if n not in roles]
    if missing:
        raise ConfigError(f"built-in role {missing[0]!r} is missing", file=str(ROLES_DIR),
                          fix="reinstall vigil: its package ships the built-in roles")
    owner: dict[str, str] = {}
    for role in roles.values():
        if role.builtin:
            continue
        for key in role.defaults:
            if key in owner:
                raise ConfigError(f"variable {key!r} is defined by roles {owner[key]} and "
                                  f"{role.name}", file=str(role.defaults_file), key=key)
            owner[key] = role.name
    return roles


def overlay(builtin: Role, user: Role) -> Role:
    """A built-in role as an ops repo's same-named folder amends it: its defaults.yml
    values over the built-in ones; its templates override by name (render's search path)."""
    return Role(builtin.name, user.dir, {**builtin.defaults, **user.defaults}, builtin.spec)


def selected(value: object, roles: Mapping[str, Role], where: str) -> tuple[str, ...]:
    """A host's ``roles:`` list, validated: known names, no repeats, runtime with service."""
    if not isinstance(value, list):
        raise ConfigError(f"roles must be a list of role names, got {value!r}", file=where,
                          key="roles", fix="e.g. roles: [preflight, runtime, service, verify]")
    chosen = [check_name(v, where) for v in value]
    for name in chosen:
        if name not in roles:
            known = ", ".join(roles) or "(none)"
            raise ConfigError(f"no role named {name!r}", file=where, key="roles",
                              fix=f"use one of: {known}, or create roles/{name}/")
    if len(set(chosen)) != len(chosen):
        raise ConfigError(f"roles lists a role twice: {chosen}", file=where, key="roles")
    if ("runtime" in chosen) != ("service" in chosen):
        raise ConfigError("roles runtime and service go together (the unit runs the "
                          "runtime's environment)", file=where, key="roles",
                          fix="list both, or neither for a host that only takes user roles")
    return tuple(chosen)


def check_value(key: str, value: object, default: object, where: str) -> None:
    """A user role's variable keeps its default's type (YAML has no other schema here)."""
    if isinstance(default, bool) or isinstance(value, bool):
        ok = isinstance(value, bool) and isinstance(default, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ConfigError(f"{key}: expected {type(default).__name__} like the role's default "
                          f"{default!r}, got {value!r}", file=where, key=key)
    # values land in unit files: a newline would start a new setting there
    if isinstance(value, str) and not _SAFE.match(value):
        raise ConfigError(f"{key}: the value contains a control character", file=where, key=key)


# -- rendering a user role ---------------------------------------------------------------


@dataclass(frozen=True)
class RenderedFile:
    role: str
    dest: str
    content: str
    mode: str  # octal without a leading 0, as the agent reports it: "644"
    owner: str
    restart: str | None

    @property
    def is_unit(self) -> bool:
        return self.dest.startswith(UNIT_DIRS)


@dataclass(frozen=True)
class RenderedRole:
    name: str
    files: tuple[RenderedFile, ...]
    enable: tuple[str, ...]

    @property
    def units(self) -> tuple[str, ...]:
        """Every unit whose state the plan needs."""
        named = [*self.enable, *(f.restart for f in self.files if f.restart)]
        return tuple(dict.fromkeys(named))


def render_role(role: Role, host_name: str, values: Mapping[str, Any]) -> RenderedRole:
    """Render one user role's files with the host's values (pure but for the templates)."""
    # a role may come from someone else's repository: its templates run sandboxed, bounded
    jenv = Sandbox(
        loader=jinja2.FileSystemLoader(str(role.dir / "templates")),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False,
    )
    context = {**values, "inventory_hostname": host_name, "role_name": role.name,
               "managed_banner": BANNER}
    files = []
    for f in role.spec.files:
        where = str(role.dir / "templates" / f.template)
        text = render_template(jenv, f.template, context, where,
                               undefined_fix="define it in the role's defaults.yml")
        files.append(RenderedFile(role.name, f.dest, text, f.mode.lstrip("0") or "0",
                                  f.owner, f.restart))
    return RenderedRole(role.name, tuple(files), tuple(role.spec.enable))
