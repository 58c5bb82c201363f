"""Host keys, checked the way ``ssh`` checks them: against every known_hosts file ssh
reads (UserKnownHostsFile and GlobalKnownHostsFile of the user's ssh config, else
~/.ssh/known_hosts and /etc/ssh/ssh_known_hosts) plus the inventory's ``known_hosts``
(hashed names, wildcard and negated patterns, @revoked; a host vouched for only by
@cert-authority is refused with the reason, as paramiko cannot check host certificates);
or against fingerprints pinned in the inventory. ``host_key: accept-new`` trusts an
unknown host once, writes its key to the inventory's known_hosts and says so; a changed
key is refused in every mode.
"""

from __future__ import annotations

import fcntl
import re
import shlex
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from vigil.report import safe_text


def known_hosts_files(ssh_config: Mapping[str, Any], home: Path) -> list[Path]:
    """The files ssh reads host keys from, in its order: UserKnownHostsFile then
    GlobalKnownHostsFile of the user's ssh config, or their defaults."""
    files: list[Path] = []
    for key, default in (
        ("userknownhostsfile", "~/.ssh/known_hosts ~/.ssh/known_hosts2"),
        ("globalknownhostsfile", "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"),
    ):
        value = ssh_config.get(key, default)
        words = value if isinstance(value, list) else shlex.split(str(value))
        for word in words:
            if word.lower() == "none":
                continue
            word = word.replace("%d", str(home)).replace("%%", "%")
            path = home / word[2:] if word.startswith("~/") else Path(word)
            if path not in files:
                files.append(path)
    return files

def fingerprint(key: paramiko.PKey) -> str:
    """As ``ssh-keygen -l`` prints it: SHA256:<base64 without padding>."""
    return str(key.fingerprint)

class _KeyRefused(paramiko.SSHException):
    def __init__(self, key: paramiko.PKey, why: str, hop: str | None = None) -> None:
        super().__init__(why)
        self.key = key
        self.why = why
        self.hop = hop  # a ProxyJump hop's name, when the refused key is the hop's

class _Hop(paramiko.MissingHostKeyPolicy):
    """A hop's policy: the host's, with a refusal that names the hop."""

    def __init__(self, then: paramiko.MissingHostKeyPolicy, hop: str) -> None:
        self.then = then
        self.hop = hop

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        try:
            self.then.missing_host_key(client, hostname, key)
        except _KeyRefused as exc:
            raise _KeyRefused(exc.key, exc.why, f"{self.hop} ({hostname})") from None

class _Strict(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        raise _KeyRefused(key, "unknown")

class _Pinned(paramiko.MissingHostKeyPolicy):
    # With pins no known_hosts file is loaded, so every key comes here.
    def __init__(self, pins: list[str]) -> None:
        self.pins = pins

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        if fingerprint(key) not in self.pins:
            raise _KeyRefused(key, "not pinned")

_WRITE_LOCK = threading.Lock()  # hosts connect from parallel threads

class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """Trust on first use: only a host with no key in any file gets here (a changed key
    is refused before), and its key is appended to the inventory's known_hosts; never a
    key a known_hosts file marks @revoked (checked before anything is written)."""

    def __init__(self, path: Path, note: Callable[[str], None],
                 revoked: set[str] | None = None) -> None:
        self.path = path
        self.note = note
        self.revoked = revoked if revoked is not None else set()

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        if key.get_base64() in self.revoked:
            raise _KeyRefused(key, "revoked")
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _WRITE_LOCK, open(self.path, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.write(line)
        self.note(
            f"WARNING: host key of {hostname} was unknown; trusted on first use "
            f"(host_key: accept-new): {key.get_name()} {fingerprint(key)} added to "
            f"{self.path}. Verify it out of band; a different key later is refused."
        )

@dataclass
class KnownHosts:
    """What ssh reads from known_hosts that paramiko's HostKeys does not: @revoked keys,
    entries under wildcard or negated patterns, @cert-authority lines."""

    revoked: set[str] = field(default_factory=set)
    patterns: list[tuple[str, paramiko.PKey, Path]] = field(default_factory=list)
    authorities: list[tuple[str, Path]] = field(default_factory=list)

def _glob(pattern: str) -> re.Pattern[str]:
    # ssh's patterns: `*` and `?` only (`[` is literal, as in "[host]:2222")
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c)
                              for c in pattern))

def host_matches(patterns: str, name: str) -> bool:
    """ssh's match_hostname: a comma-separated list of patterns, case-insensitive; a
    matching `!pattern` rules the name out whatever else matches."""
    found = False
    for pattern in patterns.lower().split(","):
        negated = pattern.startswith("!")
        if _glob(pattern[1:] if negated else pattern).fullmatch(name.lower()):
            if negated:
                return False
            found = True
    return found

def revoked_keys(text: str) -> set[str]:
    """The keys (base64) one known_hosts file marks @revoked."""
    found = set()
    for raw in text.splitlines():
        fields = raw.split()
        if len(fields) >= 4 and fields[0] == "@revoked":
            found.add(fields[3])
    return found

def load_known_hosts(text: str, keys: paramiko.HostKeys, source: Path,
                     into: KnownHosts) -> None:
    """Add the entries of one known_hosts file to ``keys`` (plain and hashed names) and
    to ``into`` (the rest). Lines no key can be read from are skipped, as ssh skips
    them: such a host stays unknown, never trusted. A key already in ``into.revoked``
    is never added: paramiko then asks the policy at key exchange, which refuses it
    before any authentication (``_Patterns``)."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if line.startswith("@"):
            if fields[0] == "@revoked" and len(fields) >= 4:
                into.revoked.add(fields[3])
            elif fields[0] == "@cert-authority" and len(fields) >= 2:
                into.authorities.append((fields[1], source))
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line)
        except (paramiko.SSHException, paramiko.hostkeys.InvalidHostKey, ValueError):
            continue
        if entry is None or entry.key is None or entry.key.get_base64() in into.revoked:
            continue
        if any(c in fields[0] for c in "*?!"):
            into.patterns.append((fields[0], entry.key, source))
            continue
        for name in entry.hostnames:
            keys.add(name, entry.key.get_name(), entry.key)

class _Patterns(paramiko.MissingHostKeyPolicy):
    """Before the host counts as unknown: its key under a matching wildcard entry is
    trusted, a different key of that type is a mismatch, and a host covered only by
    @cert-authority is refused with the reason (paramiko cannot check certificates)."""

    def __init__(self, known: KnownHosts, then: paramiko.MissingHostKeyPolicy) -> None:
        self.known = known
        self.then = then

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        # called during key exchange, before authentication: a revoked key stops here
        if key.get_base64() in self.known.revoked:
            raise _KeyRefused(key, "revoked")
        expected = None
        for patterns, known, _ in self.known.patterns:
            if host_matches(patterns, hostname) and known.get_name() == key.get_name():
                if known.get_base64() == key.get_base64():
                    return
                expected = known
        if expected is not None:
            raise paramiko.BadHostKeyException(hostname, key, expected)
        for patterns, source in self.known.authorities:
            if host_matches(patterns, hostname):
                raise _KeyRefused(key, f"cert-authority:{patterns} in {source}")
        self.then.missing_host_key(client, hostname, key)

def _stderr_note(message: str) -> None:
    sys.stderr.write(safe_text(message) + "\n")  # a host name or key comment is host text
    sys.stderr.flush()
