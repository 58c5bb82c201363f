"""A fleet on the lab: 8 stand-in hosts (lab/fleet.py) deployed, re-deployed and rolled
through the real front door (`invoke deploy`), over real SSH to real systemd hosts.

The stand-in replaces only the vLLM process: vigil installs it from its stack, renders
the unit, restarts it and verifies the start phase by phase with a real streamed
completion, as it does for vLLM. Run under the lab lock:

    flock /tmp/vigil-lab.lock .venv/bin/python -m pytest -q tests/lab/test_fleet_lab.py
"""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import fleet, hosts
from tests.paths import REPO
from vigil.exitcodes import ExitCode

N = 8
pytestmark = [pytest.mark.lab, pytest.mark.drives(*fleet.indexes(N))]


@pytest.fixture(scope="module")
def fleet_hosts() -> Iterator[list[int]]:
    nums = fleet.indexes(N)
    before = {h.name for h in hosts.status() if h.running}
    hosts.up(max(nums), timeout=300)
    fleet.provision(nums)
    yield nums
    ours = [hosts.host_name(i) for i in range(1, max(nums) + 1)
            if hosts.host_name(i) not in before]
    if ours and not os.environ.get("PYTEST_XDIST_WORKER"):
        hosts.down(ours)
    fleet.stop(i for i in nums if hosts.host_name(i) in before)


def deploy(inv: Path, state: Path, *args: str) -> tuple[int, str]:
    env = {**os.environ, "INVOKE_VIGIL_INVENTORY": str(inv),
           "INVOKE_VIGIL_STATE_DIR": str(state)}
    done = subprocess.run([str(REPO / ".venv" / "bin" / "invoke"), "deploy", "--hosts",
                           "standin", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    return done.returncode, done.stdout + done.stderr


def env_file(i: int) -> str:
    code, out, err = hosts.run(i, f"cat /etc/vigil/{fleet.SERVICE}.env")
    assert code == 0, err
    return out


def test_fleet_rolls_in_batches_and_stops_past_the_budget(
        fleet_hosts: list[int], tmp_path: Path) -> None:
    nums = fleet_hosts
    names = [hosts.host_name(i) for i in nums]
    inv, state = tmp_path / "inv", tmp_path / "state"

    # release a on every host (installs the stand-in the first time), then a no-op
    fleet.write_inventory(inv, nums, env={"STANDIN_RELEASE": "a"})
    code, out = deploy(inv, state, "--json", str(tmp_path / "a.json"))
    assert code == 0, out
    code, out = deploy(inv, state, "--json", str(tmp_path / "noop.json"))
    assert code == 0, out
    noop = json.loads((tmp_path / "noop.json").read_text())["hosts"]
    assert {h: (r["status"], r["restarted"]) for h, r in noop.items()} == {
        h: ("ok", False) for h in names}

    # release b in quarters; the 5th host crashes at the start of compiling
    bad = nums[4]
    bad_name = hosts.host_name(bad)
    fleet.write_inventory(inv, nums, env={"STANDIN_RELEASE": "b"},
                          host_env={bad: {"STANDIN_CRASH_AT": "compiling"}})
    code, out = deploy(inv, state, "--serial", "25%", "--rollback-failed",
                       "--json", str(tmp_path / "b.json"), "--junit", str(tmp_path / "b.xml"))
    assert code == ExitCode.ROLLOUT_STOPPED, out
    ro = json.loads((tmp_path / "b.json").read_text())
    assert [b["hosts"] for b in ro["batches"]] == [names[0:2], names[2:4], names[4:6]]
    assert ro["failed"] == [bad_name]
    assert ro["done"] == [*names[0:4], names[5]]  # its batch mate was already on its way
    assert ro["untouched"] == names[6:8]
    assert ro["hosts"][bad_name]["verdict"] == "crashed"
    assert ro["rolled_back"][bad_name]["status"] == "rolled_back"
    assert ro["hosts"][names[0]]["phases"]  # phase durations per host from verify

    for i in [*nums[:4], nums[5]]:
        assert "STANDIN_RELEASE='b'" in env_file(i)
    for i in [bad, *nums[6:8]]:  # rolled back, or never touched: release a
        assert "STANDIN_RELEASE='a'" in env_file(i)
        assert "STANDIN_CRASH_AT" not in env_file(i)

    cases = ET.parse(tmp_path / "b.xml").getroot().findall(".//testcase")
    assert sorted(c.get("name") or "" for c in cases) == sorted(names)
    assert [c.get("name") for c in cases if c.find("failure") is not None] == [bad_name]
    assert [c.get("name") for c in cases if c.find("skipped") is not None] == names[6:8]
