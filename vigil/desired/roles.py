"""Roles as data: ``roles/<name>/`` holds a role's defaults, templates and files.

A role is a folder::

    roles/<name>/defaults.yml    every value a user may want to change (lowest precedence)
    roles/<name>/role.yml        user roles: files to place and units to enable
    roles/<name>/templates/*.j2  Jinja2 templates (StrictUndefined)
    roles/allow.yml              the ops repo's own allow-list (below), outside every role

The built-in roles (preflight, runtime, service, verify) are planned by the engine; their
defaults are host variables (every key is a ``HostVars`` field). A user role is planned
from its ``role.yml`` alone: each file is rendered with the host's variables and the
role's own, written with its mode and owner, and restarts the unit it names when it
changes; the units it lists are enabled and kept running. Nothing in the engine changes
when a user adds one.

Precedence, lowest first: role defaults < group_vars/all < group < host < ``--set``.

A role may come from someone else's repository, and it runs as root on the hosts, so it is
confined at load (``confine``): a file goes under the role's own folders (``ROOTS``:
``/etc/vigil/<role>/``, ``/opt/vigil/<role>/``, ``/var/lib/vigil/roles/<role>/``) or into
a systemd unit folder as one of the role's own units (named ``<role>…`` or
``vigil-<role>…``, or a drop-in ``<unit>.d/*.conf`` of one: a service, timer, socket or
path, and never the host's or vigil's own, ``SYSTEM_UNITS``, whatever the role is called);
it restarts and enables only units it places. Anything else must be named for that role
in ``roles/allow.yml``::

    node-exporter:
      paths: [/etc/default/node-exporter, /etc/nginx/conf.d/]  # a file, or a folder (/)
      units: [nginx.service]                                   # restart, enable, place
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
_UNIT_RE = re.compile(_UNIT[1:-1])  # names are checked with fullmatch: `$` passes a "\n"
UNIT_DIRS = ("/etc/systemd/system/", "/run/systemd/system/", "/usr/local/lib/systemd/system/")
# A user role's own folders on a host, {role} its name. /var/lib/vigil/<service> is a
# service's state, so a role's state lives one level down, in roles/.
ROOTS = ("/etc/vigil/{role}/", "/opt/vigil/{role}/", "/var/lib/vigil/roles/{role}/")
# Folders vigil itself keeps under those roots (env_root's default, uv): never a role's.
RESERVED = ("envs", "bin", "roles", "backup", "history")
ALLOW_FILE = "allow.yml"

Unit = Annotated[str, Field(pattern=_UNIT)]


class RoleFile(Strict):
    template: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                          description="a file in the role's templates/ folder")
    dest: str = Field(pattern=_DEST, description=(
        "absolute path on the host, in the role's own folders (/etc/vigil/<role>/, "
        "/opt/vigil/<role>/, /var/lib/vigil/roles/<role>/), a systemd unit folder for one "
        "of its own units (<role>… or vigil-<role>…, or a drop-in <unit>.d/*.conf), or a "
        "path roles/allow.yml names for the role"))
    mode: str = Field("0644", pattern=r"^0?[0-7]{3}$")
    owner: str = Field("root", pattern=r"^[a-z_][a-z0-9_-]*(:[a-z_][a-z0-9_-]*)?$")
    restart: Unit | None = Field(None, description="unit to restart when this file changes: "
                                 "one the role places, or roles/allow.yml names")

    @field_validator("dest")
    @classmethod
    def _plain(cls, v: str) -> str:
        # no `..`/`.`/empty component: the path says where the file goes, nothing else
        if any(part in ("", ".", "..") for part in v[1:].split("/")):
            raise ValueError(f"{v!r}: write a plain absolute path (no '..', '.', '//')")
        return v


class RoleSpec(Strict):
    files: list[RoleFile] = Field(default_factory=list)
    enable: list[Unit] = Field(default_factory=list, description=(
        "units enabled and running: ones the role places, or roles/allow.yml names"))

    @field_validator("files")
    @classmethod
    def _unique(cls, v: list[RoleFile]) -> list[RoleFile]:
        seen = [f.dest for f in v]
        dup = next((d for d in seen if seen.count(d) > 1), None)
        if dup:
            raise ValueError(f"{dup} is placed twice")
        return v


class Allow(Strict):
    """What the ops repo lets one user role touch beyond its own folders and units."""

    paths: list[Annotated[str, Field(pattern=_DEST)]] = Field(
        default_factory=list, description="files, or folders ending in /, the role may write")
    units: list[Unit] = Field(default_factory=list,
                              description="units the role may place, restart and enable")

    @field_validator("paths")
    @classmethod
    def _plain(cls, v: list[str]) -> list[str]:
        for p in v:
            if any(part in ("", ".", "..") for part in p[1:].rstrip("/").split("/")):
                raise ValueError(f"{p!r}: write a plain absolute path (no '..', '.', '//')")
        return v


@dataclass(frozen=True)
class Role:
    name: str
    dir: Path
    defaults: Mapping[str, Any]
    spec: RoleSpec
    allowed: tuple[str, ...] = ()  # dests and units only roles/allow.yml lets it touch

    @property
    def builtin(self) -> bool:
        return self.name in BUILTIN

    @property
    def defaults_file(self) -> Path:
        return self.dir / "defaults.yml"


def check_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not ROLE_NAME.fullmatch(name):
        raise ConfigError(
            f"role name {name!r} is not valid", file=where, key="roles",
            fix="a role is a folder under roles/: lower-case letters, digits and dashes",
        )
    return name


# Kinds of unit a role owns by its name alone. A target, mount, swap, slice or scope
# changes the host itself (poweroff.target, etc.mount over /etc): only allow.yml places one.
OWN_KINDS = ("service", "timer", "socket", "path")
# Units a host or vigil itself runs, which no role owns by being named for them (a role
# called ssh, systemd or vllm): systemd's own and its targets, the services of a GPU host,
# vigil's service and the Ray units beside it. FAMILIES stand for themselves and ``x-…``.
SYSTEM_UNITS = frozenset((
    "init", "udev", "cron", "crond", "anacron", "atd", "polkit", "rsyslog", "syslog",
    "auditd", "apparmor", "networking", "network", "netplan", "wpa_supplicant", "resolvconf",
    "chrony", "chronyd", "ntp", "ntpd", "firewalld", "ufw", "nftables", "iptables",
    "unattended-upgrades", "packagekit", "logrotate", "fstrim", "e2scrub", "lvm2",
    "multipathd", "iscsid", "rpcbind", "autofs", "crio", "dcgm", "poweroff", "reboot",
    "halt", "kexec", "shutdown", "emergency", "rescue", "default", "multi-user",
    "graphical", "sysinit", "basic", "local-fs", "remote-fs", "swap", "tmp",
    "ctrl-alt-del", "sleep", "suspend", "hibernate", "exit", "sudo", "vigil",
))
FAMILIES = ("systemd", "dbus", "getty", "serial-getty", "user", "ssh", "sshd", "apt", "dnf",
            "snapd", "cloud", "NetworkManager", "docker", "containerd", "kubelet", "nfs",
            "nvidia", "vllm", "ray")


def system_unit(unit: str) -> bool:
    """Whether a unit is the host's or vigil's own, or of a kind a role does not own by its
    name (OWN_KINDS)."""
    name, _, kind = unit.rpartition(".")
    stem = name.split("@", 1)[0]
    return kind not in OWN_KINDS or stem in SYSTEM_UNITS or any(
        stem == f or stem.startswith(f + "-") for f in FAMILIES)


def _own_unit(unit: str, role: str, allowed: Sequence[str]) -> bool:
    """A unit the role may place: named for it (``<role>…``/``vigil-<role>…``), of a kind a
    role owns and not the host's or vigil's own (``system_unit``); or allowed."""
    if unit in allowed:
        return True
    stem = unit.split("@", 1)[0].rsplit(".", 1)[0]
    own = f"vigil-{role}"
    if stem == own or stem.startswith(own + "-"):  # vigil-<role>…: vigil's name space
        return unit.rsplit(".", 1)[-1] in OWN_KINDS
    mine = stem == role or stem.startswith(role + "-")
    return mine and not system_unit(unit)


def _unit_placed(dest: str) -> str | None:
    """The unit a file in a systemd unit folder is (a drop-in: the unit it amends), or
    None when it is neither a unit file nor a drop-in directly under a unit folder."""
    base = next((d for d in UNIT_DIRS if dest.startswith(d)), None)
    if base is None:
        return None
    rest = dest[len(base):].split("/")
    if len(rest) == 1 and _UNIT_RE.fullmatch(rest[0]):
        return rest[0]
    if len(rest) == 2 and rest[0].endswith(".d") and rest[1].endswith(".conf") \
            and _UNIT_RE.fullmatch(rest[0][:-2]):
        return rest[0][:-2]
    return ""


def may_own(unit: str, units: set[str]) -> bool:
    """Whether ``unit`` is one of ``units`` or an instance of a template among them."""
    template = re.sub(r"@[^.]*\.", "@.", unit, count=1)
    return unit in units or template in units


def confine(name: str, spec: RoleSpec, allow: Allow, sfile: str) -> tuple[str, ...]:
    """Refuse a user role's file outside its own folders and units, and a restart or an
    enable of a unit it does not place (see the module's docstring), unless allowed.
    Returns what only allow.yml lets it touch (dests and units), for --check to name."""
    through: list[str] = []
    def allowed(dest: str) -> bool:
        return any(dest == p or (p.endswith("/") and dest.startswith(p)) for p in allow.paths)

    fix_allow = f"or name it for role {name} in {ALLOW_FILE} beside the role folders"
    placed: list[str] = []
    for i, f in enumerate(spec.files):
        unit = _unit_placed(f.dest)
        if unit and _own_unit(unit, name, allow.units):
            placed.append(unit)
            if not _own_unit(unit, name, ()):
                through.append(f.dest)
            continue
        roots = [r.format(role=name) for r in ROOTS]
        if unit is None and any(f.dest.startswith(r) for r in roots) and name not in RESERVED:
            continue
        if allowed(f.dest):
            through.append(f.dest)
            continue
        if unit:
            why = (f"{unit} is not one of the role's own units (named {name}… or "
                   f"vigil-{name}…)")
            if system_unit(unit):
                why += ("; it is the host's or vigil's own, or a kind (a target, a mount) "
                        "a role places only through allow.yml")
            fix = f"name the unit {name}.service or vigil-{name}.service, {fix_allow}"
        elif name in RESERVED and unit is None and any(f.dest.startswith(r) for r in roots):
            why = f"{name!r} is a folder vigil keeps itself under those roots"
            fix = f"rename the role, {fix_allow}"
        else:
            why = "outside the role's own folders"
            fix = f"place it under {', '.join(roots)} or a unit folder, {fix_allow}"
        raise ConfigError(f"{f.dest!r}: {why}", file=sfile, key=f"files.{i}.dest", fix=fix)
    units = set(placed) | set(allow.units)

    def may(unit: str) -> bool:
        return may_own(unit, units)

    for i, f in enumerate(spec.files):
        if f.restart and not may(f.restart):
            raise ConfigError(f"{f.restart!r}: the role does not place this unit",
                              file=sfile, key=f"files.{i}.restart",
                              fix=f"restart a unit the role places, {fix_allow} (units:)")
    for i, u in enumerate(spec.enable):
        if not may(u):
            raise ConfigError(f"{u!r}: the role does not place this unit", file=sfile,
                              key=f"enable.{i}",
                              fix=f"enable a unit the role places, {fix_allow} (units:)")
    own = {u for u in placed if _own_unit(u, name, ())}  # by its name, not by allow.yml
    named = [*spec.enable, *(f.restart for f in spec.files if f.restart)]
    through += [u for u in named if u and not may_own(u, own)]
    return tuple(dict.fromkeys(through))


def read_allow(roles_dir: Path) -> dict[str, Allow]:
    """The ops repo's ``roles/allow.yml``: role name -> what it may touch beyond its own."""
    afile = roles_dir / ALLOW_FILE
    if not afile.is_file():
        return {}
    data = read_yaml(afile)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping of role names to paths: and units:",
                          file=str(afile), fix="e.g. my-role: {paths: [/etc/my-role.conf]}")
    allow: dict[str, Allow] = {}
    for key, value in data.items():
        check_name(key, str(afile))
        allow[key] = parse_model(Allow, value, f"{afile}: {key}")
    return allow


def load_role(roles_dir: Path, name: str, allow: Allow | None = None) -> Role:
    """One role folder, validated: defaults, role.yml and every template it names; a user
    role's files and units confined (``allow``: the ops repo's allow-list for it)."""
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
            if not isinstance(key, str) or not _VAR_NAME.fullmatch(key):
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
    through = confine(name, spec, allow or Allow(), str(sfile)) if name not in BUILTIN else ()
    return Role(name, folder, dict(defaults), spec, through)


def names(roles_dir: Path) -> list[str]:
    if not roles_dir.is_dir():
        return []
    return sorted(p.name for p in roles_dir.iterdir() if p.is_dir() and ROLE_NAME.fullmatch(p.name))


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
        allow = read_allow(folder) if folder != ROLES_DIR else {}
        for n in names(folder):
            role = load_role(folder, n, allow.get(n))
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
    if isinstance(value, str) and not _SAFE.fullmatch(value):
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
    allowed: tuple[str, ...] = ()  # what only roles/allow.yml lets it touch (Role.allowed)

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
    return RenderedRole(role.name, tuple(files), tuple(role.spec.enable), role.allowed)
