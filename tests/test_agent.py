"""The host agent's dispatch: one applier per action kind the planner can emit."""

from __future__ import annotations

import re
from pathlib import Path

from vigil.host import agent

PLAN = Path(__file__).parent.parent / "vigil" / "deploy" / "plan.py"


def test_every_planned_action_kind_has_an_applier() -> None:
    planned = set(re.findall(r'Action\(\s*"(\w+)"', PLAN.read_text()))
    planned |= {"mark_env", "discard_env", "write_unit", "write_env"}  # sent by deploy/apply
    assert planned <= set(agent.APPLIERS), planned - set(agent.APPLIERS)


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
