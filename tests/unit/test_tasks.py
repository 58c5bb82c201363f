"""The front door, run as a user runs it (`invoke ...` in a subprocess): one exit-code
policy, --hosts everywhere, verify takes --set/--stack, watch settings from the config.

The host is this machine over the local transport; nothing here is written on it but
the deploy lock of a test-only service name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from invoke.config import Config
from invoke.context import Context

from tests.doubles import linked_inventory
from tests.paths import REPO
from vigil.desired.targets import parse_sets
from vigil.errors import ConfigError
from vigil.tasks.common import watch_settings

INVOKE = str(Path(sys.executable).parent / "invoke")
HOSTS = """hosts:
  here:
    connection: local
    model: glm-5
    stack: vllm-0.16-nightly
    service: vigil-test-tasks
    gpu: {kind: NVIDIA B200, count: 8, memory_gib: 180}
"""


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    return linked_inventory(tmp_path, HOSTS)


def invoke(inv: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [INVOKE, *args], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "INVOKE_VIGIL_INVENTORY": str(inv),
             "INVOKE_VIGIL_STATE_DIR": str(inv.parent / "state"), "HF_TOKEN": "hf_x", **env})


def test_a_refusal_exits_2_in_deploy_as_in_preflight(inv: Path) -> None:
    """The host's facts refuse the deploy (no model directory here): bad input, 2."""
    deploy = invoke(inv, "deploy", "--hosts", "here", "--check")
    assert deploy.returncode == 2, deploy.stdout + deploy.stderr
    assert "model directory /srv/models/glm-5-nvfp4 does not exist" in deploy.stdout
    preflight = invoke(inv, "preflight", "--hosts", "here")
    assert preflight.returncode == 2, preflight.stdout + preflight.stderr
    assert "NO-GO" in preflight.stdout


def test_set_name_is_refused_everywhere(inv: Path) -> None:
    with pytest.raises(ConfigError, match="--set name"):
        parse_sets(["name=other-profile"])
    for task in ("deploy", "verify", "render", "preflight"):
        proc = invoke(inv, task, "--hosts", "here", "--set", "name=other")
        assert proc.returncode == 2, (task, proc.stdout, proc.stderr)
        assert "--set name" in proc.stdout + proc.stderr


def test_verify_takes_set_and_stack_like_deploy(inv: Path) -> None:
    """Resolved like deploy: an unknown stack or an impossible --set is refused before any
    host is touched."""
    stack = invoke(inv, "verify", "--hosts", "here", "--stack", "no-such-stack")
    assert stack.returncode == 2 and "no-such-stack" in stack.stderr, stack.stderr
    sets = invoke(inv, "verify", "--hosts", "here", "--set", "data_parallel_size=2")
    assert sets.returncode == 2 and "data_parallel_size 2 = 16 GPUs" in sets.stderr


def test_render_takes_hosts_and_writes_one_folder_per_host(inv: Path, tmp_path: Path) -> None:
    (inv / "hosts.yml").write_text(HOSTS + "  there: {connection: local, model: tiny-cpu}\n")
    proc = invoke(inv, "render", "--hosts", "here,there", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "here" / "vigil-test-tasks.service").is_file()
    assert "--model=/srv/models/tiny-llama" in (
        tmp_path / "out" / "there" / "vllm.service").read_text()
    assert invoke(inv, "render", "--host", "here").returncode != 0  # the old flag is gone


def test_watch_settings_come_from_the_invoke_config() -> None:
    c = Context(Config(overrides={"vigil": {"poll_s": 2.5, "history_min_samples": 7}}))
    s = watch_settings(c)
    assert (s.poll_s, s.min_samples, s.stall_s) == (2.5, 7, None)
    assert watch_settings(c, poll=1.0, stall=30.0).poll_s == 1.0


@pytest.mark.parametrize("task", ["deploy", "verify", "rollback"])
def test_deploy_verify_and_rollback_all_read_the_poll_interval(inv: Path, task: str) -> None:
    """A poll interval the watcher cannot use is refused by all three alike, before any
    host is touched: each reads the one setting."""
    proc = invoke(inv, task, "--hosts", "here", INVOKE_VIGIL_POLL_S="0")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "--poll and --stall must be positive" in proc.stderr


def test_the_tasks_print_what_the_inventory_does_not_read(inv: Path, tmp_path: Path) -> None:
    (inv / "hosts.yml").rename(inv / "hosts.ini")
    (inv / "hosts.ini").write_text("[here]\nhere ansible_connection=local model=glm-5 "
                                   "stack=vllm-0.16-nightly service=vigil-test-tasks "
                                   "ansible_python_interpreter=/usr/bin/python3\n")
    (inv / "group_vars").mkdir()
    (inv / "group_vars" / "here.yml").write_text(
        "gpu: {kind: NVIDIA B200, count: 8, memory_gib: 180}\n")
    (inv / "notes.cfg").write_text("x\n")
    miss = invoke(inv, "render", "--hosts", "here:!nothere*", "--out", str(tmp_path / "o"))
    assert miss.returncode == 2 and "'nothere*' matches no host or group" in miss.stderr
    proc = invoke(inv, "render", "--hosts", "here*", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    assert f"warning: not read: {inv / 'notes.cfg'}" in proc.stderr
    assert "warning: ignored 'ansible_python_interpreter'" in proc.stderr
    assert "host_vars/<host> < --set" in proc.stdout  # render's provenance line
    assert "gpu " in proc.stdout and "(group_vars/here.yml)" in proc.stdout


@pytest.mark.parametrize("task", ["deploy", "verify", "render"])
def test_every_task_refuses_a_misspelled_phase_before_any_host(inv: Path, task: str) -> None:
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "here.yml").write_text("phase_budget_s: {kv_cahce: 60}\n")
    proc = invoke(inv, task, "--hosts", "here")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "no watched phase named 'kv_cahce' - did you mean 'kv_cache'?" in proc.stderr
    assert (proc.stdout + proc.stderr).count("phase_budget_s") == 1


@pytest.mark.parametrize("task", ["deploy", "rollback"])
def test_a_task_that_changes_hosts_acts_on_none_unless_told_which(inv: Path,
                                                                 task: str) -> None:
    """No --hosts is no host, not every host (all is said, never implied); bad --forks is
    refused the same way, before any host is touched."""
    proc = invoke(inv, task)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert f"{task} changes hosts: say which" in proc.stderr
    assert "required (--hosts all for every host)" in " ".join(
        invoke(inv, task, "--help").stdout.split())
    if task == "deploy":
        forks = invoke(inv, task, "--hosts", "here", "--forks", "0")
        assert forks.returncode == 2 and "0 hosts at once: at least 1" in forks.stderr


@pytest.mark.parametrize("task", ["deploy", "rollback"])
def test_hosts_all_never_changes_the_controller_unnamed(inv: Path, task: str) -> None:
    """Issue 29.1: an Ansible inventory's `localhost ansible_connection=local` is this
    machine; `--hosts all` refuses it aloud (exit 2) before any host is touched."""
    (inv / "hosts.yml").write_text(HOSTS + "  gpu-01: {address: 192.0.2.1, model: glm-5,"
                                   " connect_timeout_s: 1}\n")
    proc = invoke(inv, task, "--hosts", "all", "--check" if task == "deploy" else "--no-wait")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "selects here, which is this machine (connection: local" in proc.stderr
    assert "--hosts here" in proc.stderr and "192.0.2.1" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("task", ["status", "logs", "rollback", "stack.check", "verify"])
def test_a_bad_input_of_one_host_stops_the_task_before_any_host_is_contacted(
        inv: Path, task: str) -> None:
    """Issue 29.12: exit 2 means nothing was touched: the host with the missing key file
    is refused before the reachable-looking one is dialled."""
    (inv / "hosts.yml").write_text(
        "hosts:\n  gpu-01: {address: 192.0.2.1, connect_timeout_s: 1, model: tiny-cpu, "
        "stack: lab-cpu}\n  gpu-02: {address: 192.0.2.2, ssh_key: keys/none, model: "
        "tiny-cpu, stack: lab-cpu}\n")
    proc = invoke(inv, task, "--hosts", "all")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "host gpu-02: ssh_key" in out and "does not exist" in out
    assert "192.0.2.1" not in out and "gpu-01" not in out, out


def test_message_fixes_of_issue_29_15(inv: Path) -> None:
    """`--json -` is stdout (no file named '-'); `logs --lines -5` is refused; `history
    --model nosuch` is an error naming the profiles, not rc 0 with no word."""
    status = invoke(inv, "history", "--json", "-")
    assert status.returncode == 0, status.stderr
    assert status.stdout.lstrip().startswith("{") and not (REPO / "-").exists()
    lines = invoke(inv, "logs", "--hosts", "here", "--lines", "-5")
    assert lines.returncode == 2 and "--lines -5: at least 0" in lines.stderr, lines.stderr
    typo = invoke(inv, "history", "--model", "glm5")
    assert typo.returncode == 2, typo.stdout + typo.stderr
    assert "--model glm5: no such profile" in typo.stderr and "'glm-5'" in typo.stderr
    none_yet = invoke(inv, "history", "--model", "glm-5")
    assert none_yet.returncode == 0 and "no past start of glm-5" in none_yet.stderr
