"""The agent's stream verb on a real lab host (systemd, journald, sshd): a dropped SSH
connection leaves nothing running there. No vLLM start: the unit followed is the lab
host's own sshd (read only).

The stream with the real vLLM CPU build (a channel dropped mid-start, resumed without
a line lost or repeated; kill -9 of the engine core → `engine_killed`) is in
tests/lab/test_verify_live.py, on the same start."""

from __future__ import annotations

import json
import time

import pytest

from lab import hosts as lab
from vigil.transport.remote import agent_command, agent_stdin

pytestmark = [pytest.mark.lab, pytest.mark.drives(1, 2)]

INDEX = 1


def alive(pid: int) -> bool:
    rc, _, _ = lab.run(INDEX, f"test -d /proc/{pid}")
    return rc == 0


def test_a_dropped_connection_ends_the_stream_on_the_host(lab_hosts: object) -> None:
    client = lab.connect(INDEX)
    try:
        channel = client.get_transport().open_session()  # type: ignore[union-attr]
        channel.exec_command(agent_command("stream"))
        channel.sendall(agent_stdin(json.dumps({"unit": "ssh.service", "interval_s": 0.5})
                                    + "\n").encode())
        f = channel.makefile("rb")
        hello = json.loads(f.readline())
        assert hello["k"] == "hello"
        snaps = [json.loads(f.readline()) for _ in range(3)]
        assert all(s["k"] == "snap" and s["snap"]["unit"]["active_state"] == "active"
                   for s in snaps)
        pid = int(hello["pid"])
        assert alive(pid)
        _, children, _ = lab.run(INDEX, f"pgrep -P {pid}")
        (journalctl,) = (int(x) for x in children.split())
    finally:
        # No EOF, no goodbye: the TCP connection just goes (a network drop, a killed
        # controller). sshd ends the session; the stream sees its stdin close.
        sock = client.get_transport().sock  # type: ignore[union-attr]
        sock.close()
        client.close()
    deadline = time.monotonic() + 30
    while (alive(pid) or alive(journalctl)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(pid), "the stream outlived its connection"
    assert not alive(journalctl), "journalctl -f outlived the stream"
