"""The host agent's dispatch: one applier per action kind the planner can emit."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.agent_payload import agent
from tests.paths import REPO
from vigil.deploy.plan import ActionKind
from vigil.host import payload

# The plans apply sends (tests/unit/test_apply.py holds it to them): release, roles, seed.
DEPLOY = REPO / "vigil" / "deploy"
PLANNERS = [DEPLOY / "plan.py", DEPLOY / "roles.py", DEPLOY / "seed.py"]


def test_every_action_kind_has_an_applier_and_the_planners_write_only_kinds() -> None:
    # the host side is stdlib only: its table is keyed by the strings the members are
    kinds = {k.value for k in ActionKind}
    assert set(agent.APPLIERS) == kinds, "an applier's kind is one ActionKind member: " \
        f"{sorted(set(agent.APPLIERS) ^ kinds)}"
    text = "".join(p.read_text() for p in PLANNERS)
    assert not re.findall(r'Action\(\s*["\']', text)  # a kind is a member, not a literal
    planned = set(re.findall(r"Action\(\s*ActionKind\.(\w+)", text))
    assert planned == {k.name for k in ActionKind}  # no member that no planner writes


def test_an_unknown_action_stops_the_run_with_its_name(tmp_path: Path) -> None:
    unit = tmp_path / "u.service"
    reply = agent.apply({"paths": {"unit": str(unit)}, "actions": [
        {"kind": "bogus"},
        {"kind": "write_unit", "content": "x", "mode": "644"},
    ]})
    assert reply["results"] == [{"ok": False, "error": "unknown action bogus", "kind": "bogus"}]
    assert not unit.exists()


def test_write_unit_applier_writes_with_the_mode(tmp_path: Path) -> None:
    unit = tmp_path / "u.service"
    reply = agent.apply({"paths": {"unit": str(unit)}, "actions": [
        {"kind": "write_unit", "content": "[Unit]\n", "mode": "640"}]})
    assert reply["results"] == [{"ok": True, "kind": "write_unit"}]
    assert unit.read_text() == "[Unit]\n" and unit.stat().st_mode & 0o777 == 0o640


def test_facts_reply_parses_straight_into_host_facts(tmp_path: Path) -> None:
    """The agent's real `facts` reply on this machine (no unit, no model, no GPU) is a
    HostFacts as it stands; a reply missing what the agent always sends is one error."""
    import json
    import subprocess
    import sys

    import pytest

    from vigil.deploy.facts import parse_facts
    from vigil.errors import HostError

    env_dir = tmp_path / "envs" / "stack-1"
    paths = {"unit": str(tmp_path / "u.service"), "env": str(tmp_path / "u.env"),
             "env_dir": str(env_dir), "current": str(tmp_path / "envs" / "current"),
             "backup_dir": str(tmp_path / "backup")}
    (tmp_path / "u.service").write_text("[Unit]\n")
    request = {"unit": "vigil-test-no-such-unit", "port": 1, "service_user": "root",
               "model": str(tmp_path / "no-model"), "paths": paths}
    # the joined agent from a file: past 128 KiB it no longer fits one argv string
    # (MAX_ARG_STRLEN); the transports send it on stdin behind a bootstrap
    script = tmp_path / "agent.py"
    script.write_text(payload.source())
    out = subprocess.run([sys.executable, str(script), "facts"],
                         input=json.dumps(request),
                         capture_output=True, text=True, timeout=120, check=True)
    facts = parse_facts("here", json.loads(out.stdout))
    assert facts.unit_text == "[Unit]\n" and facts.env_text is None
    assert not facts.env_unreadable and facts.current_env is None
    assert facts.model.present is False and facts.health_status is None
    assert facts.service.main_pid == 0 and not facts.service.running
    assert facts.disk_free_bytes > 0 and facts.port_listening is False
    with pytest.raises(HostError, match="here: unexpected facts reply: uid"):
        parse_facts("here", {"files": {}, "writable": {}})


FAKE_SYSTEMD = """#!/bin/sh
case "$(basename "$0") $1" in
  "systemctl restart"|"systemctl start")
    echo "Job for $2.service failed because the control process exited with error code." >&2
    exit 1 ;;
  "systemctl show") printf 'Result=exit-code\\nExecMainCode=1\\nExecMainStatus=219\\n' ;;
  "systemctl "*) exit 0 ;;
  journalctl*)
    case "$*" in
      *_PID=1*UNIT=vllm*)
        echo "vllm.service: Failed to kill control group: Input/output error"
        echo "vllm.service: Main process exited, code=exited, status=219/CGROUP" ;;
      *UNIT=vllm*)  # UNIT= alone: a line the service sent with UNIT= set itself too
        echo "vllm.service: Main process exited, code=exited, status=219/CGROUP"
        echo "vllm.service: api_key=sk-the-secret (forged by the service)" ;;
      *) echo "(APIServer) non-default args: api_key=sk-the-secret" ;;
    esac ;;
esac
"""


def test_a_failed_start_carries_systemds_own_account_and_none_of_the_services_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``systemctl restart`` says only "the control process exited with error code": the
    reply adds the unit's result and exit status and systemd's own lines about it (the
    cgroup it could not clear), never a line the service printed, nor one it sent with
    UNIT= set (a client field: only systemd's own, _PID=1, is taken)."""
    for name in ("systemctl", "journalctl"):
        exe = tmp_path / name
        exe.write_text(FAKE_SYSTEMD)
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    for verb in ("restart", "start"):
        res = agent._systemctl([verb, "vllm"])
        assert not res["ok"] and "control process exited" in res["error"]
        assert "  systemd: Result=exit-code ExecMainCode=1 ExecMainStatus=219" in res["tail"]
        assert "  | vllm.service: Main process exited, code=exited, status=219/CGROUP" \
            in res["tail"]
        assert "secret" not in res["tail"]
    assert "tail" not in agent._systemctl(["daemon-reload"])
