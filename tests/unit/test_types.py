"""Verdicts, host statuses and action kinds are enums (issue 20.7): one set each, the
members the code writes, and the plain strings in every JSON file."""

from __future__ import annotations

import ast
import json
import re
from enum import Enum
from typing import Any

import pytest

from tests.paths import REPO, TRACES
from vigil.deploy import rollout
from vigil.deploy.plan import ActionKind
from vigil.exitcodes import ExitCode
from vigil.report import HostResult, HostStatus, results_json
from vigil.verify import catalog, reducer
from vigil.verify.budgets import Budgets
from vigil.verify.reducer import Verdict
from vigil.verify.snapshot import Snapshot

VIGIL = REPO / "vigil"
# The controller's modules; the host agent keeps its strings (stdlib only, Python 3.8).
CONTROLLER = sorted(p for p in VIGIL.rglob("*.py") if "host" not in p.relative_to(VIGIL).parts)
# The reducer imports compile_cache, so compile_cache cannot import the Verdict back:
# its history records are compared with the strings.
LITERAL_VERDICTS_ALLOWED = {VIGIL / "verify" / "compile_cache.py"}


def plain(obj: Any) -> Any:
    """The same data with every enum member replaced by its plain value."""
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, dict):
        return {plain(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    return obj


def _members_used(enum: str) -> set[str]:
    """Every ENUM.NAME the controller's code names."""
    used: set[str] = set()
    for path in CONTROLLER:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == enum:
                used.add(node.attr)
    return used


# -- the sets ------------------------------------------------------------------------------


def test_the_verdict_sets_are_the_enum() -> None:
    assert tuple(Verdict) == reducer.VERDICTS
    assert set(Verdict) - {Verdict.SLOW} == reducer.TERMINAL
    # the layers below verify key by the strings: they must be the same set
    assert set(reducer.EXIT) == reducer.TERMINAL
    assert reducer.exit_of("crashed", ExitCode.OK) is ExitCode.CRASHED
    assert reducer.exit_of("slow", ExitCode.FAILED) is ExitCode.FAILED
    assert reducer.exit_of(None, ExitCode.OK) is ExitCode.OK
    assert set(catalog.VERDICT_REMEDIES) <= set(Verdict)


def test_every_member_is_written_somewhere() -> None:
    # an enum value no code writes is a status the docs promise and nothing produces
    assert _members_used("Verdict") >= {v.name for v in Verdict}
    assert _members_used("HostStatus") == {s.name for s in HostStatus}
    assert _members_used("ActionKind") == {k.name for k in ActionKind}


def test_the_controller_compares_and_writes_members_not_literals() -> None:
    verdicts = "|".join(v.value for v in Verdict)
    statuses = "|".join(s.value for s in HostStatus)
    rules = [
        (rf'verdict\b\s*(?:==|!=)\s*["\'](?:{verdicts})["\']', "a verdict literal"),
        (rf'verdict\b\s+(?:not\s+)?in\s+\(\s*["\'](?:{verdicts})["\']', "a verdict literal"),
        (rf'\.status\b\s*(?:==|!=|=)\s*["\'](?:{statuses})["\']', "a status literal"),
        (r'(?:HostResult|GroupResult)\([^,()]+,\s*["\']', "a status literal"),
        (r'\bAction\(\s*["\']', "an action kind literal"),
        (r'\.step\(\s*["\']', "an action kind literal"),
    ]
    found = []
    for path in CONTROLLER:
        text = path.read_text(encoding="utf-8")
        for pattern, what in rules:
            if what == "a verdict literal" and path in LITERAL_VERDICTS_ALLOWED:
                continue
            for m in re.finditer(pattern, text):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{path.relative_to(VIGIL)}:{line}: {what}: {m.group()}")
    assert found == []


def test_the_host_agent_imports_no_controller_enum() -> None:
    host = VIGIL / "host"
    for path in host.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "StrEnum" not in text and "vigil.report" not in text, path.name


# -- the values in the JSON ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(p.name for p in TRACES.glob("*.jsonl")))
def test_a_replayed_trace_holds_verdict_members_and_its_report_the_strings(name: str) -> None:
    # the stalled starts were watched with a 30 s window (tests/unit/test_watch.py)
    budgets = Budgets(stall_s={p: 30.0 for p in reducer.PHASES}) if "stalled" in name \
        else Budgets()
    state = reducer.initial()
    for line in (TRACES / name).read_text(encoding="utf-8").splitlines():
        if line.strip():
            state = reducer.step(state, Snapshot.from_json(line), budgets)
            assert state.verdict is None or type(state.verdict) is Verdict
    assert state.verdict in set(Verdict), name
    report = reducer.report(state)
    assert json.dumps(report) == json.dumps(plain(report))
    assert f'"verdict": "{state.verdict.value}"' in json.dumps(report)


def test_results_json_holds_the_plain_status_strings() -> None:
    results = [HostResult(f"h{i}", s) for i, s in enumerate(HostStatus)]
    data = results_json(results)
    text = json.dumps(data)
    assert text == json.dumps(plain(data))
    assert [json.loads(text)["hosts"][r.host]["status"] for r in results] == \
        ["ok", "changed", "failed", "skipped", "rolled_back"]


def test_a_status_and_a_verdict_print_as_their_values() -> None:
    # the summaries, the JUnit and the HTML interpolate members with f-strings and %
    assert f"{HostStatus.ROLLED_BACK}" == "rolled_back" == "%s" % HostStatus.ROLLED_BACK  # noqa: UP031
    assert f"{Verdict.TIMED_OUT} ({ActionKind.RESTART})" == "timed_out (restart)"
    ro = rollout.Rollout("1", "0", rolled_back=[HostResult("h1", HostStatus.SKIPPED)])
    assert json.dumps(rollout.rollout_json(ro)["rolled_back"]["h1"]["status"]) == '"skipped"'
