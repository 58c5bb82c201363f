"""Load the inventory directory and resolve each host's variables.

Layout (paths relative to the inventory directory; ``.yml`` or ``.yaml`` alike)::

    hosts.yml              hosts and groups: vigil's hosts:/groups:, or Ansible's YAML
                           (all:/children:/hosts:/vars:); or hosts.ini / hosts (INI)
    hosts.d/*              more hosts files of either kind (the lab writes one)
    group_vars/all.yml     variables of every host
    group_vars/<group>.yml variables of a group; or a folder group_vars/<group>/ whose
                           files merge in name order
    host_vars/<host>.yml   variables of one host (or a folder, as above)
    models/<name>.yml      model profiles
    stacks/<name>.yml      pinned runtimes
    node_groups/<name>.yml multi-node groups (vigil.desired.groups)

``--inventory`` may also name one hosts file (``inventory.ini``): its folder is then the
inventory. Two files for one thing (hosts.yml and hosts.yaml, group_vars/g.yml and
group_vars/g/) are an error; a file vigil does not read is a warning naming it (hidden
files and Ansible's ignored extensions, ``.md``, ``.bak``, ``~`` …, are passed over).

Merge order, lowest first, as Ansible's: role defaults (``roles/<name>/defaults.yml``)
< the hosts file's variables of all < of the host's groups < ``group_vars/all`` <
``group_vars/<group>`` (groups in declaration order; Ansible's by depth, priority, name)
< the hosts file's inline host variables < ``host_vars/<host>`` < ``--set`` flags. Dicts
merge key by key, and each key keeps the file it came from; everything else replaces.
Ansible's ``ansible_host``, ``ansible_user``, ``ansible_port``, ``ansible_become``,
``ansible_ssh_private_key_file`` and ``ansible_connection`` are vigil's address,
ssh_user, ssh_port, sudo, ssh_key and connection. Relative paths in ``ssh_key`` and
``known_hosts`` resolve against the inventory directory so an inventory works from any
working directory.
"""

from __future__ import annotations

import fnmatch
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vigil.desired import ansible, sshconfig, vault
from vigil.desired import lock as lockfile
from vigil.desired import roles as roles_mod
from vigil.desired.ansible import Parsed
from vigil.desired.config import (
    NAME,
    WATCHED_PHASES,
    HostsFile,
    HostVars,
    ModelProfile,
    check_address,
    check_name,
    phase_error,
    unknown_phase,
)
from vigil.desired.inputs import read_input
from vigil.desired.stacks import Stack
from vigil.desired.yamlfile import M, parse_model, parse_traced, read_yaml, validation_error
from vigil.errors import ConfigError

__all__ = ["Inventory", "Layer", "Resolved", "load", "merge", "parse_model", "read_yaml",
           "validation_error"]

HOSTS_FILES = ("hosts.yml", "hosts.yaml", "hosts.ini", "hosts")
_YAML = (".yml", ".yaml")
_VARS = (*_YAML, ".json")  # Ansible's vars files; YAML reads JSON
# Ansible's inventory_ignore_extensions: never inventory, never warned about
_IGNORED = (".md", ".txt", ".rst", ".bak", ".orig", ".swp", ".retry", ".pyc", ".pyo",
            ".rpm", "~")
_KNOWN_DIRS = {"hosts.d", "group_vars", "host_vars", "models", "stacks", "node_groups"}
_BOOLS = frozenset(k for k, f in HostVars.model_fields.items() if f.annotation is bool)
_TERM = re.compile(r"(?:[^:\[\]]|\[[^\]]*\])+")
# where an address no file gave came from, as render shows it
ADDRESS_NAME = "the inventory name (ssh config's HostName applies)"
ADDRESS_LOCAL = "connection: local (this machine)"
CLOSE = 0.8  # a foreign key this close to a vigil key is a typo, not a playbook's variable


def split_pattern(pattern: str) -> list[str]:
    """A --hosts pattern's terms: split on ',' and on ':' outside brackets (Ansible's
    split_host_pattern), so 'g:!h' is two terms and 'h100-[01:04]' one."""
    terms: list[str] = []
    for part in pattern.split(","):
        if part.count("[") != part.count("]"):
            raise ConfigError(f"--hosts {pattern!r}: a bracket without its pair",
                              fix="write a range as h100-[01:04]")
        terms += [t.strip() for t in _TERM.findall(part)]
    return [t for t in terms if t]


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _merge_tracked(base: dict[str, Any], top: dict[str, Any], where: str,
                   origin: dict[str, str], prefix: str = "") -> dict[str, Any]:
    """merge that records where each key (a dict's keys too, dotted) came from."""
    out = dict(base)
    for key, value in top.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge_tracked(out[key], value, where, origin, f"{path}.")
        else:
            for stale in [k for k in origin if k.startswith(f"{path}.")]:
                del origin[stale]
            out[key] = value
            if isinstance(value, dict):
                _merge_tracked({}, value, where, origin, f"{path}.")
        origin[path] = where
    return out


@dataclass(frozen=True)
class Layer:
    """One source of variables: ``where`` is what render shows ("group_vars/all.yml",
    "hosts.ini: host h1"), ``file`` the full path and ``place`` the spot in it, for
    errors."""

    where: str
    data: dict[str, Any]
    file: str
    place: str | None = None


@dataclass(frozen=True)
class Resolved:
    vars: HostVars
    role_vars: dict[str, Any]  # variables of user roles, by name
    user_roles: tuple[roles_mod.Role, ...]  # in the order the host lists them
    # variable -> the file (or flag) its value came from; a dict's keys dotted (env.A)
    origin: dict[str, str]
    ssh: sshconfig.SshConfig | None = None  # what the user's ssh config says (ssh hosts)

    def shown(self) -> list[tuple[str, object, str]]:
        """(variable, value, origin) for every variable, for `invoke render`."""
        values = {**self.vars.model_dump(), **self.role_vars}
        return [(k, values[k], self.origin.get(k, "vigil default")) for k in sorted(values)]


class Notes:
    """Warnings found while hosts are resolved (what ssh config sets that vigil does
    not follow), each said once per run; ``sink`` is the task's stderr."""

    def __init__(self) -> None:
        self.sink: Callable[[str], None] | None = None
        self.seen: set[str] = set()
        self._lock = threading.Lock()

    def once(self, key: str, line: str) -> None:
        with self._lock:
            if key in self.seen:
                return
            self.seen.add(key)
        if self.sink is not None:
            self.sink(line)


@dataclass(frozen=True)
class Inventory:
    root: Path
    hosts: dict[str, dict[str, Any]]  # inline vars per host (merged over its hosts files)
    groups: dict[str, list[str]]  # group -> hosts, in precedence order
    group_inline: dict[str, list[Layer]] = field(default_factory=dict)  # "all" included
    group_files: dict[str, list[Layer]] = field(default_factory=dict)  # group_vars/
    host_inline: dict[str, list[Layer]] = field(default_factory=dict)
    host_files: dict[str, list[Layer]] = field(default_factory=dict)  # host_vars/
    roles: dict[str, roles_mod.Role] = field(default_factory=dict)  # roles/<name>/
    hosts_file: Path | None = None  # the main hosts file, named by errors
    warnings: tuple[str, ...] = ()  # files and variables vigil does not read
    ansible: bool = False  # a hosts file is Ansible's: foreign variables are warnings
    notes: Notes = field(default_factory=Notes, compare=False, repr=False)

    # -- selection -----------------------------------------------------------
    def select(self, pattern: str) -> list[str]:
        """Hosts named by a pattern, as Ansible's ``--limit``: names of hosts or groups,
        ``all`` or ``*``, globs (``h100-*``), ``~regex``, separated by ``,`` or ``:``;
        ``&g`` keeps only g's hosts, ``!g`` removes them (with only those, from all)."""
        items = split_pattern(pattern)
        if not items:
            raise ConfigError("--hosts is empty", fix="name hosts or groups, or all")
        plain = [p for p in items if p[0] not in "&!"] or ["all"]
        chosen: list[str] = []
        for item in plain:
            chosen.extend(h for h in self._match(item, pattern) if h not in chosen)
        for item in (p[1:] for p in items if p[0] == "&"):
            keep = set(self._match(item, pattern))
            chosen = [h for h in chosen if h in keep]
        for item in (p[1:] for p in items if p[0] == "!"):
            drop = set(self._match(item, pattern))
            chosen = [h for h in chosen if h not in drop]
        if not chosen:
            raise ConfigError(f"--hosts {pattern!r} selects no host",
                              fix="name a host or group; 'g:!h' is g without h, "
                              "'g:&k' the hosts of both")
        return chosen

    def refuse_controller(self, pattern: str, task: str,
                          flags: dict[str, Any] | None = None) -> None:
        """A task that changes hosts reaches this machine (``connection: local``) only
        where ``--hosts`` names that host itself: ``all``, a group, a glob or a range that
        happens to hold it (an Ansible inventory's ``localhost``) is refused aloud."""
        named = {t for t in split_pattern(pattern) if t[0] not in "&!"}
        for name in self.select(pattern):
            if name in named:
                continue
            resolved = self.resolve(name, flags)
            if resolved.vars.connection != "local":
                continue
            where = resolved.origin.get("connection", "")
            raise ConfigError(
                f"--hosts {pattern!r} selects {name}, which is this machine (connection: "
                f"local, from {where}): {task} would change the controller",
                file=self._hosts_path(), key=f"{name}.connection",
                fix=f"to mean it, name the host: --hosts {name}; else leave it out: "
                f"--hosts '{pattern}:!{name}' (or give it an address to reach over ssh)")

    def check_inputs(self, pattern: str, flags: dict[str, Any] | None = None) -> list[str]:
        """The selected hosts, once every one's variables resolve and its files on this
        machine (ssh_key, a strict known_hosts) exist: a bad input of the eighth host is
        refused before the first is contacted (issue 29.12)."""
        names = self.select(pattern)
        for name in names:
            resolved = self.resolve(name, flags)
            local_inputs(name, resolved.vars, resolved.origin)
        return names

    def _match(self, item: str, pattern: str) -> list[str]:
        if item in ("all", "*"):
            return list(self.hosts)
        if item in self.groups:
            return self.groups[item]
        if item in self.hosts:
            return [item]
        if not item.startswith("~") and ansible.RANGE.search(item):  # h100-[01:04]
            names = ansible.hosts_of(item, "--hosts", item)
            missing = [n for n in names if n not in self.hosts]
            if missing:
                raise ConfigError(f"--hosts {item!r}: no host named {missing[0]!r}",
                                  file=self._hosts_path(), fix=self._known_names())
            return names
        if item.startswith("~") or any(c in item for c in "*?["):
            try:
                rx = re.compile(item[1:]) if item.startswith("~") else \
                    re.compile(fnmatch.translate(item))
            except re.error as exc:
                raise ConfigError(f"--hosts {item!r}: not a regular expression ({exc})",
                                  fix="e.g. '~h100-0[1-4]'") from None
            found: list[str] = []
            for g in (g for g in self.groups if rx.match(g)):
                found.extend(h for h in self.groups[g] if h not in found)
            found.extend(h for h in self.hosts if rx.match(h) and h not in found)
            if found:
                return found
            raise ConfigError(f"--hosts {pattern!r}: {item!r} matches no host or group",
                              file=self._hosts_path(), fix=self._known_names())
        known = [*self.hosts, *self.groups]
        raise ConfigError(f"no host or group named {item!r}"
                          f"{ansible.did_you_mean(item, set(known))}",
                          file=self._hosts_path(), fix=self._known_names())

    def _hosts_path(self) -> str:
        return str(self.hosts_file or self.root / "hosts.yml")

    def _known_names(self) -> str:
        names = sorted([*self.hosts, *self.groups])
        shown = ", ".join(names[:30]) + (f" (and {len(names) - 30} more)" if len(names) > 30
                                          else "")
        return f"use one of: {shown or '(none)'}, or all; patterns as Ansible's: g:!h, g:&k, h*"

    def groups_of(self, host: str) -> list[str]:
        return [g for g, members in self.groups.items() if host in members]

    # -- variables ------------------------------------------------------------
    def host_vars(self, host: str, flags: dict[str, Any] | None = None) -> HostVars:
        return self.resolve(host, flags).vars

    def sources(self, host: str, flags: dict[str, Any] | None = None) -> list[Layer]:
        """The host's variable sources, lowest precedence first, without role defaults:
        Ansible's order (inventory file < group_vars/ < inline host < host_vars/)."""
        gs = self.groups_of(host)
        out = [*self.group_inline.get("all", []),
               *(layer for g in gs for layer in self.group_inline.get(g, [])),
               *self.group_files.get("all", []),
               *(layer for g in gs for layer in self.group_files.get(g, [])),
               *self.host_inline.get(host, []), *self.host_files.get(host, [])]
        if flags:
            out.append(Layer("--set", flags, "--set"))
        return [layer for layer in out if layer.data]

    def layers(self, host: str, flags: dict[str, Any] | None = None,
               ) -> list[tuple[str, dict[str, Any]]]:
        """The host's variable sources, lowest precedence first, without role defaults."""
        return [(layer.where, layer.data) for layer in self.sources(host, flags)]

    def resolve(self, host: str, flags: dict[str, Any] | None = None) -> Resolved:
        """The host's variables with where each came from (see the module's merge order).
        Variables of user roles are kept apart from HostVars."""
        layers = self.sources(host, flags)
        merged: dict[str, Any] = {}
        for layer in layers:
            merged = merge(merged, layer.data)
        chosen: tuple[str, ...] = ()
        if self.roles:
            chosen = roles_mod.selected(merged.get("roles", list(roles_mod.BUILTIN)),
                                        self.roles, f"variables of host {host}")
            used = [*roles_mod.BUILTIN, *(n for n in chosen if n not in roles_mod.BUILTIN)]
            layers = [Layer(f"roles/{n}/defaults.yml", dict(self.roles[n].defaults),
                            str(self.roles[n].defaults_file)) for n in used] + layers
        files = {layer.where: layer.file for layer in layers}
        origin: dict[str, str] = {}
        merged = {}
        for layer in layers:
            merged = _merge_tracked(merged, layer.data, layer.where, origin)
        for key in ("phase_budget_s", "stall_window_s"):
            bad = unknown_phase(merged.get(key))
            if bad is not None:  # every task refuses it, naming the file that wrote it
                where = origin.get(f"{key}.{bad}", origin.get(key, ""))
                raise ConfigError(phase_error(bad), file=files.get(where, where), key=key,
                                  fix="use one of: " + ", ".join(WATCHED_PHASES))
        if "address" not in merged:
            # ssh's and Ansible's rule: a host with no address is reached at its name (so
            # ~/.ssh/config's HostName for it applies); loopback only when asked for
            local = merged.get("connection") == "local"
            merged["address"] = "127.0.0.1" if local else host
            origin["address"] = ADDRESS_LOCAL if local else ADDRESS_NAME
        ssh = None if merged.get("connection") == "local" else \
            self._ssh_config(host, merged, origin)
        if not merged.get("known_hosts") and (
                merged.get("host_key") == "accept-new" or (self.root / "known_hosts").is_file()):
            # trust on first use writes to the inventory's own file, never ~/.ssh; and a
            # strict run reads what an accept-new run recorded there (issue 22.8)
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
        hv = parse_traced(HostVars, merged, f"variables of host {host}",
                          {k: files.get(v, v) for k, v in origin.items()})
        user_roles = tuple(self.roles[n] for n in chosen if n not in roles_mod.BUILTIN)
        return Resolved(hv, role_vars, user_roles, origin, ssh)

    def _ssh_config(self, host: str, merged: dict[str, Any],
                    origin: dict[str, str]) -> sshconfig.SshConfig | None:
        """The user's ssh config for the host's address, as OpenSSH resolves it: its
        User, Port and ConnectTimeout fill what the inventory does not set (shown "from
        ssh config"); each option vigil does not follow is one warning per run."""
        address = merged.get("address")
        if not isinstance(address, str):
            return None  # HostVars refuses it, naming the file
        try:
            check_address(address)
        except ValueError:
            return None
        found = sshconfig.lookup(address)
        for option, key, kind in (("user", "ssh_user", str), ("port", "ssh_port", int),
                                  ("connecttimeout", "connect_timeout_s", float)):
            value = found.get(option)
            where = origin.get(key, "")
            by_default = where.startswith("roles/") and where.endswith("/defaults.yml")
            if (key in merged and not by_default) or value is None or value == "none":
                continue  # the inventory's own value wins; a role's default does not
            try:
                merged[key] = kind(value)  # ssh -G checked it; paramiko's read did not
            except ValueError:
                raise ConfigError(f"ssh config sets {option} {value!r} for {address}",
                                  key=f"host {host}", fix=f"fix {option} in the ssh config "
                                  f"({found.via.removeprefix('from ssh config ')})") from None
            origin[key] = found.via
        for note in found.notes:
            self.notes.once(note, note)
        for option, value, why in found.overridden():
            self.notes.once(f"ssh:{option}", f"ssh config sets {option} {value} for "
                            f"{address} (host {host}, {found.via.removeprefix('from ')}): "
                            f"not followed; {why}")
        return found

    def role_keys(self) -> set[str]:
        """Variables the user roles define (accepted in host/group files and --set)."""
        return {k for r in self.roles.values() if not r.builtin for k in r.defaults}

    # -- profiles and stacks --------------------------------------------------
    def _file(self, kind: str, name: str) -> Path | None:
        found = [p for p in (self.root / kind / f"{name}{ext}" for ext in _YAML) if p.is_file()]
        if len(found) > 1:
            raise ConfigError(f"{kind[:-1]} {name!r} is given twice: {found[0].name} and "
                              f"{found[1].name}", file=str(found[0].parent),
                              fix="keep one of the two files")
        return found[0] if found else None

    def _named(self, kind: str, model: type[M], name: str) -> M:
        if not NAME.fullmatch(name):
            # --model /some/path or ../../x would read a file outside the inventory
            raise ConfigError(
                f"{kind[:-1]} name {name[:120]!r} is not a name",
                file=str(self.root / kind),
                fix=f"name a file of {self.root / kind} without .yml: one of "
                f"{', '.join(self.names(kind)) or '(none)'}",
            )
        path = self._file(kind, name)
        if path is None:
            known = self.names(kind)
            raise ConfigError(
                f"unknown {kind[:-1]} {name!r}{ansible.did_you_mean(name, set(known))}",
                file=str(self.root / kind),
                fix=f"use one of: {', '.join(known) or '(none)'}",
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
        return sorted({p.stem for ext in _YAML for p in (self.root / kind).glob(f"*{ext}")})

    def profile(self, name: str, overrides: dict[str, Any] | None = None) -> ModelProfile:
        base = self._named("models", ModelProfile, name)
        if not overrides:
            return base
        merged = merge(base.model_dump(), overrides)
        return parse_model(ModelProfile, merged, f"profile {name} with host overrides")

    def stack(self, name: str, *, with_lock: bool = True) -> Stack:
        """The stack and, when ``stacks/<name>.lock`` exists, its lock: checked here, so a
        lock that no longer matches the stack's pins fails before any host is touched
        (``with_lock=False``: the stack alone, to lock it again)."""
        path = self._file("stacks", name) if NAME.fullmatch(name) else None
        if path is not None:
            data = read_yaml(path)
            if isinstance(data, dict) and "lock" in data:
                raise ConfigError("`lock` is not a setting: the lock is the file "
                                  f"stacks/{name}.lock", file=str(path), key="lock",
                                  fix=f"remove it; lock the stack with invoke stack.lock "
                                  f"--stack {name}")
        stack = self._named("stacks", Stack, name)
        lock_path = self.root / "stacks" / f"{name}.lock"
        if not with_lock or not os.path.lexists(lock_path):
            return stack
        if not lock_path.is_file():  # never an unlocked install in its place, silently
            raise ConfigError("the stack's lock is not a regular file", file=str(lock_path),
                              fix=f"remove it, then lock the stack again: vigil stack.lock "
                              f"--stack {name}")
        text = read_input(lock_path)
        parsed = lockfile.parse(text, str(lock_path))
        stale = lockfile.stale_pins(parsed, stack.packages)
        if stale:
            raise ConfigError(
                f"the lock no longer matches the stack's pins: {'; '.join(stale)}",
                file=str(lock_path), fix=f"re-lock it: invoke stack.lock --stack {name}")
        return stack.model_copy(update={"lock": text})


# -- loading ------------------------------------------------------------------------------


@dataclass
class _Reader:
    """What load gathers, file by file."""

    base: Path
    main: Path  # the hosts file
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    group_inline: dict[str, list[Layer]] = field(default_factory=dict)
    host_inline: dict[str, list[Layer]] = field(default_factory=dict)
    declared: set[str] = field(default_factory=set)  # hosts of vigil's own format
    warnings: list[str] = field(default_factory=list)
    ansible: bool = False

    def rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.base))
        except ValueError:
            return str(path)

    def read_hosts_file(self, path: Path) -> None:
        rel = self.rel(path)
        if path.suffix in _YAML:
            data = read_yaml(path)
            if ansible.is_ansible_yaml(data):
                self.ansible = True
                self.add_ansible(ansible.parse_yaml(data, str(path), rel), path)
            else:
                self.add_vigil(data, path, rel)
        else:
            text = read_input(path)
            self.ansible = True
            self.add_ansible(ansible.parse_ini(text, str(path), rel), path)

    def _host(self, name: str, path: Path) -> None:
        _name("host", name, path)
        if name == "all":
            raise ConfigError("'all' is reserved for every host", file=str(path))
        self.hosts.setdefault(name, {})

    def add_vigil(self, data: Any, path: Path, rel: str) -> None:
        data = _expand_vigil(data, str(path))
        parsed = parse_model(HostsFile, data, str(path))
        for name, inline in parsed.hosts.items():
            if name in self.hosts:
                raise ConfigError(f"host {name!r} is declared twice", file=str(path),
                                  key=f"hosts.{name}")
            self._host(name, path)
            self.declared.add(name)
            self.hosts[name] = dict(inline or {})
            if inline:
                self.host_inline.setdefault(name, []).append(
                    Layer(f"{rel}: hosts.{name}", dict(inline), str(path), f"hosts.{name}"))
        for gname, group in parsed.groups.items():
            if gname == "all":
                raise ConfigError("'all' is reserved for every host", file=str(path),
                                  key="groups.all", fix="put variables of every host in "
                                  "group_vars/all.yml")
            members = self.groups.setdefault(gname, [])
            for member in group.hosts:
                if member not in self.hosts:
                    raise ConfigError(
                        f"group {gname!r} lists unknown host {member!r}"
                        f"{ansible.did_you_mean(member, set(self.hosts))}",
                        file=str(path),
                        key=f"groups.{gname}.hosts",
                        fix="declare the host under hosts: first",
                    )
                if member not in members:
                    members.append(member)
            if group.vars:
                self.group_inline.setdefault(gname, []).append(
                    Layer(f"{rel}: groups.{gname}.vars", dict(group.vars), str(path),
                          f"groups.{gname}.vars"))

    def add_ansible(self, parsed: Parsed, path: Path) -> None:
        for name, inline in parsed.hosts.items():
            if name in self.declared:
                raise ConfigError(f"host {name!r} is declared twice (also in vigil's "
                                  "hosts: format)", file=str(path))
            self._host(name, path)
            for where, data in inline:
                self.hosts[name] = {**self.hosts[name], **data}
                self.host_inline.setdefault(name, []).append(
                    Layer(where, data, str(path), where.split(": ", 1)[1]))
        for gname, members in parsed.groups.items():
            _name("group", gname, path)
            have = self.groups.setdefault(gname, [])
            seen = set(have)  # a set beside the list: a list's `in` made 60k hosts quadratic
            for h in members:
                if h not in seen:
                    seen.add(h)
                    have.append(h)
        for gname, (where, data) in parsed.group_vars.items():
            self.group_inline.setdefault(gname, []).append(
                Layer(where, data, str(path), where.split(": ", 1)[1]))
        for where, data in parsed.all_vars:
            self.group_inline.setdefault("all", []).append(
                Layer(where, data, str(path), "group all"))


def local_inputs(name: str, hv: HostVars, origin: dict[str, str] | None = None) -> None:
    """Refuse what a host's connection would need from this machine and cannot have: its
    ssh_key file, the known_hosts file a strict check reads (accept-new creates it)."""
    if hv.connection == "local":
        return
    where = origin or {}
    if hv.ssh_key and not Path(hv.ssh_key).expanduser().is_file():
        raise ConfigError(f"host {name}: ssh_key {Path(hv.ssh_key).expanduser()} does not "
                          "exist", file=where.get("ssh_key"), key="ssh_key",
                          fix="point ssh_key at the deploy key's private key file on this "
                          "machine (a relative path is the inventory folder's)")
    if hv.known_hosts and hv.host_key == "strict" \
            and not Path(hv.known_hosts).expanduser().is_file():
        raise ConfigError(f"host {name}: known_hosts file "
                          f"{Path(hv.known_hosts).expanduser()} does not exist",
                          file=where.get("known_hosts"), key="known_hosts",
                          fix="create it (ssh-keyscan -H HOST >> FILE, then check the "
                          "fingerprint) or fix known_hosts in the inventory")


def _name(kind: str, name: str, path: Path) -> None:
    try:
        check_name(kind, name)  # a host's name names its trace and history files
    except ValueError as exc:
        raise ConfigError(str(exc), file=str(path)) from None


def _expand_vigil(data: Any, file: str) -> Any:
    """Host ranges in vigil's own format too: hosts: keys and groups' host lists."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    hosts = data.get("hosts")
    if isinstance(hosts, dict) and any(isinstance(k, str) and "[" in k for k in hosts):
        expanded: dict[Any, Any] = {}
        for key, inline in hosts.items():
            names = ansible.hosts_of(key, file, f"hosts.{key}") if isinstance(key, str) \
                else [key]
            for name in names:
                if name in expanded:
                    raise ConfigError(f"host {name!r} is declared twice", file=file,
                                      key=f"hosts.{key}")
                expanded[name] = inline
        out["hosts"] = expanded
    groups = data.get("groups")
    if isinstance(groups, dict):
        fixed: dict[Any, Any] = {}
        for gname, group in groups.items():
            if isinstance(group, dict) and isinstance(group.get("hosts"), list):
                members: list[Any] = []
                for item in group["hosts"]:
                    members += ansible.hosts_of(item, file, f"groups.{gname}.hosts") \
                        if isinstance(item, str) else [item]
                group = {**group, "hosts": members}
            fixed[gname] = group
        out["groups"] = fixed
    return out


def _skipped(path: Path) -> bool:
    return path.name.startswith(".") or path.name.endswith(_IGNORED)


def _hosts_sources(given: Path, warnings: list[str]) -> tuple[Path, list[Path]]:
    """The inventory folder and its hosts files, main one first."""
    if given.is_file():  # -i inventory.ini, as Ansible's: its folder holds group_vars/
        return given.parent, [given]
    if not given.is_dir():
        raise ConfigError("no inventory here", file=str(given),
                          fix="point --inventory (or inventory: in vigil.yaml) at an "
                          "inventory folder or hosts file")
    present = [given / n for n in HOSTS_FILES if (given / n).is_file()]
    if len(present) > 1:
        raise ConfigError(f"two hosts files: {' and '.join(p.name for p in present)}",
                          file=str(given), fix="keep one (more hosts go to hosts.d/)")
    if not present:
        others = sorted(p.name for p in given.iterdir() if p.is_file() and not _skipped(p)
                        and p.suffix in (*_YAML, ".ini"))
        hint = f"; to read {others[0]}, rename it hosts{Path(others[0]).suffix} (more "\
            "hosts files go to hosts.d/)" if others else ""
        raise ConfigError(
            "inventory has no hosts file (hosts.yml, hosts.yaml, hosts.ini or hosts)",
            file=str(given),
            fix="point --inventory (or inventory: in vigil.yaml) at an inventory folder or "
            f"hosts file{hint}",
        )
    more: list[Path] = []
    extra = given / "hosts.d"
    if extra.is_dir():
        for p in sorted(extra.iterdir()):
            if _skipped(p):
                continue
            if p.is_file() and p.suffix in (*_YAML, ".ini", ""):
                more.append(p)
            else:
                warnings.append(f"not read: {p} (hosts.d/ holds .yml, .yaml and .ini "
                                "hosts files)")
    return given, [present[0], *more]


def _walk_top(base: Path, read: set[Path], roles_dirs: list[Path],
              warnings: list[str]) -> None:
    """Warn of every file of the inventory folder that vigil does not read."""
    def unread(p: Path, why: str) -> None:
        warnings.append(f"not read: {p}{'/' if p.is_dir() else ''} ({why})")

    resolved_roles = {d.resolve() for d in roles_dirs if d.exists()}
    for p in sorted(base.iterdir()):
        if _skipped(p) or p in read or p.name == "known_hosts" \
                or p.resolve() in resolved_roles:
            continue
        if p.is_dir() and p.name in _KNOWN_DIRS:
            if p.name in ("models", "stacks", "node_groups"):
                exts = _YAML if p.name != "node_groups" else (".yml",)
                for f in sorted(p.iterdir()):
                    if not _skipped(f) and not (f.is_file() and f.suffix in exts):
                        unread(f, f"{p.name}/ holds {' and '.join(exts)} files")
            continue
        unread(p, "vigil reads " + ", ".join((*HOSTS_FILES, *sorted(_KNOWN_DIRS))))


def _vars_files(reader: _Reader, kind: str, known: list[str],
                ) -> dict[str, list[Layer]]:
    """group_vars/ or host_vars/: <name>.yml, .yaml, .json, no extension, or a folder
    <name>/ of such files (merged in name order). Two forms of one name are an error."""
    folder = reader.base / kind
    if not folder.is_dir():
        return {}
    what = "group" if kind == "group_vars" else "host"
    forms: dict[str, list[Path]] = {}
    for p in sorted(folder.iterdir()):
        if _skipped(p):
            continue
        if p.is_dir() or p.name in known or p.suffix == "":
            name = p.name
        elif p.suffix in _VARS:
            name = p.stem
        else:
            reader.warnings.append(f"not read: {p} ({kind}/ holds .yml, .yaml and .json "
                                   "files or folders of them)")
            continue
        forms.setdefault(name, []).append(p)
    out: dict[str, list[Layer]] = {}
    for name, paths in forms.items():
        if len(paths) > 1:
            raise ConfigError(
                f"{what} {name!r} has variables twice: "
                f"{' and '.join(p.name + ('/' if p.is_dir() else '') for p in paths)}",
                file=str(folder), fix=f"keep one: move the file into {kind}/{name}/ "
                "(its files merge in name order) or join them")
        if name not in known and not (kind == "group_vars" and name == "all"):
            hint = ansible.close(name, set(known), CLOSE)
            fix = (f"did you mean {hint!r}? rename the file" if hint else
                   f"declare {what} {name!r} in {reader.main} or rename the file")
            if reader.ansible and not hint:  # Ansible shares group_vars over inventories
                reader.warnings.append(f"not read: {paths[0]} (no {what} {name!r} in this "
                                       "inventory)")
                continue
            raise ConfigError(f"{kind} for unknown {what} {name!r}", file=str(paths[0]),
                              fix=fix)
        layers: list[Layer] = []
        for path in _files_in(paths[0], reader.warnings, kind):
            got = vault.read_vars(path)  # Ansible Vault: decrypted, or set aside aloud
            if got.warning:
                reader.warnings.append(got.warning)
            data, rel = _as_vars(got.data, path), reader.rel(path)
            if got.whole and got.warning is None:
                rel = f"{rel} ({vault.MARK})"  # render masks every value from it
            layers.append(Layer(rel, data, str(path)))
            if got.vaulted and got.warning is None:
                layers.append(Layer(f"{rel} (!vault, {vault.MARK})",
                                    vault.pluck(data, got.vaulted), str(path)))
        out[name] = layers
    return out


def _files_in(path: Path, warnings: list[str], kind: str) -> Iterator[Path]:
    if not path.is_dir():
        yield path
        return
    for p in sorted(path.rglob("*")):
        if any(part.startswith(".") for part in p.relative_to(path).parts) or _skipped(p):
            continue
        if p.is_file() and p.suffix in (*_VARS, ""):
            yield p
        elif p.is_file():
            warnings.append(f"not read: {p} ({kind}/ holds .yml, .yaml and .json files)")


def load(root: str | os.PathLike[str],
         roles_dir: str | os.PathLike[str] | roles_mod.RolesDirs = roles_mod.ROLES_DIR,
         ) -> Inventory:
    """Read and validate an inventory (a folder, or one hosts file in it) and the roles;
    no host is contacted."""
    warnings: list[str] = []
    given = Path(root)
    base, sources = _hosts_sources(given, warnings)
    reader = _Reader(base, sources[0], warnings=warnings)
    for path in sources:
        reader.read_hosts_file(path)
    roles_dirs = [Path(roles_dir)] if isinstance(roles_dir, str | os.PathLike) \
        else list(roles_dir)
    roles = roles_mod.load_all(roles_dirs)
    group_files = _vars_files(reader, "group_vars", list(reader.groups))
    host_files = _vars_files(reader, "host_vars", list(reader.hosts))
    if given.is_dir():
        _walk_top(base, set(sources), roles_dirs, warnings)
    known = set(HostVars.model_fields) | {k for r in roles.values() if not r.builtin
                                          for k in r.defaults}
    ignored: dict[str, list[str]] = {}

    def clean(table: dict[str, list[Layer]]) -> dict[str, list[Layer]]:
        return {name: [_normalize(layer, known, reader.ansible, ignored) for layer in layers]
                for name, layers in table.items()}

    group_inline, host_inline = clean(reader.group_inline), clean(reader.host_inline)
    # every layer is cleaned before the warnings are written: a key set aside in
    # group_vars/ or host_vars/ is said as loudly as one in the hosts file (issue 29.5)
    group_vars, host_vars = clean(group_files), clean(host_files)
    hosts = {name: _merged(host_inline.get(name, [])) for name in reader.hosts}
    for key, places in ignored.items():
        shown = ", ".join(places[:3]) + (f" and {len(places) - 3} more" if len(places) > 3
                                         else "")
        if key in PROFILE_FIELDS:
            warnings.append(f"ignored {key!r} in {shown}: {profile_field(key)}")
            continue
        why = "an Ansible variable vigil does not use" if key.startswith("ansible_") else \
            "not a vigil variable (one of your playbooks'?)"
        warnings.append(f"ignored {key!r}: {why}{ansible.did_you_mean(key, known, 0.7)}; "
                        f"in {shown}")
    templated: dict[str, list[str]] = {}
    for table in (group_inline, group_vars, host_inline, host_vars):
        for layer in (layer for layers in table.values() for layer in layers):
            for key, value in layer.data.items():
                for spot in _templates(value, str(key)):
                    places = templated.setdefault(spot, [])
                    if layer.where not in places:
                        places.append(layer.where)
    for spot, places in templated.items():
        shown = ", ".join(places[:3]) + (f" and {len(places) - 3} more" if len(places) > 3
                                         else "")
        warnings.append(f"{spot!r} in {shown} holds a template ({{{{ }}}} or {{% %}}): vigil "
                        "does not template inventory values, so it is used as written; "
                        "write the value itself")
    return Inventory(base, hosts, reader.groups, group_inline, group_vars,
                     host_inline, host_vars, roles, sources[0], tuple(warnings),
                     reader.ansible)


def _templates(value: object, path: str) -> Iterator[str]:
    """The places of a value (``env.NCCL_SOCKET_IFNAME``, ``extra[0]``) holding Jinja's
    ``{{`` or ``{%``: Ansible would template them, vigil takes them literally."""
    if isinstance(value, str):
        if "{{" in value or "{%" in value:
            yield path
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _templates(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _templates(v, f"{path}[{i}]")


# Fields of a model profile that are not host variables: set on a host, they say where
# they belong instead of vanishing (the unit would keep the profile's value).
# (name, description and path are too plain to be sure a playbook's variable is not meant)
PROFILE_FIELDS = frozenset(set(ModelProfile.model_fields) - set(HostVars.model_fields)
                           - {"name", "description", "path"})


def profile_field(key: str) -> str:
    return (f"a model profile field, not a host variable, so the profile's value stays; "
            f"for this host set it under overrides: (overrides: {{{key}: ...}}), for one "
            f"run use --set {key}=...")


def _merged(layers: list[Layer]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for layer in layers:
        out = merge(out, layer.data)
    return out


def _normalize(layer: Layer, known: set[str], foreign_ok: bool,
               ignored: dict[str, list[str]]) -> Layer:
    """Ansible's names as vigil's, Ansible-only and (in an Ansible inventory) foreign
    variables set aside for a warning; any other unknown key is an error with the closest
    known one. INI's boolean words become bools for vigil's bool variables."""
    data = dict(layer.data)
    where = f"{layer.file}: {layer.place}" if layer.place else layer.file
    for alias, key in ansible.ALIASES.items():
        if alias not in data:
            continue
        if key in data:
            raise ConfigError(f"both {alias} and {key} are given", file=where,
                              fix=f"keep one ({alias} is Ansible's name of {key})")
        value = data.pop(alias)
        if key == "ssh_port" and isinstance(value, str) and value.strip().isdecimal():
            value = int(value)
        elif key == "sudo":
            value = ansible.boolean(value)
        elif key == "connection":
            value = ansible.connection(value, where)
        data[key] = value
    for key in list(data):
        if key in known:
            if key in _BOOLS:
                data[key] = ansible.boolean(data[key])
            continue
        name = str(key)
        if name.startswith("ansible_"):
            hint = None if name in ansible.ANSIBLE_ONLY else \
                ansible.close(name, set(ansible.ALIASES), CLOSE)
        else:
            hint = ansible.close(name, known, CLOSE if foreign_ok else 0.6)
        if name in PROFILE_FIELDS:
            hint = None
        if hint is None and (name.startswith("ansible_") or foreign_ok):
            ignored.setdefault(name, []).append(layer.where)
            del data[key]
            continue
        raise ConfigError(
            f"unknown key {name!r}" + (f" - did you mean {hint!r}?" if hint else ""),
            file=where,
            fix=profile_field(name) if name in PROFILE_FIELDS else
            "known keys: " + ", ".join(sorted(known)),
        )
    return Layer(layer.where, data, layer.file, layer.place)


def _as_vars(data: Any, path: Path) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping of variables, got {type(data).__name__}",
                          file=str(path))
    return data
