"""Ansible's inventory formats, read as Ansible reads them (pure: text in, values out).

Three shapes of a hosts file reach the loader (``inventory.py``):

* vigil's own ``hosts:``/``groups:`` YAML (parsed there, against ``HostsFile``);
* Ansible's YAML: groups at the top (``all:`` and/or others), each with ``hosts:``,
  ``children:`` and ``vars:``;
* Ansible's INI: ``[group]``, ``[group:vars]``, ``[group:children]``, ``host key=value``.

Both Ansible shapes come out as one ``Parsed``: hosts with their inline variables, groups
with their members flattened over ``children`` (a host of a child is a host of the parent)
and in Ansible's precedence order (parents before children, then by
``ansible_group_priority``, then by name), and each group's inline variables. Host ranges
(``h100-[01:16]``, ``[a:c]``, ``[1:9:2]``) expand in all three shapes.
"""

from __future__ import annotations

import ast
import re
import shlex
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vigil.desired.yamlfile import close, did_you_mean
from vigil.errors import ConfigError

__all__ = ["ALIASES", "ANSIBLE_ONLY", "Parsed", "close", "did_you_mean", "expand_range",
           "hosts_of", "is_ansible_yaml", "parse_ini", "parse_yaml"]

# Ansible's connection variables that mean one of vigil's host variables.
ALIASES: Mapping[str, str] = {
    "ansible_host": "address",
    "ansible_ssh_host": "address",
    "ansible_user": "ssh_user",
    "ansible_ssh_user": "ssh_user",
    "ansible_port": "ssh_port",
    "ansible_ssh_port": "ssh_port",
    "ansible_become": "sudo",
    "ansible_ssh_private_key_file": "ssh_key",
    "ansible_private_key_file": "ssh_key",
    "ansible_connection": "connection",
}
# Ansible's own variables that vigil has no use for: ignored with a warning, never an
# unknown key (an Ansible inventory carries them for its playbooks).
ANSIBLE_ONLY = frozenset({
    "ansible_python_interpreter", "ansible_become_user", "ansible_become_method",
    "ansible_become_password", "ansible_become_pass", "ansible_become_exe",
    "ansible_become_flags", "ansible_password", "ansible_ssh_pass", "ansible_ssh_password",
    "ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_sftp_extra_args",
    "ansible_scp_extra_args", "ansible_ssh_args", "ansible_ssh_executable",
    "ansible_ssh_pipelining", "ansible_pipelining", "ansible_ssh_timeout", "ansible_timeout",
    "ansible_shell_type", "ansible_shell_executable", "ansible_network_os",
    "ansible_host_key_checking", "ansible_ssh_host_key_checking", "ansible_sudo",
    "ansible_sudo_pass", "ansible_sudo_user", "ansible_winrm_transport",
})
_CONNECTIONS = {"ssh": "ssh", "smart": "ssh", "paramiko": "ssh", "local": "local"}
# Ansible's boolean words (ansible.module_utils.parsing.convert_bool)
_TRUE = frozenset({"y", "yes", "on", "1", "true", "t"})
_FALSE = frozenset({"n", "no", "off", "0", "false", "f"})
GROUP_KEYS = ("hosts", "children", "vars")
MAX_RANGE = 10_000  # names one pattern may expand to: a typo must not eat the memory
_RANGE = re.compile(r"\[([^\[\]]*)\]")
RANGE = re.compile(r"\[[^\[\]]*:[^\[\]]*\]")  # a range, not a glob's [abc]
_DIGITS = re.compile(r"[0-9]+")


def expand_range(pattern: str) -> list[str]:
    """Ansible's host ranges: ``h100-[01:16]`` is h100-01 … h100-16 (a leading zero keeps
    the width), ``[a:c]`` letters, ``[1:9:2]`` a step, ``[:3]`` from 0; several ranges
    multiply, in order. A name without brackets is itself. Raises ValueError saying why."""
    m = _RANGE.search(pattern)
    if m is None:
        if "[" in pattern or "]" in pattern:
            raise ValueError("a bracket without its pair")
        return [pattern]
    head, body, tail = pattern[:m.start()], m.group(1), pattern[m.end():]
    if "]" in head:
        raise ValueError("a bracket without its pair")
    parts = body.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"[{body}] is not a range (write [01:16], [a:c] or [1:16:2])")
    beg, end = parts[0] or "0", parts[1]
    step_text = parts[2] if len(parts) == 3 else "1"
    if not end:
        raise ValueError(f"[{body}] has no end")
    if not _DIGITS.fullmatch(step_text) or int(step_text) < 1:
        raise ValueError(f"[{body}]: the step must be a whole number from 1")
    step = int(step_text)
    values: list[str]
    if _DIGITS.fullmatch(beg) and _DIGITS.fullmatch(end):
        width = len(beg) if beg.startswith("0") and len(beg) > 1 else 0
        if width and len(end) != width:
            raise ValueError(f"[{body}]: a zero-padded range needs its begin and end of "
                             f"one width (write [{beg}:{end.zfill(width)}])")
        first, last = int(beg), int(end)
        if first > last:
            raise ValueError(f"[{body}] begins after it ends")
        if (last - first) // step + 1 > MAX_RANGE:
            raise ValueError(f"[{body}] is more than {MAX_RANGE} hosts")
        values = [str(i).zfill(width) for i in range(first, last + 1, step)]
    elif len(beg) == len(end) == 1 and beg in string.ascii_letters \
            and end in string.ascii_letters:
        first, last = string.ascii_letters.index(beg), string.ascii_letters.index(end)
        if first > last:
            raise ValueError(f"[{body}] begins after it ends")
        values = list(string.ascii_letters[first:last + 1:step])
    else:
        raise ValueError(f"[{body}] is not a range of numbers or of single letters")
    rest = expand_range(tail)
    if len(values) * len(rest) > MAX_RANGE:
        raise ValueError(f"{pattern} is more than {MAX_RANGE} hosts")
    return [head + v + r for v in values for r in rest]


def hosts_of(pattern: str, file: str, key: str) -> list[str]:
    """expand_range as one clear ConfigError."""
    try:
        return expand_range(pattern)
    except ValueError as exc:
        raise ConfigError(f"host range {pattern[:120]!r}: {exc}", file=file, key=key,
                          fix="write a range as h100-[01:16] (or [a:c], [1:16:2])") from None


def boolean(value: object) -> object:
    """An Ansible boolean word as a bool (INI values are strings); anything else as is."""
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    return value


def connection(value: object, where: str) -> object:
    """ansible_connection: ssh (smart, paramiko) or local; others are not vigil's."""
    if isinstance(value, str) and value in _CONNECTIONS:
        return _CONNECTIONS[value]
    raise ConfigError(f"ansible_connection {value!r} is not one vigil speaks", file=where,
                      key="ansible_connection", fix="use ssh or local")


# -- the parsed shape ---------------------------------------------------------------------


@dataclass
class Parsed:
    """One hosts file. Labels (``where``) say file and place for provenance and errors."""

    hosts: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)  # flattened, precedence order
    group_vars: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    all_vars: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


@dataclass
class _Tree:
    """Groups as Ansible builds them, before flattening."""

    file: str
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> inline vars
    members: dict[str, list[str]] = field(default_factory=dict)  # group -> its own hosts
    children: dict[str, list[str]] = field(default_factory=dict)
    vars: dict[str, dict[str, Any]] = field(default_factory=dict)
    declared: set[str] = field(default_factory=set)  # groups given by name, not only :vars
    # members as sets, beside their ordered lists: a test for a member in a list made a
    # 60,000-host inventory load take a minute
    member_set: dict[str, set[str]] = field(default_factory=dict)

    def group(self, name: str, key: str) -> None:
        if name == "all":
            return
        if not isinstance(name, str) or not name or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ConfigError(f"group name {str(name)[:120]!r} is not valid", file=self.file,
                              key=key, fix="letters, digits, '_', '.' and '-'")
        self.members.setdefault(name, [])
        self.children.setdefault(name, [])
        self.declared.add(name)

    def add_host(self, pattern: str, group: str, inline: dict[str, Any], key: str) -> None:
        if not isinstance(pattern, str):
            raise ConfigError(f"host name {pattern!r} is not text", file=self.file, key=key)
        for name in hosts_of(pattern, self.file, key):
            self.hosts[name] = {**self.hosts.get(name, {}), **inline}
            if group in ("all", "ungrouped"):
                continue
            seen = self.member_set.get(group)
            if seen is None:
                seen = self.member_set[group] = set(self.members[group])
            if name not in seen:
                seen.add(name)
                self.members[group].append(name)

    def add_vars(self, group: str, data: dict[str, Any]) -> None:
        self.vars[group] = {**self.vars.get(group, {}), **data}

    def flatten(self, rel: str) -> Parsed:
        """Members over children, groups ordered by depth, priority and name (Ansible's
        order of group variables), ``ungrouped`` for hosts in no group."""
        for g, kids in self.children.items():
            for kid in kids:
                if kid not in self.members:
                    raise ConfigError(f"group {g!r} lists child group {kid!r}, which is not a "
                                      "group", file=self.file, key=f"{g}:children")
        undeclared = sorted(set(self.vars) - self.declared - {"all"})
        if undeclared:
            raise ConfigError(f"variables for group {undeclared[0]!r}, which has no hosts or "
                              "children", file=self.file, key=f"{undeclared[0]}:vars",
                              fix=f"declare [{undeclared[0]}] (or remove its vars)")
        depth: dict[str, int] = {}

        def deep(g: str, path: tuple[str, ...]) -> int:
            if g in path:
                raise ConfigError(f"group {g!r} is its own child: {' > '.join((*path, g))}",
                                  file=self.file, key=f"{g}:children")
            if g not in depth:
                parents = [p for p, kids in self.children.items() if g in kids]
                depth[g] = 1 + max((deep(p, (*path, g)) for p in parents), default=0)
            return depth[g]

        def hosts(g: str, seen: tuple[str, ...] = ()) -> list[str]:
            out = list(self.members[g])
            for kid in self.children[g]:
                if kid not in seen:
                    out += [h for h in hosts(kid, (*seen, g)) if h not in out]
            return out

        for g in self.members:
            deep(g, ())
        priority: dict[str, int] = {}
        for g, data in self.vars.items():
            value = data.pop("ansible_group_priority", 1)
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"ansible_group_priority {value!r} is not a whole number",
                                  file=self.file, key=f"{g}:vars")
            priority[g] = value
        # ungrouped: the hosts of no other group (Ansible's implicit group)
        grouped = {h for g, m in self.members.items() if g != "ungrouped" for h in m}
        self.members["ungrouped"] = [h for h in self.hosts if h not in grouped]
        self.children.setdefault("ungrouped", [])
        depth.setdefault("ungrouped", 1)
        if not self.members["ungrouped"] and "ungrouped" not in self.declared:
            del self.members["ungrouped"]
        order = sorted(self.members, key=lambda g: (depth[g], priority.get(g, 1), g))
        out = Parsed()
        for name, inline in self.hosts.items():
            out.hosts[name] = [(f"{rel}: host {name}", inline)] if inline else []
        for g in order:
            out.groups[g] = hosts(g)
            if self.vars.get(g):
                out.group_vars[g] = (f"{rel}: group {g}", self.vars[g])
        if self.vars.get("all"):
            out.all_vars.append((f"{rel}: group all", self.vars["all"]))
        return out


# -- YAML ---------------------------------------------------------------------------------


def is_ansible_yaml(data: object) -> bool:
    """Ansible's YAML has groups at the top: ``all:``, or only mappings of hosts,
    children and vars. vigil's own has ``hosts:`` and ``groups:`` there."""
    if not isinstance(data, dict) or not data:
        return False
    if "all" in data:
        return True
    if {"hosts", "groups"} & set(data):
        return False
    return all(v is None or (isinstance(v, dict) and set(v) <= set(GROUP_KEYS))
               for v in data.values())


def parse_yaml(data: dict[Any, Any], file: str, rel: str) -> Parsed:
    tree = _Tree(file)
    top = data if "all" in data else {"all": {"children": data}}
    for name, body in top.items():
        _walk(tree, name, body, str(name))
    return tree.flatten(rel)


def _walk(tree: _Tree, name: object, body: object, key: str) -> None:
    if not isinstance(name, str):
        raise ConfigError(f"group name {name!r} is not text", file=tree.file, key=key)
    tree.group(name, key)
    if body is None:
        return
    if not isinstance(body, dict):
        raise ConfigError(f"a group is a mapping of hosts, children and vars, got "
                          f"{type(body).__name__}", file=tree.file, key=key)
    for k in body:
        if k not in GROUP_KEYS:
            raise ConfigError(f"unknown key {k!r}{did_you_mean(str(k), set(GROUP_KEYS))}",
                              file=tree.file, key=f"{key}.{k}",
                              fix="a group of an Ansible inventory has hosts:, children: "
                              "and vars:")
    hosts = body.get("hosts") or {}
    if not isinstance(hosts, dict):
        raise ConfigError("hosts: is a mapping in an Ansible inventory (each host with its "
                          "variables, or nothing)", file=tree.file, key=f"{key}.hosts",
                          fix="write each host as 'name:' on its own line")
    for host, inline in hosts.items():
        if inline is not None and not isinstance(inline, dict):
            raise ConfigError(f"the variables of a host are a mapping, got "
                              f"{type(inline).__name__}", file=tree.file,
                              key=f"{key}.hosts.{host}")
        tree.add_host(host, name, dict(inline or {}), f"{key}.hosts.{host}")
    gvars = body.get("vars") or {}
    if not isinstance(gvars, dict):
        raise ConfigError(f"vars: is a mapping, got {type(gvars).__name__}", file=tree.file,
                          key=f"{key}.vars")
    if gvars:
        tree.add_vars(name, dict(gvars))
    kids = body.get("children") or {}
    if not isinstance(kids, dict):
        raise ConfigError("children: is a mapping of groups", file=tree.file,
                          key=f"{key}.children", fix="write each child group as 'name:'")
    for kid, kid_body in kids.items():
        _walk(tree, kid, kid_body, f"{key}.children.{kid}")
        if name != "all" and kid not in tree.children[name]:
            tree.children[name].append(kid)


# -- INI ----------------------------------------------------------------------------------

_SECTION = re.compile(r"\[([^\[\]:\s]+)(?::([A-Za-z]+))?\]")


def value(text: str) -> object:
    """An INI value as Ansible reads it: a Python literal (8000, 'x', [1, 2]), else the
    text; Ansible's boolean words are left to the variable that wants a bool."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return text


def parse_ini(text: str, file: str, rel: str) -> Parsed:
    tree = _Tree(file)
    group, kind = "ungrouped", "hosts"
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        where = f"line {n}"
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            m = _SECTION.match(line)
            rest = line[m.end():].strip() if m else ""
            if m is None or (rest and rest[0] not in "#;"):
                raise ConfigError(f"{where}: {line[:120]!r} is not a section header",
                                  file=file, fix="write [group], [group:vars] or "
                                  "[group:children]")
            group, kind = m.group(1), (m.group(2) or "hosts")
            if kind not in GROUP_KEYS:
                raise ConfigError(f"{where}: [{group}:{kind}] is not a section"
                                  f"{did_you_mean(kind, set(GROUP_KEYS))}", file=file,
                                  fix="write [group], [group:vars] or [group:children]")
            if kind != "vars":
                tree.group(group, where)
            continue
        if kind == "vars":
            k, sep, v = line.partition("=")
            if not sep or not k.strip():
                raise ConfigError(f"{where}: expected key=value, got {line[:120]!r}",
                                  file=file, key=f"[{group}:vars]")
            v = v.strip()
            if v[:1] not in "'\"":  # an inline comment after a space is no part of a value
                v = re.split(r"\s[#;]", v, maxsplit=1)[0].rstrip()
            tree.add_vars(group, {k.strip(): value(v)})
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc} in {line[:120]!r}", file=file,
                              fix="close the quote") from None
        if not words:
            continue
        if kind == "children":
            if len(words) != 1:
                raise ConfigError(f"{where}: a child group is one name, got {line[:120]!r}",
                                  file=file, key=f"[{group}:children]")
            tree.group(words[0], where)
            if words[0] not in tree.children[group]:
                tree.children[group].append(words[0])
            continue
        inline: dict[str, Any] = {}
        for word in words[1:]:
            k, sep, v = word.partition("=")
            if not sep or not k:
                raise ConfigError(f"{where}: {word[:120]!r} after host {words[0]!r} is not "
                                  "key=value", file=file, key=f"[{group}]",
                                  fix="write host key=value key=value on one line")
            inline[k] = value(v)
        tree.add_host(words[0], group, inline, f"{where} [{group}]")
    return tree.flatten(rel)
