"""Load the inventory directory and resolve each host's variables.

Layout (paths relative to the inventory directory)::

    hosts.yml              hosts (with inline vars) and groups
    hosts.d/*.yml          more hosts and groups, same shape (the lab writes one)
    group_vars/all.yml     variables of every host
    group_vars/<group>.yml variables of a group
    host_vars/<host>.yml   variables of one host
    models/<name>.yml      model profiles
    stacks/<name>.yml      pinned runtimes

Merge order, lowest first: role defaults (``roles/<name>/defaults.yml``) < all < group
(in the order groups are declared) < host file < inline host vars < ``--set`` flags.
Dicts merge key by key; everything else replaces. Relative paths in ``ssh_key`` and
``known_hosts`` resolve against the inventory directory so an inventory works from any
working directory.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vigil.desired import roles as roles_mod
from vigil.desired.config import NAME, HostsFile, HostVars, ModelProfile, Stack
from vigil.desired.yamlfile import M, parse_model, read_yaml, validation_error
from vigil.errors import ConfigError

__all__ = ["Inventory", "Resolved", "load", "parse_model", "read_yaml", "validation_error"]


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class Resolved:
    vars: HostVars
    role_vars: dict[str, Any]  # variables of user roles, by name
    user_roles: tuple[roles_mod.Role, ...]  # in the order the host lists them
    origin: dict[str, str]  # variable -> the file (or flag) its value came from

    def shown(self) -> list[tuple[str, object, str]]:
        """(variable, value, origin) for every variable, for `invoke render`."""
        values = {**self.vars.model_dump(), **self.role_vars}
        return [(k, values[k], self.origin.get(k, "vigil default")) for k in sorted(values)]


@dataclass(frozen=True)
class Inventory:
    root: Path
    hosts: dict[str, dict[str, Any]]  # inline vars per host
    groups: dict[str, list[str]]  # group -> hosts, declaration order
    group_vars: dict[str, dict[str, Any]] = field(default_factory=dict)
    host_files: dict[str, dict[str, Any]] = field(default_factory=dict)
    roles: dict[str, roles_mod.Role] = field(default_factory=dict)  # roles/<name>/

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
        return self.resolve(host, flags).vars

    def layers(self, host: str, flags: dict[str, Any] | None = None,
               ) -> list[tuple[str, dict[str, Any]]]:
        """The host's variable sources, lowest precedence first, without role defaults."""
        out = [("group_vars/all", self.group_vars.get("all", {}))]
        out += [(f"group {g}", self.group_vars.get(g, {})) for g in self.groups_of(host)]
        out += [(f"host_vars/{host}.yml", self.host_files.get(host, {})),
                (f"hosts: {host}", self.hosts[host]), ("--set", flags or {})]
        return [(where, data) for where, data in out if data]

    def resolve(self, host: str, flags: dict[str, Any] | None = None) -> Resolved:
        """The host's variables with where each came from: role defaults < group_vars/all
        < group < host < --set. Variables of user roles are kept apart from HostVars."""
        layers = self.layers(host, flags)
        merged: dict[str, Any] = {}
        for _, data in layers:
            merged = _merge(merged, data)
        chosen: tuple[str, ...] = ()
        if self.roles:
            chosen = roles_mod.selected(merged.get("roles", list(roles_mod.BUILTIN)),
                                        self.roles, f"variables of host {host}")
            used = [*roles_mod.BUILTIN, *(n for n in chosen if n not in roles_mod.BUILTIN)]
            layers = [(f"roles/{n}/defaults.yml", dict(self.roles[n].defaults))
                      for n in used] + layers
        origin: dict[str, str] = {}
        merged = {}
        for where, data in layers:
            for key in data:
                origin[key] = where
            merged = _merge(merged, data)
        if merged.get("host_key") == "accept-new" and not merged.get("known_hosts"):
            # trust on first use writes to the inventory's own file, never ~/.ssh
            merged["known_hosts"] = "known_hosts"
        for key in ("ssh_key", "known_hosts"):
            value = merged.get(key)
            if isinstance(value, str) and value and not value.startswith(("/", "~")):
                merged[key] = str(self.root / value)
        role_vars: dict[str, Any] = {}
        for name, role in self.roles.items():
            for key, default in role.defaults.items():
                if name in roles_mod.BUILTIN or key not in merged:
                    continue
                roles_mod.check_value(key, merged[key], default, origin[key])
                role_vars[key] = merged.pop(key)
        hv = parse_model(HostVars, merged, f"variables of host {host}")
        user_roles = tuple(self.roles[n] for n in chosen if n not in roles_mod.BUILTIN)
        return Resolved(hv, role_vars, user_roles, origin)

    def role_keys(self) -> set[str]:
        """Variables the user roles define (accepted in host/group files and --set)."""
        return {k for r in self.roles.values() if not r.builtin for k in r.defaults}

    # -- profiles and stacks --------------------------------------------------
    def _named(self, kind: str, model: type[M], name: str) -> M:
        if not NAME.match(name):
            # --model /some/path or ../../x would read a file outside the inventory
            raise ConfigError(
                f"{kind[:-1]} name {name[:120]!r} is not a name",
                file=str(self.root / kind),
                fix=f"name a file of {self.root / kind} without .yml: one of "
                f"{', '.join(self.names(kind)) or '(none)'}",
            )
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


def load(root: str | os.PathLike[str],
         roles_dir: str | os.PathLike[str] | roles_mod.RolesDirs = roles_mod.ROLES_DIR,
         ) -> Inventory:
    """Read and validate an inventory directory and the roles (no host is contacted)."""
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
    inv = Inventory(base, hosts, groups, file_group_vars, host_files,
                    roles_mod.load_all(
                        Path(roles_dir) if isinstance(roles_dir, str | os.PathLike)
                        else roles_dir))
    # Validate every file's keys now so a typo anywhere fails before any host is touched.
    extra = inv.role_keys()
    for gname, gvars in file_group_vars.items():
        _check_keys(gvars, f"{base / 'group_vars' / gname}.yml", extra)
    for hname, hvars in host_files.items():
        _check_keys(hvars, f"{base / 'host_vars' / hname}.yml", extra)
    for hname, inline in hosts.items():
        _check_keys(inline, f"{hosts_file}: hosts.{hname}", extra)
    return inv


def _as_vars(data: Any, path: Path) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping of variables, got {type(data).__name__}",
                          file=str(path))
    return data


def _check_keys(data: dict[str, Any], where: str, extra: set[str] | None = None) -> None:
    known = set(HostVars.model_fields) | (extra or set())
    unknown = sorted(set(data) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        raise ConfigError(
            f"unknown key {unknown[0]!r}" + (f" - did you mean {close[0]!r}?" if close else ""),
            file=where,
            fix="known keys: " + ", ".join(sorted(known)),
        )
