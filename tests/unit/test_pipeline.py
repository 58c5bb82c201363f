"""What a pipeline shows of a run: GitHub's job summary and one ::error:: per failed host."""

from __future__ import annotations

from pathlib import Path

import pytest

from vigil.report import HostResult
from vigil.tasks import pipeline


def results() -> list[HostResult]:
    return [HostResult("gpu-01", "changed", actions=["write_unit: /etc/...", "restart: x"]),
            HostResult("gpu-02", "failed", error="unreachable: connection refused\nmore",
                       verdict=None),
            HostResult("gpu-03", "failed", error="crashed in loading_weights",
                       verdict="crashed"),
            HostResult("gpu|04", "ok")]


def test_under_github_actions_each_failed_host_is_one_error_and_the_recap_a_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = tmp_path / "summary.md"
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    printed = pipeline.report("deploy", pipeline.deploy_rows(results()), env)
    assert printed.splitlines() == [
        "::error title=vigil deploy%3A gpu-02::gpu-02 failed: unreachable: connection refused",
        "::error title=vigil deploy%3A gpu-03::gpu-03 crashed: crashed in loading_weights"]
    assert capsys.readouterr().out.strip() == printed
    table = summary.read_text().splitlines()
    assert table[0] == "### vigil deploy: 2 of 4 hosts fine"
    assert "| gpu-01 | changed | write_unit, restart |" in table
    assert "| gpu\\|04 | ok | nothing to do |" in table  # a pipe never breaks the table
    assert "| gpu-03 | ❌ crashed | crashed in loading_weights |" in table


def test_host_text_cannot_inject_a_workflow_command_or_a_line() -> None:
    """A host's text with a newline and '::' would start a second workflow command
    (::add-mask::, ::set-output::): GitHub's escapes keep it inside the one message."""
    evil = HostResult("h1", "failed", error="boom%0A::add-mask::x\r\n\x1b]0;title\x07")
    printed = pipeline.report("deploy", pipeline.deploy_rows([evil]),
                              {"GITHUB_ACTIONS": "true"})
    assert printed.count("\n") == 0 and printed.count("::") == 2 + 2
    assert "%250A" in printed and "\x1b" not in printed and "\x07" not in printed


def test_outside_github_actions_nothing_is_printed_or_written(tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    assert pipeline.report("deploy", pipeline.deploy_rows(results()),
                           {"GITHUB_STEP_SUMMARY": str(summary)}) == ""
    assert not summary.exists()
