"""Connections to hosts: SSH through Fabric/paramiko, or the local machine.

A transport runs one shell command per call with optional stdin, counts round trips
(the deploy benchmark reports them) and can hold the host's deploy lock for as long as
a context is open. Host keys are checked against the user's known_hosts (plus the
inventory's ``known_hosts`` file) unless the inventory opts out with
``host_key_check: false``.
"""

from __future__ import annotations

import contextlib
import logging
import select
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

import paramiko

from vigil.desired.config import HostVars
from vigil.errors import HostError, LockTimeoutError, PermissionDeniedError, UnreachableError

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

    def run(self, command: str, *, stdin: str = "", timeout: float | None = None) -> Result: ...

    def hold(self, command: str) -> Held:
        """Start a command whose life is a resource; stdin stays open until release."""
        ...

    def close(self) -> None: ...


class Held(Protocol):
    """A long-running command whose life is a resource (the deploy lock)."""

    def readline(self, timeout: float) -> str | None: ...

    def release(self) -> None: ...


def privileged(command: str, host: HostVars) -> str:
    """Run as root: directly for root, through non-interactive sudo when allowed."""
    if host.ssh_user == "root" or host.connection == "local" or not host.sudo:
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

    def release(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class LocalTransport:
    def __init__(self, name: str) -> None:
        self.name = name
        self.round_trips = 0

    def run(self, command: str, *, stdin: str = "", timeout: float | None = None) -> Result:
        self.round_trips += 1
        try:
            proc = subprocess.run(
                ["bash", "-c", command], input=stdin, capture_output=True, text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise HostError(self.name, f"command timed out after {timeout:.0f} s") from None
        return Result(proc.stdout, proc.stderr, proc.returncode)

    def hold(self, command: str) -> _LocalHeld:
        self.round_trips += 1
        proc = subprocess.Popen(
            ["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        return _LocalHeld(proc)

    def close(self) -> None:
        pass


# -- ssh -----------------------------------------------------------------------------


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

    def release(self) -> None:
        with contextlib.suppress(Exception):
            self.channel.shutdown_write()  # EOF: the holder's `cat` ends, flock is released
            self.channel.recv_exit_status()
        self.channel.close()


class SSHTransport:
    def __init__(self, name: str, host: HostVars) -> None:
        from fabric import Connection

        self.name = name
        self.host = host
        self.round_trips = 0
        connect_kwargs: dict[str, object] = {"banner_timeout": host.connect_timeout_s,
                                             "auth_timeout": host.connect_timeout_s}
        if host.ssh_key:
            connect_kwargs["key_filename"] = str(Path(host.ssh_key).expanduser())
        self.conn = Connection(
            host.address,
            user=host.ssh_user,
            port=host.ssh_port,
            connect_timeout=host.connect_timeout_s,
            connect_kwargs=connect_kwargs,
        )
        client = self.conn.client
        if host.host_key_check:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            if host.known_hosts:
                path = Path(host.known_hosts).expanduser()
                if not path.is_file():
                    raise UnreachableError(
                        name, f"known_hosts file {path} does not exist",
                        fix="create it (ssh-keyscan) or fix known_hosts in the inventory",
                    )
                client.load_host_keys(str(path))
        else:
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())

    def _where(self) -> str:
        return f"{self.host.ssh_user}@{self.host.address}:{self.host.ssh_port}"

    def _connect(self) -> paramiko.Transport:
        if self.conn.is_connected:
            return self._transport()
        try:
            self.conn.open()
        except paramiko.BadHostKeyException:
            raise UnreachableError(
                self.name, f"host key of {self._where()} does NOT match known_hosts",
                fix="verify the host's identity; if it was reinstalled, remove the old key "
                "with ssh-keygen -R",
            ) from None
        except paramiko.SSHException as exc:
            text = str(exc)
            if "not found in known_hosts" in text:
                raise UnreachableError(
                    self.name, f"host key of {self._where()} is unknown",
                    fix=f"add it: ssh-keyscan -p {self.host.ssh_port} {self.host.address} "
                    ">> ~/.ssh/known_hosts (after verifying it), or set known_hosts",
                ) from None
            # A banner timeout kills paramiko's transport thread; the client then only
            # reports "No existing session".
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
                self.name, f"cannot connect to {self._where()}: {exc.strerror or exc}",
                fix="check the address and port, and that sshd runs there",
            ) from None
        return self._transport()

    def _transport(self) -> paramiko.Transport:
        transport = self.conn.client.get_transport()
        assert transport is not None
        return cast(paramiko.Transport, transport)

    def _channel(self, command: str) -> paramiko.Channel:
        channel = self._connect().open_session()
        channel.exec_command(command)
        return channel

    def run(self, command: str, *, stdin: str = "", timeout: float | None = None) -> Result:
        self.round_trips += 1
        channel = self._channel(command)
        if stdin:
            channel.sendall(stdin.encode())
        channel.shutdown_write()
        out, err = bytearray(), bytearray()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            got = False
            while channel.recv_ready():
                out += channel.recv(65536)
                got = True
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
                got = True
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
        return Result(out.decode(errors="replace"), err.decode(errors="replace"), status)

    def hold(self, command: str) -> _SSHHeld:
        self.round_trips += 1
        return _SSHHeld(self._channel(command))

    def close(self) -> None:
        self.conn.close()


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
    does, so a deploy that dies (killed, network gone) cannot leave a stale lock.
    """
    script = (
        f"LOCK={shlex.quote(path)} WAIT={int(timeout)} OWNER={shlex.quote(owner)} "
        f"bash -c {shlex.quote(_LOCK_SCRIPT)}"
    )
    held = transport.hold(privileged(script, host))
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
        yield
    finally:
        held.release()
