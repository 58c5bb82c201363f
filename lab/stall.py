"""Arm the lab's stuck-start plugin (lab/plugins/vigil_lab_stall) on a lab host.

The plugin travels as a plain directory (the package plus a ``*.dist-info`` whose
``entry_points.txt`` registers it under ``vllm.general_plugins``: importlib.metadata
finds distributions on sys.path, so vLLM's entry point lookup sees it) into the host's
``/run`` — gone at the next boot — and a runtime drop-in of the unit puts it on
PYTHONPATH and sets ``VIGIL_LAB_STALL``. No pip, no new environment, the stack's pins
untouched, and nothing of it in the inventory: the deployed unit, its env file and so
the start's budget key (config hash of argv + env file) stay those of the good starts,
as in the real incident (same deployment, this start spins), so learned history applies.
"""

from __future__ import annotations

import base64
import io
import shlex
import tarfile
from pathlib import Path

from lab import hosts
from lab.plugins import vigil_lab_stall as plugin
from vigil.errors import ConfigError, HostError

PLUGINS = Path(__file__).resolve().parent / "plugins"
IN_HOST = "/run/vigil-lab/plugins"
DIST_INFO = "vigil_lab_stall-0.1.dist-info"


def dropin_path(unit: str = "vllm") -> str:
    return f"/run/systemd/system/{unit}.service.d/vigil-lab-stall.conf"


def _bundle() -> str:
    """The package and its dist-info as a base64 tar.gz (a few KB)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in ("vigil_lab_stall/__init__.py", f"{DIST_INFO}/METADATA",
                    f"{DIST_INFO}/entry_points.txt"):
            tar.add(PLUGINS / rel, arcname=rel)
    return base64.b64encode(buf.getvalue()).decode()


def dropin(value: str) -> str:
    return ("[Service]\n"
            f"Environment=PYTHONPATH={IN_HOST}\n"
            f"Environment={plugin.ENV}={value}\n")


def arm(i: int, value: str, unit: str = "vllm") -> None:
    """Install the plugin on lab host i and arm it for the unit's next start."""
    try:
        plugin.parse(value)
    except plugin.FaultError as exc:
        raise ConfigError(str(exc), key=plugin.ENV,
                          fix="PHASE[:spin] or PHASE:slow:SECONDS[:STEP]") from exc
    path = dropin_path(unit)
    command = (
        f"set -e; mkdir -p {IN_HOST} {shlex.quote(str(Path(path).parent))}; "
        f"echo {_bundle()} | base64 -d | tar -xz -C {IN_HOST}; chmod -R a+rX /run/vigil-lab; "
        f"printf %s {shlex.quote(dropin(value))} > {shlex.quote(path)}; "
        "systemctl daemon-reload")
    _run(i, command)


def disarm(i: int, unit: str = "vllm") -> None:
    """Remove the drop-in (the plugin's files may stay: without it nothing loads them)."""
    _run(i, f"rm -f {shlex.quote(dropin_path(unit))}; systemctl daemon-reload")


def _run(i: int, command: str) -> None:
    rc, _, err = hosts.run(i, command, timeout=60.0)
    if rc != 0:
        raise HostError(hosts.host_name(i), f"arming the stall plugin failed: {err.strip()}",
                        fix="check the lab host with `invoke lab.status`")
