"""Connections to hosts over SSH (Fabric/paramiko), and ``connect``, which picks the
transport a host's variables ask for. A transport runs one shell command per call with
optional stdin and counts round trips (the deploy benchmark reports them); host keys are
checked by hostkeys.py.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import paramiko

from vigil.desired import sshconfig
from vigil.desired.config import HostVars
from vigil.desired.inputs import read_optional
from vigil.errors import (
    ConfigError,
    HostError,
    UnreachableError,
)
from vigil.transport.base import Closing, Result, Transport
from vigil.transport.hostkeys import (
    KnownHosts,
    _AcceptNew,
    _Hop,
    _KeyRefused,
    _Patterns,
    _Pinned,
    _stderr_note,
    _Strict,
    fingerprint,
    known_hosts_files,
    load_known_hosts,
    revoked_keys,
)
from vigil.transport.local import LocalTransport

# paramiko logs a failed handshake with a traceback on stderr; vigil reports it as one
# clear error instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

logging.getLogger("paramiko").propagate = False

RELEASE_WAIT_S = 10.0
OUTPUT_MAX = 64 * 1024 * 1024  # a command's stdout when the caller sets no limit
ERR_KEEP = 256 * 1024  # the tail of stderr a result keeps (every line is told as it comes)
READ_CHUNK = 65536

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

class SSHTransport(Closing):
    def __init__(self, name: str, host: HostVars,
                 note: Callable[[str], None] | None = None) -> None:
        from fabric import Config, Connection

        self.name = name
        self.host = host
        self.round_trips = 0
        # Checks run before every command (host_lock adds one): a lost lock stops the
        # host here instead of a silent reconnect carrying on without it.
        self.guards: list[Callable[[], None]] = []
        given = host.model_fields_set
        # ~/.ssh/config as OpenSSH resolves it (Include, Match: vigil/desired/sshconfig.py),
        # for the host and each ProxyJump hop; Fabric is handed the result, never the files
        # (its parser follows no Include)
        configs = sshconfig.with_hops(host.address)
        resolved = configs[host.address]
        timeout = host.connect_timeout_s
        said = resolved.get("connecttimeout")
        if "connect_timeout_s" not in given and said and said.isdigit() and int(said) > 0:
            timeout = float(said)
        connect_kwargs: dict[str, object] = {"banner_timeout": timeout,
                                             "auth_timeout": timeout}
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
        self.conn = Connection(
            host.address,
            user=host.ssh_user if "ssh_user" in given else None,
            port=host.ssh_port if "ssh_port" in given else None,
            connect_kwargs=connect_kwargs,
            config=Config(ssh_config=paramiko.SSHConfig.from_text(
                sshconfig.as_paramiko_text(configs))),
        )
        if "ssh_user" not in given and "user" not in self.conn.ssh_config:
            self.conn.user = host.ssh_user
        if "ssh_port" not in given and "port" not in self.conn.ssh_config:
            self.conn.port = host.ssh_port
        self.login_user: str = str(self.conn.user)
        self.login_port: int = int(self.conn.port)
        # Fabric truncates a connect timeout to int (0.5 s -> 0 = none at all).
        self.conn.connect_timeout = timeout
        self.timeout = timeout
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
            hop.connect_timeout = self.timeout
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
            text = read_optional(path)  # a FIFO or /dev/zero is no file: skipped
            if text is not None:
                texts.append((path, text))
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
            quick = time.monotonic() - started < self.timeout / 2
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
                    f"timed out after {self.timeout:g} s waiting for the SSH "
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
                f"timed out after {self.timeout:g} s connecting to {self._where()}",
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
            on_stderr: Callable[[str], None] | None = None,
            limit: int | None = None) -> Result:
        for guard in self.guards:
            guard()
        self.round_trips += 1
        channel = self._channel(command)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            if stdin:
                channel.sendall(stdin.encode())
            channel.shutdown_write()
            out, err, status = self._read(channel, deadline, timeout,
                                          OUTPUT_MAX if limit is None else limit, on_stderr)
        finally:
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

    def _read(self, channel: paramiko.Channel, deadline: float | None,
              timeout: float | None, limit: int,
              on_stderr: Callable[[str], None] | None) -> tuple[bytearray, bytearray, int]:
        """Read a command's stdout and stderr to EOF (not to its exit status, which may
        come before the last of its output), then its exit status. The deadline holds
        while bytes keep coming; stdout over ``limit`` bytes ends the command as one
        error; of stderr only the last ERR_KEEP bytes are kept (each line is told)."""
        out, err = bytearray(), bytearray()
        told = 0  # bytes of err already passed to on_stderr
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise HostError(self.name, f"command timed out after {timeout:.0f} s")
            got = False
            if channel.recv_ready():
                out += channel.recv(min(READ_CHUNK, limit + 1 - len(out)))
                got = True
                if len(out) > limit:
                    raise HostError(
                        self.name, f"the reply is over {_size(limit)}; it was cut off "
                        "there and the command ended", fix="a vigil agent's reply is never "
                        "that large: check the host (a hostile or broken agent, or a "
                        "command that prints without end)")
            if channel.recv_stderr_ready():
                err += channel.recv_stderr(READ_CHUNK)
                got = True
                if on_stderr is not None:
                    told = _tell_lines(err, told, on_stderr)
                if len(err) > 2 * ERR_KEEP:
                    drop = len(err) - ERR_KEEP
                    if on_stderr is not None and told < drop:  # a line longer than kept
                        on_stderr(bytes(err[told:drop]).decode(errors="replace"))
                    told = max(told - drop, 0)
                    del err[:drop]
            if not got:
                # the flags first: bytes reach the buffers before EOF or close is marked
                ended = channel.closed or channel.eof_received
                if ended and not channel.recv_ready() and not channel.recv_stderr_ready():
                    break
                wait = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
                select.select([channel], [], [], max(wait, 0))
        if on_stderr is not None and told < len(err):  # a last line without its newline
            on_stderr(bytes(err[told:]).decode(errors="replace"))
        # EOF came; the exit status follows it (or the channel closed: -1)
        while not channel.status_event.wait(0.2):
            if deadline is not None and time.monotonic() > deadline:
                raise HostError(self.name, f"command timed out after {timeout:.0f} s")
            if channel.closed:
                break
        return out, err, channel.recv_exit_status() if channel.status_event.is_set() else -1

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

def _size(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n} bytes"

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
