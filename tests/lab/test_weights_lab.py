"""A truncated shard on a real lab host: deploy refuses it from the facts round trip,
naming the file and both sizes, and the host is exactly as it was (no unit written, no
environment installed, the service not restarted)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from lab import hosts as lab
from tests.paths import REPO

pytestmark = [pytest.mark.lab, pytest.mark.drives(1, 2)]

INDEX = 2
HOST = lab.host_name(INDEX)


def state() -> str:
    """Everything a deploy may change on the host."""
    code, out, err = lab.run(INDEX, (
        "for f in /etc/systemd/system/vllm.service /etc/vigil/vllm.env; do "
        "  if [ -e $f ]; then sha256sum $f; else echo missing $f; fi; done; "
        "readlink /opt/vigil/envs/current || echo no-link; ls /opt/vigil/envs 2>/dev/null; "
        "systemctl show vllm -p MainPID -p ActiveState -p NRestarts"))
    assert code == 0, err
    return out


@pytest.fixture
def cut_model(lab_hosts: list[lab.HostStatus]) -> Iterator[tuple[str, int, int]]:
    assert HOST in {h.name for h in lab_hosts}
    with open(lab.lab_dir() / "hosts" / f"{HOST}.tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        src = lab.models_dir() / lab.MODEL_NAME
        name = f"tiny-cut-{os.getpid()}"
        dest = lab.models_dir() / name
        shutil.copytree(src, dest)
        shard = dest / "model.safetensors"
        full = shard.stat().st_size
        with shard.open("r+b") as fh:
            fh.truncate(full - 4096)
        try:
            yield f"/srv/models/{name}", full, full - 4096
        finally:
            shutil.rmtree(dest)


def test_deploy_refuses_a_truncated_shard_before_touching_the_host(
    cut_model: tuple[str, int, int],
) -> None:
    path, full, cut = cut_model
    before = state()
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "invoke"), "deploy", "--model", "tiny-cpu",
         "--hosts", HOST, "--set", f"path={path}"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out  # refused: nothing was touched
    assert f"model directory {path} would not load" in out, out
    assert (f"model.safetensors is truncated: {cut} bytes on disk, its header says {full}"
            in out), out
    assert state() == before
