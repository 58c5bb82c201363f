"""A user role end to end on a real lab host, Molecule-style: converge, converge again
(idempotence: `ok`, nothing restarted), then verify the host's state over SSH.

Host lab2 takes only the example role `health-log` (a systemd timer), so no vLLM is
installed or started: what is tested is the role machinery, through the front door.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import hosts as lab
from tests.paths import REPO
from vigil.desired import inventory
from vigil.transport.base import Transport
from vigil.transport.ssh import connect

pytestmark = [pytest.mark.lab, pytest.mark.drives(1, 2)]

INVOKE = str(REPO / ".venv" / "bin" / "invoke")
HOST = "lab2"
TIMER = "vigil-health-log.timer"
FILES = {"/opt/vigil/health-log/check.py": "755 root root",
         "/etc/systemd/system/vigil-health-log.service": "644 root root",
         "/etc/systemd/system/vigil-health-log.timer": "644 root root"}


def invoke(inv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INVOKE_VIGIL_INVENTORY": str(inv)}
    return subprocess.run([INVOKE, *args], cwd=REPO, capture_output=True, text=True,
                          env=env, timeout=300)


def sh(t: Transport, command: str) -> str:
    res = t.run(command, timeout=60)
    assert res.exit_status == 0, f"{command}: {res.stderr}"
    return str(res.stdout)


def summary(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())["hosts"][HOST]
    return data


def host_files(t: Transport) -> str:
    return sh(t, "sha256sum " + " ".join(FILES) + " 2>&1 || true")


@pytest.fixture(scope="module")
def inv(lab_hosts: list[lab.HostStatus], tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert HOST in {h.name for h in lab_hosts}
    target = tmp_path_factory.mktemp("roles") / "inventory"
    shutil.copytree(REPO / "inventory", target)
    (target / "host_vars" / f"{HOST}.yml").write_text(
        "roles: [health-log]\nhealth_log_interval: 1h\n")
    return target


@pytest.fixture(scope="module")
def ssh(inv: Path) -> Iterator[Transport]:
    lock = lab.lab_dir() / "hosts" / f"{HOST}.tests.lock"
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        t = connect(HOST, inventory.load(inv, REPO / "roles").host_vars(HOST))  # + health-log
        clean = (f"systemctl disable --now {TIMER} 2>/dev/null; "
                 f"rm -f {' '.join(FILES)}; systemctl daemon-reload")
        sh(t, clean)
        try:
            yield t
        finally:
            sh(t, clean)
            t.close()


@pytest.fixture(scope="module")
def converged(inv: Path, ssh: Transport, tmp_path_factory: pytest.TempPathFactory,
              ) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("out")
    first = invoke(inv, "deploy", "--hosts", HOST, "--json", str(out / "first.json"))
    assert first.returncode == 0, first.stdout + first.stderr
    since = sh(ssh, f"systemctl show {TIMER} -p ActiveEnterTimestampMonotonic --value")
    second = invoke(inv, "deploy", "--hosts", HOST, "--json", str(out / "second.json"))
    assert second.returncode == 0, second.stdout + second.stderr
    return {"first": summary(out / "first.json"), "second": summary(out / "second.json"),
            "second_out": second.stdout, "since": since}


def test_first_converge_places_files_enables_and_starts_the_timer(
        converged: dict[str, Any]) -> None:
    first = converged["first"]
    assert first["status"] == "changed"
    done = [a.split(":", 1)[0] for a in first["actions"]]
    assert done == ["write_file"] * 3 + ["systemctl daemon-reload", f"systemctl enable {TIMER}",
                                         "restart"]
    # no vLLM: the host takes only the user role
    assert not first["restarted"] and first["verdict"] is None


def test_second_converge_is_ok_and_restarts_nothing(converged: dict[str, Any],
                                                    ssh: Transport) -> None:
    second = converged["second"]
    assert (second["status"], second["actions"], second["restarted"]) == ("ok", [], False)
    assert "nothing to do" in converged["second_out"]
    # the timer was not restarted by the second converge
    assert sh(ssh, f"systemctl show {TIMER} -p ActiveEnterTimestampMonotonic --value") \
        == converged["since"]


def test_host_state_is_as_the_role_says(converged: dict[str, Any], ssh: Transport) -> None:
    for path, expect in FILES.items():
        assert sh(ssh, f"stat -c '%a %U %G' {path}").strip() == expect
    assert sh(ssh, f"systemctl is-enabled {TIMER}").strip() == "enabled"
    assert sh(ssh, f"systemctl is-active {TIMER}").strip() == "active"
    assert "OnUnitActiveSec=1h" in sh(ssh, f"cat /etc/systemd/system/{TIMER}")
    sh(ssh, "systemd-analyze verify /etc/systemd/system/vigil-health-log.service "
            f"/etc/systemd/system/{TIMER}")
    # the service the timer runs works: it logs the vLLM port's /health (no server here)
    sh(ssh, "systemctl start vigil-health-log.service || true")
    log = sh(ssh, "journalctl -t vigil-health-log -n 5 --no-pager -o cat")
    assert "vllm /health unreachable" in log or "vllm /health 200" in log, log


def test_check_shows_the_diff_and_changes_nothing(converged: dict[str, Any], inv: Path,
                                                  ssh: Transport, tmp_path: Path) -> None:
    before = host_files(ssh)
    proc = invoke(inv, "deploy", "--hosts", HOST, "--check", "--set",
                  "health_log_interval=2h", "--json", str(tmp_path / "check.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "-OnUnitActiveSec=1h\n" in proc.stdout and "+OnUnitActiveSec=2h\n" in proc.stdout
    result = summary(tmp_path / "check.json")
    assert result["status"] == "changed"
    assert [a.split(":", 1)[0] for a in result["actions"]] == [
        "write_file", "systemctl daemon-reload", "restart"]
    assert host_files(ssh) == before


def test_with_the_service_roles_the_role_rides_in_the_same_facts_round_trip(
        converged: dict[str, Any], inv: Path, ssh: Transport, tmp_path: Path) -> None:
    """The same host taking the built-in roles too: one facts call carries the role's
    files and units, so the converged role plans nothing beside the vLLM release."""
    before = host_files(ssh)
    proc = invoke(inv, "deploy", "--hosts", HOST, "--check", "--set",
                  "roles=[preflight,runtime,service,verify,health-log]",
                  "--json", str(tmp_path / "mixed.json"))
    result = summary(tmp_path / "mixed.json")
    assert result["round_trips"] == 2, proc.stdout + proc.stderr  # the lock and the facts
    done = [a.split(":", 1)[0] for a in result["actions"]]
    assert not any(d in ("write_file", f"systemctl enable {TIMER}") for d in done), done
    assert not any(a.startswith("restart: health-log") for a in result["actions"])
    assert host_files(ssh) == before


def test_rollback_puts_the_roles_files_back_with_the_release(ssh: Transport) -> None:
    """On the real host, through the agent's own verbs: a release (a small unit) plus a
    role file and a file new in this deploy; the rollback restores the file as it was
    (mode, text), removes the new one, restarts the unit the file names; a second
    rollback undoes the first."""
    from vigil.transport.remote import call_with
    svc, conf, new = "vigil-rbtest", "/opt/vigil/rbtest.conf", "/opt/vigil/rbtest-new.conf"
    paths = {"unit": f"/etc/systemd/system/{svc}.service", "env": f"/run/{svc}.env",
             "current": f"/run/{svc}-current", "backup_dir": f"/run/{svc}-backup"}
    unit = "[Service]\nExecStart=/bin/sleep infinity\n"

    def agent(verb: str, req: dict[str, Any]) -> dict[str, Any]:
        return call_with(ssh, lambda c: c, verb, req)

    def state() -> str:
        return sh(ssh, f"stat -c '%a %s' {conf}; cat {conf}; ls {new} 2>&1 || true")

    try:
        first = agent("apply", {"paths": paths, "actions": [
            {"kind": "write_unit", "content": unit, "mode": "644"},
            {"kind": "write_file", "path": conf, "content": "v=1\n", "mode": "600",
             "owner": "root"},
            {"kind": "systemctl", "args": ["daemon-reload"]},
            {"kind": "restart", "unit": svc}]})
        assert all(r["ok"] for r in first["results"]), first
        before = state()
        pid = sh(ssh, f"systemctl show {svc} -p MainPID --value").strip()
        second = agent("apply", {"paths": paths, "actions": [
            {"kind": "backup", "files": [{"path": conf, "restart": svc},
                                         {"path": new, "restart": None}]},
            {"kind": "write_unit", "content": unit + "# v2\n", "mode": "644"},
            {"kind": "write_file", "path": conf, "content": "v=2\n", "mode": "644",
             "owner": "root"},
            {"kind": "write_file", "path": new, "content": "n\n", "mode": "644",
             "owner": "root"}]})
        assert all(r["ok"] for r in second["results"]), second
        after = state()
        back = agent("rollback", {"paths": paths, "unit": svc})
        assert back["ok"] and back["restored"] == ["unit", conf, new], back
        assert state() == before and "No such file" in before
        assert "# v2" not in sh(ssh, f"cat {paths['unit']}")
        assert sh(ssh, f"systemctl show {svc} -p MainPID --value").strip() != pid
        again = agent("rollback", {"paths": paths, "unit": svc})
        assert again["ok"], again
        assert state() == after and "v=2" in after
    finally:
        sh(ssh, f"systemctl stop {svc} || true; rm -rf {conf} {new} {' '.join(paths.values())}"
                "; systemctl daemon-reload")
