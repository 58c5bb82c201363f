"""What the user's ssh config says for a host, as OpenSSH itself resolves it (issue 29.7).

``ssh -G NAME`` prints the configuration ssh would use for NAME after every ``Include``,
``Host`` and ``Match`` block; the options a config file set are those that differ from
``ssh -G -F /dev/null NAME`` (OpenSSH's built-in defaults). Without an ``ssh`` client,
paramiko's parser reads ``~/.ssh/config`` and ``/etc/ssh/ssh_config`` (it follows no
``Include`` and no ``Match exec``: said once, with the line).

ssh finds ``~`` through the password database; vigil reads ``$HOME/.ssh`` (as it reads
known_hosts there). Where the two differ (a CI container with HOME=/github/home), ssh is
given ``$HOME/.ssh/config`` and the system file through ``-F`` and two ``Include`` lines.

vigil honours HostName, User, Port, IdentityFile, ProxyJump, ProxyCommand,
ConnectTimeout and the known_hosts files where the inventory says nothing; an option it
replaces with its own behaviour is one warning (OVERRIDDEN), never silently dropped.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vigil.desired.inputs import read_optional
from vigil.errors import ConfigError

SYSTEM_FILE = Path("/etc/ssh/ssh_config")
TIMEOUT_S = 10.0  # a Match exec or a canonicalising DNS lookup runs inside ssh -G
# ssh config options vigil applies (paramiko's lower-case names, as ssh -G prints them)
HONOURED = ("hostname", "user", "port", "identityfile", "proxyjump", "proxycommand",
            "connecttimeout", "userknownhostsfile", "globalknownhostsfile")
# options vigil does not follow: what it does instead (one warning each)
OVERRIDDEN: dict[str, str] = {
    "stricthostkeychecking": "vigil checks host keys by the inventory's host_key (strict, "
                             "the default; accept-new records new keys in the inventory's "
                             "known_hosts), whatever ssh config says",
    "hostkeyalias": "vigil looks a host's key up by its address and port",
    "forwardagent": "vigil never forwards the agent to a host",
    "identitiesonly": "vigil offers the agent's keys and the IdentityFile keys alike",
    "controlmaster": "vigil opens its own connection (no multiplexing)",
    "controlpersist": "vigil opens its own connection (no multiplexing)",
    "connectionattempts": "vigil tries to connect once per call",
    "serveraliveinterval": "vigil bounds each command by its own timeouts",
    "certificatefile": "vigil logs in with keys, not certificates",
    "pkcs11provider": "vigil logs in with key files and the agent only",
    "remotecommand": "vigil runs its own commands",
    "requesttty": "vigil runs commands without a terminal",
    "batchmode": "",  # vigil never prompts: the same
}


@dataclass(frozen=True)
class SshConfig:
    """The options a config file set for one name (lower-case names, values as ssh
    prints them; IdentityFile may repeat), and how they were read."""

    name: str
    values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    via: str = ""  # shown in render: "from ssh config (ssh -G gpu-02)"
    notes: tuple[str, ...] = ()  # what could not be read (paramiko and Include)

    def get(self, key: str) -> str | None:
        found = self.values.get(key)
        return found[0] if found else None

    def overridden(self) -> list[tuple[str, str, str]]:
        """(option, value, what vigil does instead) for each option set that vigil
        does not follow."""
        out = []
        for key, why in OVERRIDDEN.items():
            value = self.get(key)
            if value is None or not why:
                continue
            if key == "stricthostkeychecking" and value in ("yes", "true"):
                continue  # strict, as vigil is by default
            if key in ("forwardagent", "identitiesonly") and value in ("no", "false"):
                continue
            out.append((key, value, why))
        return out


_cache: dict[tuple[str, str, int], SshConfig] = {}
_lock = threading.Lock()


def lookup(name: str) -> SshConfig:
    """The ssh config for ``name`` (an address as vigil connects to it)."""
    home = Path.home()
    user_file = home / ".ssh" / "config"
    try:
        stamp = user_file.stat().st_mtime_ns
    except OSError:
        stamp = 0
    key = (name, str(home), stamp)
    with _lock:
        if key in _cache:
            return _cache[key]
    ssh = shutil.which("ssh")
    found = _by_ssh(ssh, name, home) if ssh else _by_paramiko(name, user_file)
    with _lock:
        _cache[key] = found
    return found


def _run(cmd: list[str], name: str) -> dict[str, tuple[str, ...]]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"ssh -G {name} took over {TIMEOUT_S:.0f} s", key="ssh config",
                          fix="check the ssh config's Match exec commands and "
                          "CanonicalizeHostname for this host") from None
    if proc.returncode != 0:
        said = [ln for ln in proc.stderr.splitlines()
                if ln.strip() and not ln.startswith("Pseudo-terminal")]
        first = said[0] if said else f"exit status {proc.returncode}"
        path, sep, rest = first.partition(": line ")
        raise ConfigError(f"ssh -G {name} refuses the ssh config: "
                          f"{('line ' + rest) if sep else first}",
                          file=path if sep else None, key=f"host {name}",
                          fix="fix that line (ssh -G HOST shows what ssh reads)")
    values: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        option, _, value = line.strip().partition(" ")
        if option:
            values.setdefault(option.lower(), []).append(value)
    return {k: tuple(v) for k, v in values.items()}


def _pw_home() -> Path | None:
    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        return None


def _by_ssh(ssh: str, name: str, home: Path) -> SshConfig:
    base = _run([ssh, "-G", "-F", "/dev/null", "--", name], name)
    same_home = _pw_home() is not None and _pw_home() == home
    if same_home:
        got = _run([ssh, "-G", "--", name], name)
    else:
        with tempfile.TemporaryDirectory(prefix="vigil-ssh-") as tmp:
            wrapper = Path(tmp) / "config"
            lines = [f'Include "{p}"' for p in (home / ".ssh" / "config", SYSTEM_FILE)
                     if p.is_file()]
            wrapper.write_text("\n".join(lines) + "\n")
            got = _run([ssh, "-G", "-F", str(wrapper), "--", name], name)
    values = {k: v for k, v in got.items() if base.get(k) != v}
    hostname = values.get("hostname")
    if hostname and hostname[0] == name.lower():
        del values["hostname"]
    return SshConfig(name, values, via=f"from ssh config (ssh -G {name})")


def _by_paramiko(name: str, user_file: Path) -> SshConfig:
    import paramiko

    texts, notes = [], []
    for path in (user_file, SYSTEM_FILE):
        text = read_optional(path)
        if text is None:
            continue
        texts.append(text)
        for n, line in enumerate(text.splitlines(), 1):
            word = line.strip().split(" ", 1)[0].lower()
            if word == "include" or (word == "match" and "exec" in line.lower()):
                notes.append(f"{path}: line {n}: {line.strip().split()[0]} is not followed "
                             "(no ssh client on this machine: paramiko reads the file)")
    try:
        config = paramiko.SSHConfig.from_text("\n".join(texts))
        found = config.lookup(name)
    except Exception as exc:  # paramiko's ConfigParseError, a bad token
        raise ConfigError(f"ssh config: {exc}", file=str(user_file), key=f"host {name}",
                          fix="fix that line") from None
    values: dict[str, tuple[str, ...]] = {}
    for key, value in found.items():
        values[key] = tuple(value) if isinstance(value, list) else (str(value),)
    if values.get("hostname") == (name,):
        del values["hostname"]
    return SshConfig(name, values, via=f"from ssh config ({user_file}, read by paramiko)",
                     notes=tuple(notes))


def with_hops(name: str, limit: int = 8) -> dict[str, SshConfig]:
    """The config of ``name`` and of every ProxyJump hop on the way to it (a hop's own
    config applies to it, as in ssh), by the name each is looked up by."""
    found: dict[str, SshConfig] = {}
    todo = [name]
    while todo and len(found) < limit:
        here = todo.pop(0)
        if here in found:
            continue
        found[here] = lookup(here)
        todo += [host for _, host, _ in hops(found[here].get("proxyjump"))]
    return found


def hops(jump: str | None) -> list[tuple[str, str, str]]:
    """ProxyJump's ``[user@]host[:port]`` list (ssh -G may bracket a host: [10.0.0.1]:22)
    as (user, host, port), "" where not given."""
    out: list[tuple[str, str, str]] = []
    for hop in (jump or "").split(","):
        hop = hop.strip().removeprefix("ssh://")
        if not hop or hop == "none":
            continue
        user, _, rest = hop.rpartition("@")
        if rest.startswith("["):
            host, _, tail = rest[1:].partition("]")
            port = tail.removeprefix(":")
        elif rest.count(":") == 1:
            host, _, port = rest.partition(":")
        else:
            host, port = rest, ""
        out.append((user, host, port))
    return out


def as_paramiko_text(configs: Mapping[str, SshConfig]) -> str:
    """One ``Host`` block per name with the honoured options ssh resolved for it: what
    Fabric's own lookup then finds (it follows no Include: it never reads the files)."""
    out = []
    for name, found in configs.items():
        lines = [f"  {key} {value}" for key in HONOURED for value in found.values.get(key, ())
                 if value and value != "none" and key != "proxyjump"]
        jumps = hops(found.get("proxyjump"))
        if jumps:  # in Fabric's shorthand: no brackets
            lines.append("  proxyjump " + ",".join(
                f"{u + '@' if u else ''}{h}{':' + p if p else ''}" for u, h, p in jumps))
        if lines:
            out.append(f"Host {name}\n" + "\n".join(lines))
    return "\n".join(out) + "\n"
