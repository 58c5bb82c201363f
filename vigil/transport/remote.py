"""Call the host agent: one verb, one JSON request on stdin, one JSON reply: one round trip.
The agent itself travels on stdin too, ahead of the request (``BOOTSTRAP``).

Every host-side step (facts, apply, rollback, status, packages, probe, smoke, history,
logs) is a verb of the one stdlib agent (vigil/host/, joined into one script by
vigil/host/payload.py), called the same way.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from functools import cache
from typing import Any

from vigil.desired.config import HostVars
from vigil.errors import CommandError, HostError
from vigil.host import payload
from vigil.host.progress import PROGRESS_MARK
from vigil.transport.base import Result, Transport, privileged


@cache
def agent_source() -> str:
    return payload.source()


# The agent travels on stdin ahead of the request, as Ansible's pipelining sends a module:
# the command line is this constant bootstrap whatever the agent's size (Linux caps one
# argument at 128 KiB). It reads "<length>\n" and that many bytes of agent with os.read,
# so nothing past the agent is buffered away from the verb (the stream's channel included).
BOOTSTRAP = (
    "import os,sys\n"
    "h=b''\n"
    "while h[-1:]!=b'\\n':\n"
    " c=os.read(0,1)\n"
    " if not c:sys.exit('vigil: no agent on stdin')\n"
    " h+=c\n"
    "n=int(h);b=b''\n"
    "while len(b)<n:\n"
    " c=os.read(0,n-len(b))\n"
    " if not c:sys.exit('vigil: the agent was cut short on stdin')\n"
    " b+=c\n"
    "exec(compile(b,'vigil-agent','exec'),{'__name__':'__main__'})\n"
)


MiB = 1024 * 1024
# The most a verb's reply may hold (stdout bytes): a reply past it is a HostError for that
# host, read no further (a hostile or broken host's endless reply never fills memory).
# Small for a verb that reads a few files; a cache chunk is CHUNK_MAX (16 MiB) in base64.
REPLY_MAX: dict[str, int] = {
    "status": 4 * MiB, "facts": 8 * MiB, "role_facts": 4 * MiB, "packages": 8 * MiB,
    "rollback": 4 * MiB, "smoke": 4 * MiB, "reach_listen": 1 * MiB, "reach_connect": 1 * MiB,
    "cache_list": 8 * MiB, "cache_write": 1 * MiB, "cache_drop": 1 * MiB,
    "cache_pack": 8 * MiB, "cache_read": 24 * MiB,
    "probe": 32 * MiB, "logs": 32 * MiB, "history": 32 * MiB, "apply": 16 * MiB,
}
REPLY_MAX_OTHER = 16 * MiB


def reply_max(verb: str) -> int:
    return REPLY_MAX.get(verb, REPLY_MAX_OTHER)


def agent_command(verb: str, python: str | None = None) -> str:
    """The shell command running one verb: with `python` (the service environment's, where
    nvidia-ml-py lives) when it exists there, else the host's python3. Its stdin must
    start with ``agent_stdin``."""
    run = f"-c {shlex.quote(BOOTSTRAP)} {shlex.quote(verb)}"
    if python is None:
        return f"python3 {run}"
    return f'P={shlex.quote(python)}; [ -x "$P" ] || P=python3; "$P" {run}'


def agent_stdin(text: str) -> str:
    """The agent, then the verb's own input. The agent is ASCII (a test keeps it so): its
    length in characters is its length in bytes under any locale."""
    source = agent_source()
    return f"{len(source)}\n{source}{text}"


def verb_input(stdin: str) -> str:
    """What the verb itself reads of ``agent_stdin(text)``: text (for test doubles)."""
    length, _, rest = stdin.partition("\n")
    return rest[int(length):]


def reply(name: str, verb: str, result: Result) -> dict[str, Any]:
    """The agent's JSON reply, or one clear error naming what failed on the host."""
    if result.exit_status != 0:
        if result.exit_status == 127 or "python3: command not found" in result.stderr:
            raise HostError(name, "python3 is not installed on the host",
                            fix="install python3 (vigil's host agent needs it)")
        if "sudo:" in result.stderr and "password" in result.stderr:
            raise HostError(name, "sudo asks for a password",
                            fix="allow passwordless sudo for the deploy user, or deploy as root")
        raise CommandError(name, f"vigil agent {verb}", result.exit_status, result.stderr)
    try:
        out: dict[str, Any] = json.loads(result.stdout)
    except ValueError:
        raise HostError(
            name, f"agent {verb} printed no JSON: {result.stdout[-300:]!r}"
        ) from None
    if not isinstance(out, dict):
        raise HostError(name, f"agent {verb} replied {type(out).__name__}, not an object")
    if "agent_error" in out:
        # the agent refused the request as a whole before acting on it
        raise HostError(name, f"agent {verb}: {out['agent_error']}",
                        fix="a request vigil's own agent does not accept is a vigil bug "
                        "(or a mixed-version agent); nothing was done by this call")
    return out


def progress_of(line: str) -> dict[str, Any] | None:
    """An agent's progress line on stderr (vigil/host/progress.py), else None."""
    if not line.startswith(PROGRESS_MARK):
        return None
    try:
        told = json.loads(line[len(PROGRESS_MARK):])
    except ValueError:
        return None
    return told if isinstance(told, dict) else None


def call_with(
    transport: Transport,
    as_root: Callable[[str], str],
    verb: str,
    request: dict[str, Any],
    *,
    timeout: float | None = 120,
    python: str | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """`call` for a caller that holds a privilege wrapper instead of the host's variables."""
    command, stdin = as_root(agent_command(verb, python)), agent_stdin(json.dumps(request))
    limit = reply_max(verb)
    if on_progress is None:
        result = transport.run(command, stdin=stdin, timeout=timeout, limit=limit)
    else:
        def told(line: str) -> None:
            progress = progress_of(line)
            if progress is not None:
                on_progress(progress)
        result = transport.run(command, stdin=stdin, timeout=timeout, on_stderr=told,
                               limit=limit)
    # progress is not an error: a failure's message keeps only the rest of stderr
    kept = "".join(ln for ln in result.stderr.splitlines(keepends=True)
                   if not ln.startswith(PROGRESS_MARK))
    return reply(transport.name, verb, Result(result.stdout, kept, result.exit_status))


def call(
    transport: Transport,
    host: HostVars,
    verb: str,
    request: dict[str, Any],
    *,
    timeout: float | None = 120,
    python: str | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    return call_with(transport, lambda c: privileged(c, host, transport), verb, request,
                     timeout=timeout, python=python, on_progress=on_progress)
