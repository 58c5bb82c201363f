"""Drain hooks: commands run on the controller around a host's restart.

E.g. take the host out of a load balancer before its service stops and put it back once
a real completion proved it ready. argv lists, never a shell: the host's name and address
(inventory text) reach the command only as environment variables.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from vigil.desired.targets import Target
from vigil.errors import ConfigError, HostError

HOOK_TIMEOUT_S = 300.0


# -- drain hooks -----------------------------------------------------------------------


@dataclass(frozen=True)
class Hooks:
    """Commands run on the controller around a restart, e.g. to take the host out of a
    load balancer and put it back. argv lists, never a shell: the host's name and
    address (inventory text) reach them only as environment variables."""

    before_stop: tuple[str, ...] = ()
    after_ready: tuple[str, ...] = ()
    timeout_s: float = HOOK_TIMEOUT_S

    @classmethod
    def parse(cls, before_stop: str | None, after_ready: str | None) -> Hooks:
        def argv(text: str | None, flag: str) -> tuple[str, ...]:
            if text is None or not text.strip():
                return ()
            try:
                return tuple(shlex.split(text))
            except ValueError as exc:
                raise ConfigError(f"{text!r}: {exc}", key=flag,
                                  fix="quote the command as you would in a shell") from None

        return cls(argv(before_stop, "--before-stop"), argv(after_ready, "--after-ready"))

    def run(self, which: str, t: Target, say: Callable[[str], None]) -> None:
        argv = self.before_stop if which == "before_stop" else self.after_ready
        if not argv:
            return
        env = {**os.environ, "VIGIL_HOST": t.name, "VIGIL_ADDRESS": t.vars.address,
               "VIGIL_PORT": str(t.vars.port), "VIGIL_HOOK": which}
        say(f"hook {which}: {shlex.join(argv)}")
        # Output goes to files and only the hook's own exit is awaited: a background child
        # the hook leaves running (a `&` in a wrapper script) may keep its output open
        # for hours, and is not the hook running past its time.
        with tempfile.TemporaryFile() as out:
            try:
                proc = subprocess.Popen(list(argv), env=env, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            except FileNotFoundError:
                raise HostError(t.name, f"hook {which}: {argv[0]}: command not found",
                                fix="give the command's path") from None
            except OSError as exc:
                raise HostError(t.name, f"hook {which}: {argv[0]}: {exc.strerror}",
                                fix="give a command this user may run") from None
            try:
                code = proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise HostError(t.name, f"hook {which} ran past {self.timeout_s:.0f} s "
                                "(its process group was killed)") from None
            size = out.seek(0, os.SEEK_END)
            out.seek(max(0, size - 64 * 1024))  # the tail is what an error quotes
            text = out.read().decode("utf-8", "replace")
        if code != 0:
            tail = text.strip().splitlines()[-3:]
            raise HostError(t.name, f"hook {which} exited {code}"
                            + ("".join(f"\n    {ln}" for ln in tail)))
