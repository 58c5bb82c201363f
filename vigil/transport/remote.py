"""Call the host agent: one verb, one JSON request on stdin, one JSON reply: one round trip.
The agent itself travels on stdin too, ahead of the request (``BOOTSTRAP``).

Every host-side step (facts, apply, rollback, status, packages, probe, smoke, history,
logs) is a verb of the one stdlib agent (vigil/host/, joined into one script by
vigil/host/payload.py), called the same way.
"""

from __future__ import annotations

import json
import re
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
        out: dict[str, Any] = parse_json(result.stdout)
    except ValueError as exc:
        raise HostError(
            name, f"agent {verb} printed no JSON: {result.stdout[-300:]!r}"
            if not isinstance(exc, TooDeep) else f"agent {verb} replied JSON {exc}"
        ) from None
    if not isinstance(out, dict):
        raise HostError(name, f"agent {verb} replied {type(out).__name__}, not an object")
    if "agent_error" in out:
        # the agent refused the request as a whole before acting on it
        raise HostError(name, f"agent {verb}: {out['agent_error']}",
                        fix="a request vigil's own agent does not accept is a vigil bug "
                        "(or a mixed-version agent); nothing was done by this call")
    return out


# No reply of vigil's agent nests half as deep; a hostile one nested 200k deep ended a whole
# fleet's verify in RecursionError.
JSON_DEPTH_MAX = 128
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


class TooDeep(ValueError):
    pass


def parse_json(text: str) -> Any:
    """A host's JSON as the controller may hold it: nested at most JSON_DEPTH_MAX deep
    (TooDeep, a ValueError, past it) and with no lone surrogate ("\\ud800" escapes the
    host chose: each becomes U+FFFD), so every report and trace can write it as UTF-8.
    ValueError when it is not JSON."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise TooDeep(f"nested deeper than {JSON_DEPTH_MAX} levels") from None
    # a surrogate comes only from an escape (the text was decoded with errors="replace")
    surrogates = _ESCAPED_SURROGATE.search(text) is not None \
        or _SURROGATE.search(text) is not None
    return _checked(data, surrogates)


def _clean(text: str) -> str:
    return _SURROGATE.sub("\ufffd", text)


def _checked(data: Any, surrogates: bool) -> Any:
    """``data`` with its depth checked and, with ``surrogates``, lone surrogates replaced:
    iteratively (a deep value must not overflow this walk either)."""
    if surrogates and isinstance(data, str):
        return _clean(data)
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > JSON_DEPTH_MAX:
            raise TooDeep(f"nested deeper than {JSON_DEPTH_MAX} levels")
        if isinstance(node, dict):
            if surrogates:
                items = [(_clean(k), _clean(v) if isinstance(v, str) else v)
                         for k, v in node.items()]
                node.clear()
                node.update(items)
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                if isinstance(v, (dict, list)):
                    stack.append((v, depth + 1))
                elif surrogates and isinstance(v, str):
                    node[i] = _clean(v)
    return data


def progress_of(line: str) -> dict[str, Any] | None:
    """An agent's progress line on stderr (vigil/host/progress.py), else None."""
    if not line.startswith(PROGRESS_MARK):
        return None
    try:
        told = json.loads(line[len(PROGRESS_MARK):])
    except (ValueError, RecursionError):  # a host's line: never a traceback here
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
