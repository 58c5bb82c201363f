"""What every transport is: one shell command per call (``Transport``), its result,
a held command (the deploy lock), and running a command as root (``privileged``).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, Self

from vigil.desired.config import HostVars


@dataclass(frozen=True)
class Result:
    stdout: str
    stderr: str
    exit_status: int

class Transport(Protocol):
    name: str
    round_trips: int

    def run(self, command: str, *, stdin: str = "", timeout: float | None = None,
            on_stderr: Callable[[str], None] | None = None,
            limit: int | None = None) -> Result:
        """Run a command; ``on_stderr`` gets each line of its stderr as it comes (the
        agent's progress), which stays in the result too (its tail). ``timeout`` holds
        while output keeps coming; stdout over ``limit`` bytes (the transport's own bound
        when None) is a HostError."""
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
