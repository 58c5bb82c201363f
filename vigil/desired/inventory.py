"""Load the inventory directory and resolve each host's variables.

Layout (paths relative to the inventory directory)::

    hosts.yml              hosts (with inline vars) and groups
    hosts.d/*.yml          more hosts and groups, same shape (the lab writes one)
    group_vars/all.yml     variables of every host
    group_vars/<group>.yml variables of a group
    host_vars/<host>.yml   variables of one host
    models/<name>.yml      model profiles
    stacks/<name>.yml      pinned runtimes

Merge order, lowest first: all < group (in the order groups are declared) < host
file < inline host vars < ``--set`` flags. Dicts merge key by key; everything else
replaces. Relative paths in ``ssh_key`` and ``known_hosts`` resolve against the
inventory directory so an inventory works from any working directory.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from vigil.desired.config import HostsFile, HostVars, ModelProfile, Stack
from vigil.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def read_yaml(path: Path) -> Any:
    """Parse one YAML file; a syntax error names the file, line and column."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(path)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(
            f"{where}invalid YAML ({problem})", file=str(path), fix="correct the YAML syntax"
        ) from None


def validation_error(exc: ValidationError, file: str) -> ConfigError:
    """Turn pydantic's report into one message naming file, key and expectation."""
    lines: list[str] = []
    first_key: str | None = None
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        first_key = first_key or key
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (a typo?)"
        elif err["type"] == "missing":
            msg = "required key is missing"
        value = err.get("input")
        quiet = err["type"] in ("missing", "extra_forbidden", "value_error") or not key
        shown = "" if quiet else f" (got {value!r})"
        lines.append(f"{key}: {msg}{shown}" if key else f"{msg}{shown}")
    message = lines[0] if len(lines) == 1 else "\n    " + "\n    ".join(lines)
    return ConfigError(message, file=file)


def parse_model(model: type[M], data: object, file: str, **extra: object) -> M:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping of keys, got {type(data).__name__}", file=file
        )
    try:
        return model.model_validate({**data, **extra})
    except ValidationError as exc:
        raise validation_error(exc, file) from None


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class Inventory:
    root: Path
    hosts: dict[str, dict[str, Any]]  # inline vars per host
    groups: dict[str, list[str]]  # group -> hosts, declaration order
    group_vars: dict[str, dict[str, Any]] = field(default_factory=dict)
    host_files: dict[str, dict[str, Any]] = field(default_factory=dict)

    # -- selection -----------------------------------------------------------
    def select(self, pattern: str) -> list[str]:
        """Hosts named by a comma list of host names, group names or ``all``."""
        chosen: list[str] = []
        for item in (p.strip() for p in pattern.split(",")):
            if not item:
                continue
            if item == "all":
                names = list(self.hosts)
            elif item in self.groups:
                names = self.groups[item]
            elif item in self.hosts:
                names = [item]
            else:
                known = ", ".join(sorted([*self.hosts, *self.groups])) or "(none)"
                raise ConfigError(
                    f"no host or group named {item!r}",
                    file=str(self.root / "hosts.yml"),
                    fix=f"use one of: {known}, or all",
                )
            chosen.extend(n for n in names if n not in chosen)
        if not chosen:
            raise ConfigError(f"--hosts {pattern!r} selects no host", fix="name a host or group")
        return chosen

    def groups_of(self, host: str) -> list[str]:
        return [g for g, members in self.groups.items() if host in members]

    # -- variables ------------------------------------------------------------
    def host_vars(self, host: str, flags: dict[str, Any] | None = None) -> HostVars:
        merged: dict[str, Any] = dict(self.group_vars.get("all", {}))
        for group in self.groups_of(host):
            merged = _merge(merged, self.group_vars.get(group, {}))
        merged = _merge(merged, self.host_files.get(host, {}))
        merged = _merge(merged, self.hosts[host])
        merged = _merge(merged, flags or {})
        for key in ("ssh_key", "known_hosts"):
            value = merged.get(key)
            if isinstance(value, str) and value and not value.startswith(("/", "~")):
                merged[key] = str(self.root / value)
        return parse_model(HostVars, merged, f"variables of host {host}")

    # -- profiles and stacks --------------------------------------------------
    def _named(self, kind: str, model: type[M], name: str) -> M:
        path = self.root / kind / f"{name}.yml"
        if not path.is_file():
            known = ", ".join(self.names(kind)) or "(none)"
            raise ConfigError(
                f"unknown {kind[:-1]} {name!r}",
                file=str(path.parent),
                fix=f"use one of: {known}",
            )
        data = read_yaml(path)
        if isinstance(data, dict) and data.get("name", name) != name:
            raise ConfigError(
                f"name {data['name']!r} does not match the file name {name!r}",
                file=str(path),
                key="name",
            )
        extra = {} if isinstance(data, dict) and "name" in data else {"name": name}
        return parse_model(model, data, str(path), **extra)

    def names(self, kind: str) -> list[str]:
        return sorted(p.stem for p in (self.root / kind).glob("*.yml"))

    def profile(self, name: str, overrides: dict[str, Any] | None = None) -> ModelProfile:
        base = self._named("models", ModelProfile, name)
        if not overrides:
            return base
        merged = _merge(base.model_dump(), overrides)
        return parse_model(ModelProfile, merged, f"profile {name} with host overrides")

    def stack(self, name: str) -> Stack:
        return self._named("stacks", Stack, name)


def load(root: str | os.PathLike[str]) -> Inventory:
    """Read and validate an inventory directory (no host is contacted)."""
    base = Path(root)
    hosts_file = base / "hosts.yml"
    if not hosts_file.is_file():
        raise ConfigError(
            "inventory has no hosts.yml",
            file=str(base),
            fix="point --inventory (or vigil.inventory in invoke.yaml) at an inventory directory",
        )
    hosts: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[str]] = {}
    group_vars: dict[str, dict[str, Any]] = {}
    for path in [hosts_file, *sorted((base / "hosts.d").glob("*.yml"))]:
        parsed = parse_model(HostsFile, read_yaml(path), str(path))
        for name, inline in parsed.hosts.items():
            if name in hosts:
                raise ConfigError(f"host {name!r} is declared twice", file=str(path))
            hosts[name] = dict(inline or {})
        for gname, group in parsed.groups.items():
            members = groups.setdefault(gname, [])
            for member in group.hosts:
                if member not in hosts:
                    raise ConfigError(
                        f"group {gname!r} lists unknown host {member!r}",
                        file=str(path),
                        key=f"groups.{gname}.hosts",
                        fix="declare the host under hosts: first",
                    )
                if member not in members:
                    members.append(member)
            if group.vars:
                group_vars[gname] = _merge(group_vars.get(gname, {}), group.vars)
    for name in [*hosts, *groups]:
        if name == "all":
            raise ConfigError("'all' is reserved for every host", file=str(hosts_file))
    file_group_vars: dict[str, dict[str, Any]] = {}
    for path in sorted((base / "group_vars").glob("*.yml")):
        if path.stem != "all" and path.stem not in groups:
            raise ConfigError(
                f"group_vars for unknown group {path.stem!r}",
                file=str(path),
                fix=f"declare group {path.stem!r} in hosts.yml or rename the file",
            )
        file_group_vars[path.stem] = _as_vars(read_yaml(path), path)
    # inline group vars win over group_vars files
    for gname, gvars in group_vars.items():
        file_group_vars[gname] = _merge(file_group_vars.get(gname, {}), gvars)
    host_files: dict[str, dict[str, Any]] = {}
    for path in sorted((base / "host_vars").glob("*.yml")):
        if path.stem not in hosts:
            raise ConfigError(
                f"host_vars for unknown host {path.stem!r}",
                file=str(path),
                fix=f"declare host {path.stem!r} in hosts.yml or rename the file",
            )
        host_files[path.stem] = _as_vars(read_yaml(path), path)
    inv = Inventory(base, hosts, groups, file_group_vars, host_files)
    # Validate every file's keys now so a typo anywhere fails before any host is touched.
    for gname, gvars in file_group_vars.items():
        _check_keys(gvars, f"{base / 'group_vars' / gname}.yml")
    for hname, hvars in host_files.items():
        _check_keys(hvars, f"{base / 'host_vars' / hname}.yml")
    for hname, inline in hosts.items():
        _check_keys(inline, f"{hosts_file}: hosts.{hname}")
    return inv


def _as_vars(data: Any, path: Path) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping of variables, got {type(data).__name__}",
                          file=str(path))
    return data


def _check_keys(data: dict[str, Any], where: str) -> None:
    unknown = sorted(set(data) - set(HostVars.model_fields))
    if unknown:
        close = difflib.get_close_matches(unknown[0], HostVars.model_fields, n=1)
        raise ConfigError(
            f"unknown key {unknown[0]!r}" + (f" - did you mean {close[0]!r}?" if close else ""),
            file=where,
            fix="known keys: " + ", ".join(sorted(HostVars.model_fields)),
        )
