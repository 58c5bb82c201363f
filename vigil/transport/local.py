"""The local machine as a transport (``connection: local``): bash, no SSH.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable

from vigil.errors import (
    HostError,
)
from vigil.transport.base import Closing, Result


class _LocalHeld:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.buffer = b""

    def readline(self, timeout: float) -> str | None:
        """The next line; None when none came within ``timeout``, "" at the end. Read from
        the descriptor into a buffer of our own: select() on a buffered reader blocks
        while lines it already holds wait unread (a host that sends many at once)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            self.buffer += chunk
        line, nl, self.buffer = self.buffer.partition(b"\n")
        return (line + nl).decode(errors="replace")

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
            on_stderr: Callable[[str], None] | None = None,
            limit: int | None = None) -> Result:
        result = self._run(command, stdin, timeout, on_stderr)
        # the controller's own machine: checked after the fact, as a host's reply is
        if limit is not None and len(result.stdout.encode(errors="replace")) > limit:
            raise HostError(self.name, f"the reply is over {limit} bytes",
                            fix="a vigil agent's reply is never that large")
        return result

    def _run(self, command: str, stdin: str, timeout: float | None,
             on_stderr: Callable[[str], None] | None) -> Result:
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
