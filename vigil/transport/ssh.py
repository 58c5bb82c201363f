"""Connections to hosts: SSH through Fabric/paramiko, or the local machine.

A transport runs one shell command per call with optional stdin, counts round trips
(the deploy benchmark reports them) and can hold the host's deploy lock for as long as
a context is open. Host keys are checked the way ``ssh`` checks them: against every
known_hosts file ssh reads (UserKnownHostsFile and GlobalKnownHostsFile of the user's
ssh config, else ~/.ssh/known_hosts and /etc/ssh/ssh_known_hosts) plus the inventory's
``known_hosts`` (hashed names, wildcard and negated patterns, @revoked; a host vouched for
only by @cert-authority is refused with the reason, as paramiko cannot check host
certificates); or against fingerprints pinned in the inventory. ``host_key:
accept-new`` trusts an unknown host once, writes its key to the inventory's known_hosts
and says so; a changed key is refused in every mode.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import logging
import os
import re
import select
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self, cast

import paramiko

from vigil.desired.config import HostVars
from vigil.desired.render import lock_path
from vigil.errors import (
    ConfigError,
    HostError,
    LockLostError,
    LockTimeoutError,
    PermissionDeniedError,
    UnreachableError,
)
from vigil.report import safe_text

# paramiko logs a failed handshake with a traceback on stderr; vigil reports it as one
# clear error instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


@dataclass(frozen=True)
class Result:
    stdout: str
    stderr: str
    exit_status: int


class Transport(Protocol):
    name: str
    round_trips: int

    def run(self, command: str, *, stdin: str = "", timeout: float | None = None,
            on_stderr: Callable[[str], None] | None = None) -> Result:
        """Run a command; ``on_stderr`` gets each line of its stderr as it comes (the
        agent's progress), which stays in the result too."""
        ...

    def hold(self, command: str) -> Held:
        """Start a command whose life is a resource; stdin stays open until release."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Transport: ...

    def __exit__(self, *exc: object) -> None: ...


class Closing:
    """A transport is a context manager: `with connect(...) as t:` closes it."""

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Held(Protocol):
    """A long-running command whose life is a resource (the deploy lock)."""

    def readline(self, timeout: float) -> str | None: ...

    def alive(self) -> bool:
        """Whether the command still runs (for the lock: whether it is still held)."""
        ...

    def send(self, text: str) -> None:
        """Write to the command's stdin (the watcher's stream takes its request there)."""
        ...

    def release(self) -> None: ...


def privileged(command: str, host: HostVars, transport: object = None) -> str:
    """Run as root: directly for root, through non-interactive sudo when allowed. The
    user is the one the transport logged in as (the inventory's, else ~/.ssh/config's)."""
    user = getattr(transport, "login_user", None) or host.ssh_user
    if user == "root" or host.connection == "local" or not host.sudo:
        return command
    return f"sudo -n -- bash -c {shlex.quote(command)}"


# -- local ---------------------------------------------------------------------------


class _LocalHeld:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def readline(self, timeout: float) -> str | None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        return self.proc.stdout.readline()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def release(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class LocalTransport(Closing):
    def __init__(self, name: str) -> None:
        self.name = name
        self.round_trips = 0
        self.guards: list[Callable[[], None]] = []  # see host_lock

    def run(self, command: str, *, stdin: str = "", timeout: float | None = None,
            on_stderr: Callable[[str], None] | None = None) -> Result:
        for guard in self.guards:
            guard()
        self.round_trips += 1
        if on_stderr is None:
            try:
                proc = subprocess.run(
                    ["bash", "-c", command], input=stdin, capture_output=True, text=True,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired:
                raise HostError(self.name, f"command timed out after {timeout:.0f} s") from None
            return Result(proc.stdout, proc.stderr, proc.returncode)
        return self._run_following(command, stdin, timeout, on_stderr)

    def _run_following(self, command: str, stdin: str, timeout: float | None,
                       on_stderr: Callable[[str], None]) -> Result:
        live = subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert live.stdin is not None and live.stdout is not None and live.stderr is not None
        out: list[str] = []
        err: list[str] = []
        outs, errs = live.stdout, live.stderr

        def read_err() -> None:
            for line in errs:
                err.append(line)
                on_stderr(line.rstrip("\n"))

        threads = [threading.Thread(target=lambda: out.append(outs.read()), daemon=True),
                   threading.Thread(target=read_err, daemon=True)]
        for th in threads:
            th.start()
        with contextlib.suppress(BrokenPipeError):
            live.stdin.write(stdin)
            live.stdin.close()
        try:
            code = live.wait(timeout)
        except subprocess.TimeoutExpired:
            live.kill()
            live.wait()
            raise HostError(self.name, f"command timed out after {timeout:.0f} s") from None
        for th in threads:
            th.join()
        return Result("".join(out), "".join(err), code)

    def hold(self, command: str) -> _LocalHeld:
        self.round_trips += 1
        proc = subprocess.Popen(
            ["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        return _LocalHeld(proc)

# -- ssh -----------------------------------------------------------------------------


RELEASE_WAIT_S = 10.0


class _SSHHeld:
    def __init__(self, channel: paramiko.Channel) -> None:
        self.channel = channel
        self.buffer = b""

    def readline(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if self.channel.recv_ready():
                chunk = self.channel.recv(4096)
                if not chunk:
                    break
                self.buffer += chunk
            elif self.channel.exit_status_ready():
                break
            else:
                select.select([self.channel], [], [], min(remaining, 0.2))
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode(errors="replace") + "\n" if line or self.buffer else ""

    def alive(self) -> bool:
        transport = self.channel.get_transport()
        return (not self.channel.closed and not self.channel.exit_status_ready()
                and transport is not None and transport.is_active())

    def send(self, text: str) -> None:
        self.channel.sendall(text.encode())

    def release(self) -> None:
        with contextlib.suppress(Exception):
            self.channel.shutdown_write()  # EOF: the holder's `cat` ends, flock is released
            # bounded: a host that stopped answering must not hang the caller
            self.channel.status_event.wait(RELEASE_WAIT_S)
        self.channel.close()


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


class SSHTransport(Closing):
    def __init__(self, name: str, host: HostVars,
                 note: Callable[[str], None] | None = None) -> None:
        from fabric import Connection

        self.name = name
        self.host = host
        self.round_trips = 0
        # Checks run before every command (host_lock adds one): a lost lock stops the
        # host here instead of a silent reconnect carrying on without it.
        self.guards: list[Callable[[], None]] = []
        connect_kwargs: dict[str, object] = {"banner_timeout": host.connect_timeout_s,
                                             "auth_timeout": host.connect_timeout_s}
        if host.ssh_key:
            key = Path(host.ssh_key).expanduser()
            if not key.is_file():  # local input: refused before anything is contacted
                raise ConfigError(f"host {name}: ssh_key {key} does not exist",
                                  key="ssh_key", fix="point ssh_key at the deploy key's "
                                  "private key file on this machine")
            connect_kwargs["key_filename"] = str(key)
        # ~/.ssh/config decides what the inventory does not (as ssh and Ansible do): its
        # User, Port, HostName, IdentityFile and ProxyJump; vigil's defaults (root, 22)
        # only where neither says.
        given = host.model_fields_set
        self.conn = Connection(
            host.address,
            user=host.ssh_user if "ssh_user" in given else None,
            port=host.ssh_port if "ssh_port" in given else None,
            connect_kwargs=connect_kwargs,
        )
        if "ssh_user" not in given and "user" not in self.conn.ssh_config:
            self.conn.user = host.ssh_user
        if "ssh_port" not in given and "port" not in self.conn.ssh_config:
            self.conn.port = host.ssh_port
        self.login_user: str = str(self.conn.user)
        self.login_port: int = int(self.conn.port)
        # Fabric truncates a connect timeout to int (0.5 s -> 0 = none at all).
        self.conn.connect_timeout = host.connect_timeout_s
        client = self.conn.client
        self.key_files: list[Path] = []
        self.known = KnownHosts()
        if host.host_key_fingerprints:
            client.set_missing_host_key_policy(_Pinned(host.host_key_fingerprints))
            self._check_hops(host, note)
            return
        self._check_keys(client, host, note)
        self._check_hops(host, note)

    def _check_hops(self, host: HostVars, note: Callable[[str], None] | None) -> None:
        """Every ProxyJump hop ~/.ssh/config puts in front of the host is checked like a
        host (Fabric's own gateway connection would accept any key): its key must be in
        the same known_hosts files; accept-new records a new one there too."""
        from fabric import Connection

        hop = self.conn.gateway
        while isinstance(hop, Connection):
            # no pins for a hop: the pins are the target's own key
            self._check_keys(hop.client, host.model_copy(update={"host_key_fingerprints": []}),
                             note, hop=f"{hop.user}@{hop.host}:{hop.port}")
            hop.connect_timeout = host.connect_timeout_s
            hop = hop.gateway

    def _check_keys(self, client: paramiko.SSHClient, host: HostVars,
                    note: Callable[[str], None] | None, hop: str | None = None) -> None:
        name = self.name
        known = KnownHosts() if hop else self.known
        inventory_file: Path | None = None
        if host.known_hosts:
            inventory_file = Path(host.known_hosts).expanduser()
            if host.host_key == "accept-new" and not inventory_file.exists():
                inventory_file.parent.mkdir(parents=True, exist_ok=True)
                inventory_file.touch(mode=0o644)
            if not inventory_file.is_file():
                raise UnreachableError(
                    name, f"known_hosts file {inventory_file} does not exist",
                    fix="create it (ssh-keyscan) or fix known_hosts in the inventory",
                )
        files = known_hosts_files(self.conn.ssh_config, Path.home())
        if inventory_file is not None:
            files.append(inventory_file)
        texts: list[tuple[Path, str]] = []
        for path in files:
            # All files merge into one set, as ssh reads them all; unreadable ones are
            # skipped, as ssh skips them.
            try:
                texts.append((path, path.read_text(errors="replace")))
            except OSError:
                continue
        # every file's @revoked lines first: a revoked key is known in none of them
        for _, text in texts:
            known.revoked |= revoked_keys(text)
        for path, text in texts:
            if not hop:
                self.key_files.append(path)
            load_known_hosts(text, client.get_host_keys(), path, known)
        unknown: paramiko.MissingHostKeyPolicy = _Strict()
        if host.host_key == "accept-new":
            assert inventory_file is not None  # the inventory defaults it
            unknown = _AcceptNew(inventory_file, note or _stderr_note, known.revoked)
        policy: paramiko.MissingHostKeyPolicy = _Patterns(known, unknown)
        client.set_missing_host_key_policy(_Hop(policy, hop) if hop else policy)

    def _where(self) -> str:
        return f"{self.login_user}@{self.conn.host}:{self.login_port}"

    def _key_name(self) -> str:
        host = str(self.conn.host)
        return host if self.login_port == 22 else f"[{host}]:{self.login_port}"

    def _searched(self) -> str:
        return ", ".join(str(p) for p in self.key_files) or "no readable known_hosts file"

    def _check_revoked(self) -> None:
        key = self._transport().get_remote_server_key()
        if key.get_base64() in self.known.revoked:
            raise _KeyRefused(key, "revoked")

    def _connect(self) -> paramiko.Transport:
        if self.conn.is_connected:
            return self._transport()
        started = time.monotonic()
        try:
            self._open_hops()
            self.conn.open()
            self._check_revoked()
        except paramiko.BadHostKeyException as exc:
            raise UnreachableError(
                self.name, f"host key of {self._where()} does NOT match known_hosts: it "
                f"offers {exc.key.get_name()} {fingerprint(exc.key)}, "
                f"{self._searched()} say {fingerprint(exc.expected_key)}",
                fix="verify the host's identity; if it was reinstalled, remove the old key "
                f"with ssh-keygen -R '{self._key_name()}' -f <file>",
            ) from None
        except _KeyRefused as exc:
            self.conn.close()
            seen = f"{exc.key.get_name()} {fingerprint(exc.key)}"
            if exc.hop:
                raise UnreachableError(
                    self.name, f"host key of ProxyJump hop {exc.hop} on the way to "
                    f"{self._where()} ({seen}) is {exc.why.partition(':')[0]}: in none of "
                    f"{self._searched()}" if exc.why == "unknown" else
                    f"host key of ProxyJump hop {exc.hop} on the way to {self._where()} "
                    f"({seen}) is refused: {exc.why}",
                    fix="a hop is checked like a host: after verifying it, add its key "
                    "to ~/.ssh/known_hosts or the inventory's known_hosts (ssh-keyscan), "
                    "or trust on first use with host_key: accept-new",
                ) from None
            if exc.why == "not pinned":
                raise UnreachableError(
                    self.name, f"host key of {self._where()} ({seen}) is not one of "
                    f"host_key_fingerprints {', '.join(self.host.host_key_fingerprints)}",
                    fix="verify the host's identity; if its key really changed, pin the new "
                    "fingerprint (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub on the host)",
                ) from None
            if exc.why.startswith("cert-authority:"):
                where = exc.why.partition(":")[2]
                raise UnreachableError(
                    self.name, f"host key of {self._where()} ({seen}) is vouched for only "
                    f"by @cert-authority {where}: vigil's SSH (paramiko) cannot check host "
                    "certificates, so it trusts no host on a CA's word",
                    fix="after checking the key against the host's certificate, add it: "
                    f"ssh-keyscan -p {self.login_port} {self.conn.host} >> "
                    f"~/.ssh/known_hosts; or pin it with host_key_fingerprints: "
                    f"[{fingerprint(exc.key)}]",
                ) from None
            if exc.why == "revoked":
                raise UnreachableError(
                    self.name, f"host key of {self._where()} ({seen}) is marked @revoked "
                    f"in {self._searched()}",
                    fix="the host must get a new key; never trust a revoked one",
                ) from None
            raise UnreachableError(
                self.name, f"host key of {self._where()} ({seen}) is unknown: in none of "
                f"{self._searched()}",
                fix=f"after verifying it: ssh-keyscan -p {self.login_port} "
                f"{self.conn.host} >> ~/.ssh/known_hosts; or pin it with "
                f"host_key_fingerprints: [{fingerprint(exc.key)}]; or trust on first use "
                "with host_key: accept-new",
            ) from None
        except paramiko.SSHException as exc:
            text = str(exc)
            # A banner timeout kills paramiko's transport thread; the client then only
            # reports "No existing session".
            quick = time.monotonic() - started < self.host.connect_timeout_s / 2
            if quick and "banner" in text.lower():
                raise UnreachableError(
                    self.name, f"{self._where()} closed the connection before its SSH banner "
                    f"(after {time.monotonic() - started:.1f} s)",
                    fix="sshd refused this client at once: its MaxStartups, tcp wrappers or "
                    "a ban (fail2ban); check the host's sshd log",
                ) from None
            if "banner" in text.lower() or "no existing session" in text.lower():
                raise UnreachableError(
                    self.name,
                    f"timed out after {self.host.connect_timeout_s:g} s waiting for the SSH "
                    f"banner of {self._where()} (the port answers, sshd does not)",
                    fix="check that sshd (not another service) listens there and is not "
                    "overloaded, or raise connect_timeout_s",
                ) from None
            if isinstance(exc, paramiko.AuthenticationException):
                raise UnreachableError(
                    self.name, f"SSH authentication failed for {self._where()}",
                    fix="check ssh_user and ssh_key in the inventory",
                ) from None
            raise UnreachableError(self.name, f"SSH to {self._where()} failed: {text}") from None
        except TimeoutError:
            raise UnreachableError(
                self.name,
                f"timed out after {self.host.connect_timeout_s:g} s connecting to {self._where()}",
                fix="check the address and that sshd is up, or raise connect_timeout_s",
            ) from None
        except OSError as exc:
            raise UnreachableError(
                self.name, f"cannot connect to {self._where()}: {_os_reason(exc)}",
                fix="check the address and port, and that sshd runs there",
            ) from None
        return self._transport()

    def _open_hops(self) -> None:
        """Open the ProxyJump hops first, the nearest first, so that a hop that does not
        resolve, refuses or times out is named as the hop (Fabric opens them inside the
        target's connect, where its error reads as the target's own)."""
        from fabric import Connection

        hops: list[Connection] = []
        hop = self.conn.gateway
        while isinstance(hop, Connection):
            hops.append(hop)
            hop = hop.gateway
        for hop in reversed(hops):
            if hop.is_connected:
                continue
            where = f"ProxyJump hop {hop.user}@{hop.host}:{hop.port} on the way to " \
                f"{self._where()}"
            try:
                hop.open()
            except (paramiko.BadHostKeyException, _KeyRefused):
                raise  # _connect names the hop's key problem
            except socket.gaierror as exc:
                raise UnreachableError(
                    self.name, f"{where}: {hop.host} does not resolve ({exc.strerror})",
                    fix="fix the hop's name in ~/.ssh/config (ProxyJump / its Host block)",
                ) from None
            except paramiko.AuthenticationException:
                raise UnreachableError(
                    self.name, f"{where}: SSH authentication failed at the hop",
                    fix="check the hop's User and IdentityFile in ~/.ssh/config",
                ) from None
            except TimeoutError:
                raise UnreachableError(
                    self.name, f"{where}: timed out after {hop.connect_timeout:g} s",
                    fix="check that the hop is up and reachable, or raise connect_timeout_s",
                ) from None
            except (paramiko.SSHException, OSError) as exc:
                why = _os_reason(exc) if isinstance(exc, OSError) else str(exc)
                raise UnreachableError(self.name, f"{where}: {why}",
                                       fix="check the hop's address and port, and that "
                                       "sshd runs there") from None

    def _transport(self) -> paramiko.Transport:
        transport = self.conn.client.get_transport()
        assert transport is not None
        return cast(paramiko.Transport, transport)

    def _channel(self, command: str) -> paramiko.Channel:
        transport = self._connect()
        try:
            channel = transport.open_session()
            channel.exec_command(command)
        except (paramiko.SSHException, EOFError, OSError):
            # the connection died just now (its reader thread has marked it inactive)
            for guard in self.guards:
                guard()
            raise UnreachableError(
                self.name, f"connection to {self._where()} lost before a command could run",
                fix="check the host and the network, then run again",
            ) from None
        return channel

    def run(self, command: str, *, stdin: str = "", timeout: float | None = None,
            on_stderr: Callable[[str], None] | None = None) -> Result:
        for guard in self.guards:
            guard()
        self.round_trips += 1
        channel = self._channel(command)
        if stdin:
            channel.sendall(stdin.encode())
        channel.shutdown_write()
        out, err = bytearray(), bytearray()
        told = 0  # bytes of err already passed to on_stderr
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            got = False
            while channel.recv_ready():
                out += channel.recv(65536)
                got = True
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
                got = True
                if on_stderr is not None:
                    told = _tell_lines(err, told, on_stderr)
            if channel.exit_status_ready() and not channel.recv_ready() \
                    and not channel.recv_stderr_ready():
                break
            if deadline is not None and time.monotonic() > deadline:
                channel.close()
                raise HostError(self.name, f"command timed out after {timeout:.0f} s")
            if not got:
                select.select([channel], [], [], 0.05)
        status = channel.recv_exit_status()
        channel.close()
        if status == -1 and not self._transport().is_active():
            # the connection ended under the command (sshd killed, network gone)
            for guard in self.guards:
                guard()
            raise UnreachableError(
                self.name, f"connection to {self._where()} lost while a command ran; it "
                "may have run in part", fix="check the host and the network, then run again",
            )
        return Result(out.decode(errors="replace"), err.decode(errors="replace"), status)

    def hold(self, command: str) -> _SSHHeld:
        self.round_trips += 1
        return _SSHHeld(self._channel(command))

    def close(self) -> None:
        self.conn.close()


def _tell_lines(err: bytearray, told: int, on_stderr: Callable[[str], None]) -> int:
    """Pass each complete line of ``err`` past ``told`` to ``on_stderr``; the new mark."""
    end = err.rfind(b"\n") + 1
    if end > told:
        for line in bytes(err[told:end]).decode(errors="replace").splitlines():
            on_stderr(line)
        return end
    return told


def _os_reason(exc: OSError) -> str:
    """The system's own words: paramiko wraps a refused connect per address it tried
    ("Unable to connect to port 22 on 10.0.0.5") around the errno that says why."""
    inner = getattr(exc, "errors", None)
    if isinstance(inner, dict) and inner:
        words = {e.strerror or str(e) for e in inner.values() if isinstance(e, OSError)}
        if words:
            return "; ".join(sorted(words))
    return exc.strerror or str(exc)


def connect(name: str, host: HostVars) -> Transport:
    if host.connection == "local":
        return LocalTransport(name)
    return SSHTransport(name, host)


# -- the deploy lock -------------------------------------------------------------------

_LOCK_SCRIPT = r"""
set -u
mkdir -p "$(dirname "$LOCK")" || exit 77
exec 9>>"$LOCK" || exit 77
if ! flock -n 9; then
  echo "WAIT $(cat "$LOCK.owner" 2>/dev/null)"
  flock -w "$WAIT" 9 || { echo TIMEOUT; exit 75; }
fi
printf '%s\n' "$OWNER" > "$LOCK.owner"
echo LOCKED
cat >/dev/null
"""


@contextlib.contextmanager
def host_lock(
    transport: Transport,
    host: HostVars,
    path: str,
    owner: str,
    timeout: float,
    on_wait: Callable[[str], None],
) -> Iterator[None]:
    """Hold the host's flock while the block runs; released when the channel closes.

    The lock lives in a process on the host that keeps it only while our connection
    does, so a deploy that dies (killed, network gone) cannot leave a stale lock. The
    other side of that: when the connection drops mid-deploy the lock is gone, and
    another deploy may start. So while the block runs, every command on this transport
    first checks the lock's channel is alive, and a lost lock stops the host with
    LockLostError; nothing more is done there.
    """
    script = (
        f"LOCK={shlex.quote(path)} WAIT={int(timeout)} OWNER={shlex.quote(owner)} "
        f"bash -c {shlex.quote(_LOCK_SCRIPT)}"
    )
    held = transport.hold(privileged(script, host, transport))
    try:
        deadline = time.monotonic() + timeout + 30
        while True:
            line = held.readline(timeout=max(1.0, deadline - time.monotonic()))
            if line is None or line == "":
                held.release()
                if line is None:
                    raise LockTimeoutError(transport.name, "no answer from the lock holder")
                raise PermissionDeniedError(
                    transport.name, f"permission denied creating the deploy lock {path}",
                    fix="deploy as root, or set sudo: true for a user with sudo rights",
                )
            line = line.strip()
            if line == "LOCKED":
                break
            if line.startswith("WAIT"):
                holder = line[4:].strip() or "another deploy"
                on_wait(f"waiting up to {timeout:.0f} s for the deploy lock held by {holder}")
            elif line == "TIMEOUT":
                held.release()
                raise LockTimeoutError(
                    transport.name, f"deploy lock {path} still held after {timeout:.0f} s",
                    fix="wait for the other deploy to finish, or raise lock_timeout_s",
                )

        def guard() -> None:
            if not held.alive():
                raise LockLostError(
                    transport.name,
                    f"lost the deploy lock {path}: the connection holding it ended "
                    "(sshd session killed or network gone); another deploy may act on "
                    "this host now, so this one stopped before its next step",
                    fix="check the host and the network; then deploy again (it plans "
                    "from the host's facts, so it completes a half-done change)",
                )

        guards: list[Callable[[], None]] | None = getattr(transport, "guards", None)
        if guards is not None:
            guards.append(guard)
        try:
            yield
        finally:
            if guards is not None:
                guards.remove(guard)
    finally:
        held.release()


def lock_owner() -> str:
    """Who holds a lock, as a waiting deploy is told."""
    since = time.strftime("%H:%M:%S")
    return f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} since {since}"


def deploy_lock(transport: Transport, host: HostVars,
                on_wait: Callable[[str], None]) -> contextlib.AbstractContextManager[None]:
    """The service's deploy lock, as deploy and rollback take it."""
    return host_lock(transport, host, lock_path(host), lock_owner(), host.lock_timeout_s,
                     on_wait)
