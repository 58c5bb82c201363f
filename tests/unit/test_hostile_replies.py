"""Issue 33.10 and its minors: one host's hostile reply (nested 200k deep, a lone surrogate,
an uptime that is no number) is that host's result, never the run's end: the healthy
host gets its verdict and every report is written."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from invoke.exceptions import Exit

from tests.doubles import RecordedHost, agent_verb, lab_trace, linked_inventory
from vigil.errors import HostError
from vigil.transport.base import Closing, Result
from vigil.transport.remote import reply

DEEP = "[" * 200_000 + "]" * 200_000


def _ctx(inv: Path) -> Any:
    from invoke.config import Config
    from invoke.context import Context

    from vigil.tasks.project import DEFAULTS

    return Context(Config(overrides={"vigil": {
        **dict.fromkeys(DEFAULTS), "inventory": str(inv), "state_dir": str(inv.parent / "state")}}))


class Healthy(Closing, RecordedHost):
    """A host replaying a real ready start, as a connection (a context manager)."""

    def __init__(self, name: str) -> None:
        super().__init__(lab_trace("lab-warm-ready.jsonl"))
        self.name = name


class Hostile(Healthy):
    """A host whose first probe reply is ``probe_text``, then the recorded start's."""

    def __init__(self, name: str, probe_text: str) -> None:
        super().__init__(name)
        self.probe_text = probe_text

    def run(self, command: str, *, stdin: str = "", timeout: float | None = None,
            limit: int | None = None) -> Result:
        if agent_verb(command) == "probe" and self.i == 0:
            if self.probe_text == "bug":
                raise ZeroDivisionError("a bug met on this host alone")
            self.round_trips += 1
            self.i += 1
            return Result(self.probe_text, "", 0)
        return super().run(command, stdin=stdin, timeout=timeout)


def _with_surrogate() -> str:
    snap = json.loads(lab_trace("lab-warm-ready.jsonl")[0].to_json())
    snap["journal"]["lines"] = [{"us": 1795949630106927, "text": "bad \ud800 line"}]
    return json.dumps(snap)  # ensure_ascii: the lone surrogate travels as "\ud800"


@pytest.mark.parametrize("probe_text, evil", [
    (DEEP, "nested deeper than 128"), ("bug", "internal error at test_hostile_replies.py"),
    (_with_surrogate(), "ready")], ids=["deep", "bug", "surrogate"])
def test_one_hostile_host_never_aborts_a_fleet_verify(
        probe_text: str, evil: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nested 200k deep: that host's error (RecursionError ended the run, no report); a lone
    surrogate in a journal line: U+FFFD in its place (PydanticSerializationError writing
    the trace), and the start is judged as any other. A bug in vigil met on one host is
    that host's error too."""
    from vigil.tasks.collection import ns
    from vigil.verify import watch

    inv = linked_inventory(tmp_path, "hosts:\n"
                           "  good: {address: 192.0.2.1, model: tiny-cpu, stack: lab-cpu}\n"
                           "  evil: {address: 192.0.2.2, model: tiny-cpu, stack: lab-cpu}\n")

    def connect(name: str, _vars: object) -> Healthy:
        return Hostile(name, probe_text) if name == "evil" else Healthy(name)

    monkeypatch.setattr(watch, "connect", connect)
    junit, js = tmp_path / "verify.xml", tmp_path / "verify.json"
    code = 0
    try:
        ns["verify"](_ctx(inv), hosts="all", json=str(js), junit=str(junit), poll=0.01,
                     probe="poll")
    except Exit as done:
        code = int(done.code)
    run = json.loads(js.read_text())
    hosts = run["hosts"]
    assert hosts["good"]["verdict"] == "ready", hosts["good"]
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert set(cases) == {"good", "evil"}
    assert cases["good"].find("error") is None and cases["good"].find("failure") is None
    assert code == run["exit_code"]
    if evil != "ready":
        assert evil in (hosts["evil"]["error"] or ""), hosts["evil"]
        assert cases["evil"].find("error") is not None and run["exit_code"] != 0
    else:
        assert hosts["evil"]["verdict"] == "ready" and run["exit_code"] == 0, hosts["evil"]
        traces = list((inv.parent / "state").rglob("*evil*.jsonl"))
        assert traces and "bad \ufffd line" in traces[0].read_text(encoding="utf-8")


def test_a_reply_nested_too_deep_is_one_clear_error() -> None:
    with pytest.raises(HostError, match="nested deeper than"):
        reply("h1", "probe", Result('{"a":' + DEEP + "}", "", 0))
    with pytest.raises(HostError, match="nested deeper than"):
        reply("h1", "probe", Result('{"a":' + "[" * 300 + "]" * 300 + "}", "", 0))


def test_a_lone_surrogate_in_a_reply_becomes_a_replacement_character() -> None:
    got = reply("h1", "logs", Result(json.dumps({"text": "a\ud800b", "\udfff": ["\ud83d"]}),
                                     "", 0))
    assert got == {"text": "a\ufffdb", "\ufffd": ["\ufffd"]}
    assert json.dumps(got, ensure_ascii=False).encode()  # writes as UTF-8
    pair = reply("h1", "logs", Result(json.dumps({"text": "ok \U0001f600"}), "", 0))
    assert pair == {"text": "ok \U0001f600"}  # a real pair is a character, kept


class _Replies(Closing):
    """A transport whose every command prints ``text``."""

    def __init__(self, text: str) -> None:
        self.name, self.round_trips, self.text = "h1", 0, text

    def run(self, command: str, *, stdin: str = "", timeout: float | None = None,
            limit: int | None = None) -> Result:
        self.round_trips += 1
        return Result(self.text, "", 0)


@pytest.mark.parametrize("uptime", ["NaN", '"abc"', "1e400", "-5", "true", "[1]"])
def test_a_status_uptime_that_is_no_duration_is_none_not_a_traceback(uptime: str) -> None:
    """N78: `uptime_s` NaN / "abc" / 1e400 ended `vigil status` in a traceback."""
    from vigil.deploy.service import status
    from vigil.desired.config import HostVars

    text = ('{"service": {"ActiveState": "active", "SubState": "running", "MainPID": "7"}, '
            f'"uptime_s": {uptime}, "health": {uptime}, "exec_start": ""}}')
    got = status(_Replies(text), HostVars())  # type: ignore[arg-type]
    assert (got.uptime_s, got.health) == (None, None)
    assert " up -  " in got.line()


def test_a_stream_line_nested_too_deep_or_with_a_lone_surrogate() -> None:
    from vigil.verify.stream import RawSnap, parse_line

    with pytest.raises(ValueError, match="stream line is JSON nested deeper than 128"):
        parse_line('{"k": "snap", "snap": ' + DEEP + "}")
    got = parse_line(json.dumps({"k": "snap", "snap": {"journal": {"lines": [
        {"us": 1, "text": "x\udc80"}]}}}))
    assert isinstance(got, RawSnap)
    assert got.data["journal"]["lines"][0]["text"] == "x\ufffd"
