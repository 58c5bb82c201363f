"""Bytes the controller sends per agent call (command line + stdin), by verb: the
baseline for issue 30.1 (the agent once per version). Run: .venv/bin/python bench/agent/bytes.py
"""

from __future__ import annotations

import json

from vigil.desired.config import HostVars
from vigil.transport import remote
from vigil.transport.base import privileged

REQUESTS = {
    "status": {"unit": "vllm", "port": 8000, "unit_path": "/etc/systemd/system/vllm.service"},
    "probe": {"unit": "vllm.service", "max_lines": 2000, "port": 8000, "user": "vllm",
              "cache_dirs": ["/var/cache/vllm/torch_compile_cache"], "cursor": None,
              "api_key": None},
}

for verb, req in REQUESTS.items():
    for who, hv in (("root", HostVars()), ("sudo", HostVars(ssh_user="deploy", sudo=True))):
        command = privileged(remote.agent_command(verb, "/opt/vigil/envs/current/bin/python"),
                             hv)
        stdin = remote.agent_stdin(json.dumps(req))
        request = len(json.dumps(req).encode())
        print(f"{verb:7} {who:5} command {len(command.encode()):5} B  stdin "
              f"{len(stdin.encode()):7} B (request {request} B)  per call "
              f"{len(command.encode()) + len(stdin.encode()):7} B")
