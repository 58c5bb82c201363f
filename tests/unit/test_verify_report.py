"""Verify's output: plain lines without per-poll spam, the live view, JSON, JUnit."""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

from tests.doubles import KEY, outcome
from tests.paths import TRACES
from vigil.verify import reducer, replay
from vigil.verify import report as verify_report
from vigil.verify.budgets import Budgets, HistoryRecord
from vigil.verify.snapshot import Smoke
from vigil.verify.watch import Outcome


def test_plain_lines_follow_changes_not_polls() -> None:
    _, snaps = replay.load(TRACES / "lab-cold-ready.jsonl")
    out = io.StringIO()
    t = [0.0]
    rep = verify_report.Reporter(out, live=False, clock=lambda: t[0])
    state = reducer.initial()
    labels: list[str] = []  # each poll's phase (the verdict once there is one)
    with rep:
        for snap in snaps:
            state = reducer.step(state, snap, Budgets())
            rep.poll("lab5", state, snap, Budgets())
            labels.append(state.verdict if state.verdict == "ready" else state.phase)
            t[0] += 2.0
    lines = out.getvalue().splitlines()
    assert state.verdict == "ready"
    # one line per phase reached and one for the verdict (issue 22.14: the progress
    # signals, which flip nearly every poll, printed 28 lines for this 88 s start)
    changes = [x for i, x in enumerate(labels) if i == 0 or x != labels[i - 1]]
    assert [ln.split()[2].rstrip(":") for ln in lines] == changes
    assert changes[-1] == "ready" and "compiling" in changes
    assert lines[-1].split()[1] == "lab5"


def test_a_new_warning_is_printed_when_it_comes() -> None:
    _, snaps = replay.load(TRACES / "lab-cold-ready.jsonl")
    state = reducer.step(reducer.initial(), snaps[0], Budgets())
    out = io.StringIO()
    rep = verify_report.Reporter(out, live=False, clock=lambda: 0.0)
    rep.poll("lab5", state, snaps[0], Budgets())
    warned = replace(state, warnings=(*state.warnings, "compiling for 9:00, past its budget"))
    rep.poll("lab5", warned, snaps[0], Budgets())
    rep.poll("lab5", warned, snaps[0], Budgets())
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "[warning: compiling for 9:00, past its budget]" in lines[1]


def test_plain_lines_heartbeat_once_a_minute() -> None:
    """A start that shows nothing new (same phase, verdict and progress) still prints one
    line a minute, and only one: a pipeline log shows the watch is alive."""
    _, snaps = replay.load(TRACES / "lab-sigstop-stalled.jsonl")
    state = reducer.step(reducer.initial(), snaps[0], Budgets())
    out = io.StringIO()
    t = [1000.0]
    rep = verify_report.Reporter(out, live=False, clock=lambda: t[0])
    printed_at: list[float] = []
    for _ in range(30):  # 150 s of polls every 5 s, nothing changing
        before = len(out.getvalue().splitlines())
        rep.poll("lab5", state, snaps[0], Budgets())
        if len(out.getvalue().splitlines()) > before:
            printed_at.append(t[0])
        t[0] += 5.0
    assert printed_at == [1000.0, 1060.0, 1120.0]


def test_plain_lines_end_with_the_stall_verdict() -> None:
    _, snaps = replay.load(TRACES / "lab-sigstop-stalled.jsonl")
    out = io.StringIO()
    t = [0.0]
    rep = verify_report.Reporter(out, live=False, clock=lambda: t[0])
    state = reducer.initial()
    b = Budgets(stall_s={p: 30.0 for p in reducer.PHASES})
    for snap in snaps:
        state = reducer.step(state, snap, b)
        rep.poll("lab5", state, snap, b)
        t[0] += 2.0
    assert state.verdict == "stalled"
    assert "stalled (stalled_compiling)" in out.getvalue().splitlines()[-1]


def test_live_view_renders_a_table() -> None:
    out = io.StringIO()
    o = outcome("lab-cold-ready.jsonl")
    assert o.state is not None
    with verify_report.Reporter(out, live=True) as rep:
        rep.poll("lab5", o.state, replay.load(TRACES / "lab-cold-ready.jsonl")[1][-1], Budgets())
    text = out.getvalue()
    assert "lab5" in text and "ready" in text and "evidence" in text


def test_json_shape() -> None:
    ready, stalled = outcome("lab-cold-ready.jsonl"), outcome("lab-sigstop-stalled.jsonl", "lab6")
    doc = json.loads(json.dumps(verify_report.run_json([ready, stalled], 4)))
    assert doc["ok"] is False and doc["exit_code"] == 4
    r = doc["hosts"]["lab5"]
    assert r["verdict"] == "ready" and r["smoke"]["tokens"] > 0
    assert [p["name"] for p in r["phases"]][-1] == "ready"
    assert all({"name", "start", "end", "duration_s"} <= set(p) for p in r["phases"])
    assert r["budgets"]["level"] == "prior"
    assert r["budgets"]["phases"]["compiling"]["source"] == "prior"
    assert r["budgets"]["key"]["cache"] == "cold"
    assert r["probe_s"] == {"n": 3, "median": 0.25, "max": 0.3}
    s = doc["hosts"]["lab6"]
    assert s["verdict"] == "stalled" and s["cause"] == "stalled_compiling"
    assert s["remedy"] and s["proof"] and s["evidence"].startswith("compiling")


def test_junit_one_case_per_host_failure_carries_verdict_cause_remedy() -> None:
    ready, crashed = outcome("lab-cold-ready.jsonl"), outcome("lab-kill9-crashed.jsonl", "lab6")
    lost = Outcome("lab7", error="lab7: 3 probes in a row failed: timed out", exit_code=1)
    root = ET.fromstring(verify_report.junit_xml([ready, crashed, lost]))
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["lab5"].find("failure") is None
    failure = cases["lab6"].find("failure")
    assert failure is not None and crashed.state is not None
    msg = failure.get("message") or ""
    assert msg.startswith("crashed: ") and (crashed.state.cause or "") in msg
    assert (crashed.state.remedy or "")[:20] in msg
    err = cases["lab7"].find("error")
    assert err is not None and "probes in a row" in (err.get("message") or "")


def test_write_junit_to_an_unwritable_place_is_bad_input(tmp_path: Path) -> None:
    from vigil.errors import ConfigError

    blocker = tmp_path / "f"
    blocker.write_text("")
    try:
        verify_report.write_junit(str(blocker / "x.xml"), [])
    except ConfigError as exc:
        assert "cannot write" in str(exc)
    else:
        raise AssertionError("expected ConfigError")


def test_summary_and_history_table() -> None:
    o = outcome("lab-cold-ready.jsonl")
    o.smoke = Smoke(ok=True, tokens=16, ttft_s=0.04, tokens_per_s=500.0)
    text = verify_report.summary([o])
    assert "ready" in text and "TTFT 0.04 s" in text
    rec = HistoryRecord(key=KEY, started_at=0.0, verdict="ready",
                        phases_s={"bootstrap": 21.9, "compiling": 53.8}, total_s=88.0,
                        host="lab5")
    table = verify_report.history_table([rec])
    assert "compile" in table and "53.8" in table and "cold" in table
    assert "no recorded starts" in verify_report.history_table([])


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_deploy_lines_go_above_the_live_table_on_a_terminal_and_plain_elsewhere() -> None:
    o = outcome("lab-cold-ready.jsonl")
    assert o.state is not None
    last = replay.load(TRACES / "lab-cold-ready.jsonl")[1][-1]
    tty = _Terminal()
    with verify_report.Reporter(tty) as rep:
        rep.log(8)("lab5", "FAILED: lab5: install_env failed")
        rep.poll("lab5", o.state, last, Budgets())
    shown = tty.getvalue()
    assert rep.live and "\x1b[" in shown  # colour
    # the line printed once, above the table (the last redraw is the table alone, with
    # the verdict)
    assert shown.count("install_env failed") == 1
    final = shown.rsplit("\x1b[2K", 1)[1]
    assert "lab5" in final and "ready" in final and "install_env" not in final
    pipe = io.StringIO()
    with verify_report.Reporter(pipe) as rep:
        rep.log(8)("lab5", "FAILED: lab5: install_env failed")
    (line,) = pipe.getvalue().splitlines()
    assert not rep.live and "\x1b" not in line
    assert re.fullmatch(r"\d\d:\d\d:\d\d lab5     FAILED: lab5: install_env failed", line)


def test_a_live_view_that_watched_no_start_leaves_no_empty_table() -> None:
    tty = _Terminal()
    with verify_report.Reporter(tty) as rep:
        rep.log(8)("lab5", "would restart: env changed")
    shown = tty.getvalue()
    assert "would restart" in shown
    assert shown.endswith("\x1b[2K")  # the empty table erased (a watched one stays)
