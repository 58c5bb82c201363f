"""What `invoke render` shows: every file a deploy would write, and where each variable
came from (PRECEDENCE, Ansible's order; a dict's keys each with its own file). Secrets
masked."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Mapping
from pathlib import Path

from vigil.desired.render import MASK, is_secret
from vigil.desired.targets import Target
from vigil.desired.vault import MARK
from vigil.errors import ConfigError

# The merge order of vigil.desired.inventory, as render prints it above the variables.
PRECEDENCE = ("lowest first, as Ansible's: role defaults < hosts file's group vars < "
              "group_vars/all < group_vars/<group> < hosts file's host vars < "
              "host_vars/<host> < --set")


def write_files(t: Target, out: Path) -> list[str]:
    """The unit, the env file (masked, 0600) and each user role's files under out/<role>/;
    a host that does not take the service role gets only its roles' files."""
    written: list[str] = []
    if t.takes("service"):
        unit = out / Path(t.rendered.paths.unit).name
        env = out / Path(t.rendered.paths.env).name
        _write(out, unit, t.rendered.unit_text, 0o644)
        _write(out, env, t.rendered.env_masked, 0o600)
        used = t.rendered.templates
        written += [f"{unit}  (from {used.get('vllm.service.j2', '?')})",
                    f"{env}  (secrets masked; from {used.get('vllm.env.j2', '?')})"]
    for role in t.roles:
        for f in role.files:
            path = out / role.name / f.dest.lstrip("/")
            # the role's own mode, never wider than 0755 (a 0600 file stays the owner's)
            _write(out, path, f.content, int(f.mode, 8) & 0o755)
            written.append(f"{path}  (-> {f.dest}, mode {f.mode}, owner {f.owner})")
    return written


def _write(out: Path, path: Path, text: str, mode: int) -> None:
    """Write under `out` without following a symlink planted on the way (a link there
    could send the file anywhere the user may write) and with `mode` from the start."""
    try:
        for d in (out / p for p in [Path(), *reversed(path.relative_to(out).parents[:-1])]):
            if d.is_symlink():
                raise ConfigError("is a symbolic link; vigil does not write through one",
                                  file=str(d), fix="remove the link or pick another --out")
            d.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "w") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(text)
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise ConfigError(f"cannot write: {why}", file=str(exc.filename or path),
                          fix="pick an --out directory you may write, with no file or "
                          "link in the way") from None


def masked(key: str, value: object, secrets: frozenset[str]) -> object:
    """A value as render may show it: a secret's name (declared in secret_env, or
    ``*_TOKEN``, ``*_PASSWORD``, …) masks its value at any depth (``overrides.env.HF_TOKEN``,
    a role default ``hub_token``)."""
    if is_secret(key, secrets):
        return MASK
    if isinstance(value, Mapping):
        return {k: masked(str(k), v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked("", v, secrets) for v in value]
    return value


def _shown(key: str, value: object, secrets: frozenset[str]) -> str:
    return json.dumps(masked(key, value, secrets), sort_keys=True, default=str)


def origin_of(key: str, value: object, origin: Mapping[str, str]) -> str:
    """Where a variable came from; a dict merged from several files names the file of
    each key ("A: group_vars/g.yml; B, C: host_vars/h.yml")."""
    top = origin.get(key, "vigil default")
    if not isinstance(value, dict) or not value:
        return top
    by: dict[str, list[str]] = {}
    for sub in sorted(value, key=str):
        by.setdefault(origin.get(f"{key}.{sub}", top), []).append(str(sub))
    if len(by) == 1:
        return next(iter(by))
    return "; ".join(f"{', '.join(keys)}: {where}" for where, keys in by.items())


def variables(t: Target) -> list[str]:
    """One line per variable: name, value, and the file (or flag) that set it."""
    values = {**t.vars.model_dump(), **t.role_vars}
    secrets = frozenset(t.vars.secret_env)
    width = max(len(k) for k in values)
    lines = []
    for k in sorted(values):
        where = origin_of(k, values[k], t.origin)
        # a value from Ansible Vault is a secret whatever its name
        shown = json.dumps(MASK) if MARK in where else _shown(k, values[k], secrets)
        lines.append(f"{k:<{width}} = {shown}  ({where})")
    return lines + ssh_lines(t)


# what ssh config says that no host variable shows (ssh_user, ssh_port and
# connect_timeout_s show their own origin)
SSH_SHOWN = ("hostname", "identityfile", "proxyjump", "proxycommand", "userknownhostsfile",
             "globalknownhostsfile")


def ssh_lines(t: Target) -> list[str]:
    """The connection options ssh config sets for the host's address, from ssh config."""
    if t.ssh is None:
        return []
    found = [(k, " ".join(t.ssh.values[k])) for k in SSH_SHOWN if t.ssh.values.get(k)]
    if not found:
        return []
    return [f"ssh config for {t.ssh.name}:"] + [
        f"  {k} = {json.dumps(v)}  ({t.ssh.via})" for k, v in found]
