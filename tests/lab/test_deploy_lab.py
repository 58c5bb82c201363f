"""Deploy end to end on a real lab host: SSH, systemd, journald, the real vLLM CPU build.

Runs through the front door (`invoke ...` in a subprocess) like a user or a pipeline.
Host lab1 belongs to this module. The order matters and is the story of a service:
first deploy -> no-op re-deploy -> change -> rollback, with every bad input in between
proven to leave the host exactly as it was.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import hosts as lab
from tests.paths import REPO
from vigil.desired.render import TEMPLATES

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.drives(1, 2)]

INVOKE = str(REPO / ".venv" / "bin" / "invoke")
HOST = "lab1"
INDEX = 1


def invoke(*args: str, env: dict[str, str] | None = None, timeout: float = 900,
           ) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([INVOKE, *args], cwd=REPO, capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def sh(command: str, user: str = "root") -> str:
    code, out, err = lab.run(INDEX, command, user=user)
    assert code == 0, f"{command}: {err}"
    return out


def host_state() -> dict[str, Any]:
    """Everything a deploy may change, to prove a failed one changed nothing."""
    out = sh(
        "for f in /etc/systemd/system/vllm.service /etc/vigil/vllm.env; do "
        "  if [ -e $f ]; then sha256sum $f; else echo missing $f; fi; done; "
        "readlink /opt/vigil/envs/current || echo no-link; "
        "systemctl show vllm -p MainPID -p ActiveState -p NRestarts; "
        "ls /var/lib/vigil/backup/vllm 2>/dev/null | sort; "
        "sha256sum /var/lib/vigil/backup/vllm/* 2>/dev/null || true"
    )
    return {"text": out}


def main_pid() -> int:
    return int(sh("systemctl show vllm -p MainPID --value").strip())


@pytest.fixture(scope="module")
def module_inventory(lab_hosts: list[lab.HostStatus], tmp_path_factory: pytest.TempPathFactory,
                     ) -> Path:
    """The repo's inventory (with the lab fragment) plus a secret for lab1."""
    assert HOST in {h.name for h in lab_hosts}
    target = tmp_path_factory.mktemp("inv") / "inventory"
    shutil.copytree(REPO / "inventory", target)
    (target / "host_vars" / f"{HOST}.yml").write_text("secret_env: [HF_TOKEN]\n")
    return target


@pytest.fixture(scope="module")
def host_exclusive(lab_hosts: list[lab.HostStatus]) -> Iterator[None]:
    """One test session at a time drives lab1 (parallel sessions would restart it
    under each other's feet)."""
    lock = lab.lab_dir() / "hosts" / f"{HOST}.tests.lock"
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="module")
def deployed(host_exclusive: None, module_inventory: Path) -> Iterator[dict[str, Any]]:
    sh("systemctl stop vllm 2>/dev/null; rm -f /etc/systemd/system/vllm.service "
       "/etc/vigil/vllm.env; rm -rf /var/lib/vigil/backup; systemctl daemon-reload")
    env = {"HF_TOKEN": "hf_$ecret 'quoted' \"value\"",
           "INVOKE_VIGIL_INVENTORY": str(module_inventory)}
    proc = invoke("deploy", "--model", "tiny-cpu", "--hosts", HOST, "--json",
                  str(REPO / "state" / "test-deploy-first.json"),
                  env=env)
    yield {"proc": proc, "env": env}
    sh("systemctl stop vllm")


@pytest.fixture
def inventory_copy(module_inventory: Path, tmp_path: Path) -> Path:
    target = tmp_path / "inventory"
    shutil.copytree(module_inventory, target)
    return target


def test_first_deploy_installs_starts_and_serves(deployed: dict[str, Any]) -> None:
    proc = deployed["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((REPO / "state" / "test-deploy-first.json").read_text())
    assert summary["ok"] is True
    assert summary["hosts"][HOST]["status"] == "changed"
    assert summary["hosts"][HOST]["restarted"] is True
    # the unit is where production puts it, enabled and active
    assert "--model=/srv/models/tiny-llama" in sh("cat /etc/systemd/system/vllm.service")
    assert sh("systemctl is-active vllm").strip() == "active"
    assert sh("systemctl is-enabled vllm").strip() == "enabled"
    port = lab.service_port(INDEX)
    assert sh(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/health") == "200"
    reply = json.loads(sh(
        f"curl -s http://127.0.0.1:{port}/v1/completions -H 'Content-Type: application/json' "
        "-d '{\"model\": \"tiny\", \"prompt\": \"Hello\", \"max_tokens\": 5}'"))
    assert reply["usage"]["completion_tokens"] > 0


def test_secrets_reach_the_process_exactly_and_nowhere_else(deployed: dict[str, Any]) -> None:
    secret = deployed["env"]["HF_TOKEN"]
    assert sh("stat -c %a /etc/vigil/vllm.env").strip() == "600"
    environ = sh(f"cat /proc/{main_pid()}/environ").split("\0")
    assert f"HF_TOKEN={secret}" in environ
    assert "VLLM_CACHE_ROOT=/var/cache/vigil/vllm" in environ
    proc = deployed["proc"]
    assert "hf_$ecret" not in proc.stdout + proc.stderr
    assert "hf_$ecret" not in sh("cat /etc/systemd/system/vllm.service")
    assert "hf_$ecret" not in sh("journalctl -u vllm --no-pager -o cat | tail -n 400")


def test_redeploy_unchanged_is_ok_and_keeps_the_process(deployed: dict[str, Any]) -> None:
    before = main_pid()
    proc = invoke("deploy", "--hosts", HOST, "--json", str(REPO / "state" / "t-noop.json"),
                  env=deployed["env"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing to do" in proc.stdout
    result = json.loads((REPO / "state" / "t-noop.json").read_text())["hosts"][HOST]
    assert result["status"] == "ok" and result["restarted"] is False
    assert main_pid() == before
    # one round trip for the lock, one for the facts: that is all a no-op costs
    assert result["round_trips"] == 2


def test_check_mode_shows_diff_and_changes_nothing(deployed: dict[str, Any]) -> None:
    before = host_state()
    proc = invoke("deploy", "--hosts", HOST, "--check", "--set", "max_model_len=256",
                  env=deployed["env"])
    assert proc.returncode == 0, proc.stderr
    assert "would write_unit: ExecStart changed (--max-model-len=1024 -> --max-model-len=256)" \
        in proc.stdout
    assert '+ExecStart=' in proc.stdout and '"--max-model-len=256"' in proc.stdout
    assert host_state() == before


@pytest.mark.parametrize("case", ["malformed_yaml", "unknown_profile", "impossible_tp",
                                  "template_error", "unknown_key"])
def test_bad_input_leaves_the_host_as_it_was(
    deployed: dict[str, Any], inventory_copy: Path, tmp_path: Path, case: str
) -> None:
    before = host_state()
    env = {**deployed["env"], "INVOKE_VIGIL_INVENTORY": str(inventory_copy)}
    args = ["deploy", "--hosts", HOST]
    if case == "malformed_yaml":
        (inventory_copy / "models" / "tiny-cpu.yml").write_text("name: tiny-cpu\nmodel: [\n")
        expect = "tiny-cpu.yml: line 3"
    elif case == "unknown_profile":
        args += ["--model", "tiny-gpu"]
        expect = "unknown model 'tiny-gpu'"
    elif case == "impossible_tp":
        # 4 heads cannot be split over 3 ranks (and a CPU host has no GPUs to spread over)
        args += ["--set", "tensor_parallel_size=3"]
        expect = "does not divide the model's 4 attention heads"
    elif case == "unknown_key":
        (inventory_copy / "host_vars").mkdir(exist_ok=True)
        (inventory_copy / "host_vars" / f"{HOST}.yml").write_text("max_modle_len: 10\n")
        expect = "unknown key 'max_modle_len'"
    else:
        shutil.copytree(TEMPLATES, tmp_path / "templates")  # the built-in ones, shipped
        unit = tmp_path / "templates" / "vllm.service.j2"
        unit.write_text(unit.read_text().replace("{{ exec_start }}", "{{ exec_strat }}"))
        env["INVOKE_VIGIL_TEMPLATES"] = str(tmp_path / "templates")
        expect = "'exec_strat' is undefined"
    proc = invoke(*args, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expect in proc.stderr
    assert "Traceback" not in proc.stderr
    assert host_state() == before


def test_unreachable_host_times_out_naming_it(inventory_copy: Path) -> None:
    # A port that accepts TCP but never speaks SSH: the handshake hangs like a dead host.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    (inventory_copy / "hosts.d" / "ghost.yml").write_text(
        f"hosts:\n  ghost: {{address: 127.0.0.1, ssh_port: {port}, connect_timeout_s: 2,"
        " model: tiny-cpu, stack: lab-cpu}\n")
    try:
        proc = invoke("deploy", "--hosts", "ghost",
                      env={"INVOKE_VIGIL_INVENTORY": str(inventory_copy)}, timeout=60)
    finally:
        listener.close()
    assert proc.returncode == 8  # UNREACHABLE (issue 22.12), not a failed deploy
    assert "ghost: timed out after 2 s waiting for the SSH banner" in proc.stdout
    assert "UNREACHABLE" in proc.stdout.splitlines()[-2]
    assert proc.stdout.splitlines()[-1] == "ok=0 changed=0 unreachable=1 failed=0"


def test_permission_denied_changes_nothing(deployed: dict[str, Any]) -> None:
    before = host_state()
    proc = invoke("deploy", "--hosts", HOST, "--set", "ssh_user=vigil-noroot",
                  "--set", "max_model_len=512", env=deployed["env"])
    assert proc.returncode == 1, proc.stdout
    assert "lab1:" in proc.stdout and "permission" in proc.stdout.lower()
    assert "deploy as root, or set sudo: true" in proc.stdout
    assert host_state() == before


def test_second_deploy_waits_for_the_lock_then_times_out(deployed: dict[str, Any]) -> None:
    # Hold the host's deploy lock the way a running deploy does, then try to deploy.
    holder = subprocess.Popen(
        ["ssh", "-i", str(lab.key_path()), "-o", f"UserKnownHostsFile={lab.known_hosts_path()}",
         "-p", str(lab.host_port(INDEX)), "root@127.0.0.1",
         "exec 9>>/var/lib/vigil/vllm.lock; flock 9; echo 'ci-pipeline-42' > "
         "/var/lib/vigil/vllm.lock.owner; echo held; sleep 30"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = host_state()
        proc = invoke("deploy", "--hosts", HOST, "--set", "lock_timeout_s=3",
                      "--set", "max_model_len=512", env=deployed["env"])
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 1
    assert "waiting up to 3 s for the deploy lock held by ci-pipeline-42" in proc.stdout
    assert "deploy lock /var/lib/vigil/vllm.lock still held after 3 s" in proc.stdout
    assert host_state() == before


def test_change_restarts_then_rollback_restores(deployed: dict[str, Any]) -> None:
    old_pid = main_pid()
    old_unit = sh("cat /etc/systemd/system/vllm.service")
    proc = invoke("deploy", "--hosts", HOST, "--set", "max_model_len=512",
                  "--json", str(REPO / "state" / "t-change.json"), env=deployed["env"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((REPO / "state" / "t-change.json").read_text())["hosts"][HOST]
    assert result["status"] == "changed" and result["restarted"] is True
    assert "ExecStart changed (--max-model-len=1024 -> --max-model-len=512)" in proc.stdout
    assert '"--max-model-len=512"' in sh("cat /etc/systemd/system/vllm.service")
    new_pid = main_pid()
    assert new_pid not in (0, old_pid)
    # only the unit changed: the environment file was not rewritten
    assert "write_env" not in proc.stdout

    proc = invoke("rollback", "--hosts", HOST, env=deployed["env"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sh("cat /etc/systemd/system/vllm.service") == old_unit
    assert main_pid() not in (0, new_pid)
    port = lab.service_port(INDEX)
    assert sh(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/health") == "200"
    assert hashlib.sha256(old_unit.encode()).hexdigest() in host_state()["text"]


def test_status_and_logs_show_the_service(deployed: dict[str, Any]) -> None:
    proc = invoke("status", "--hosts", HOST, env=deployed["env"])
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith(HOST))
    assert "active/running" in line and f"pid {main_pid()}" in line
    assert f"port {lab.service_port(INDEX)}" in line and "health 200" in line
    assert "/srv/models/tiny-llama" in line
    proc = invoke("logs", "--hosts", HOST, "--lines", "400", env=deployed["env"])
    assert proc.returncode == 0
    assert "Application startup complete." in proc.stdout


def test_follow_logs_streams_new_lines(deployed: dict[str, Any]) -> None:
    proc = subprocess.Popen([INVOKE, "logs", "--hosts", HOST, "--follow", "--lines", "0"],
                            cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **deployed["env"]})
    seen = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "GET /v1/models" in line:
                seen.set()

    threading.Thread(target=read, daemon=True).start()
    port = lab.service_port(INDEX)
    try:
        # the access log line of this request is written after `--follow` started; the
        # follow may take a while to start on a loaded machine: ask until a line is seen
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            sh(f"curl -s http://127.0.0.1:{port}/v1/models >/dev/null")
            if seen.wait(timeout=1.5):
                break
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert seen.is_set(), "the new access-log line never arrived while following"
