"""Call the host agent: one verb, one JSON request on stdin, one JSON reply: one round trip."""

from __future__ import annotations

import json
import shlex
from functools import cache
from pathlib import Path
from typing import Any

from vigil.desired.config import HostVars
from vigil.errors import CommandError, HostError
from vigil.transport.ssh import Transport, privileged


@cache
def agent_source() -> str:
    return (Path(__file__).resolve().parents[1] / "host" / "agent.py").read_text()


def call(
    transport: Transport,
    host: HostVars,
    verb: str,
    request: dict[str, Any],
    *,
    timeout: float | None = 120,
) -> dict[str, Any]:
    command = privileged(f"python3 -c {shlex.quote(agent_source())} {verb}", host)
    result = transport.run(command, stdin=json.dumps(request), timeout=timeout)
    if result.exit_status != 0:
        if result.exit_status == 127 or "python3: command not found" in result.stderr:
            raise HostError(transport.name, "python3 is not installed on the host",
                            fix="install python3 (vigil's host agent needs it)")
        if "sudo:" in result.stderr and "password" in result.stderr:
            raise HostError(transport.name, "sudo asks for a password",
                            fix="allow passwordless sudo for the deploy user, or deploy as root")
        raise CommandError(transport.name, f"vigil agent {verb}", result.exit_status,
                           result.stderr)
    try:
        reply: dict[str, Any] = json.loads(result.stdout)
    except ValueError:
        raise HostError(
            transport.name, f"agent {verb} printed no JSON: {result.stdout[-300:]!r}"
        ) from None
    return reply
