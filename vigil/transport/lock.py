"""The host's deploy lock: a held ``flock`` on the host for as long as a context is open.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shlex
import socket
import time
from collections.abc import Callable, Iterator

from vigil.desired.config import HostVars
from vigil.desired.render import lock_path
from vigil.errors import (
    LockLostError,
    LockTimeoutError,
    PermissionDeniedError,
)
from vigil.transport.base import Transport, privileged

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
        told = False  # the wait is said once: the script says WAIT once; a host may repeat it
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
            if line.startswith("WAIT") and not told:
                told = True
                holder = "".join(c for c in line[4:].strip()[:200] if c.isprintable())
                on_wait(f"waiting up to {timeout:.0f} s for the deploy lock held by "
                        f"{holder or 'another deploy'}")
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
