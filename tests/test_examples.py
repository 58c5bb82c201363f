"""The CI recipes in examples/ run only commands vigil has, with flags it knows.

Every `invoke` line of every `run:` step is parsed by Invoke's own parser against
vigil's task collection (what `invoke` does before it runs anything), and the values of
the rollout flags go through vigil's own parsers, so a renamed task or flag, or a
`--serial` vigil would refuse, fails here instead of in someone's pipeline.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from invoke.exceptions import ParseError
from invoke.parser.context import ParserContext
from invoke.parser.parser import Parser

import tasks
from vigil.deploy import hooks, rollout

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.yml"))


def run_steps(doc: dict[str, Any]) -> list[str]:
    scripts = []
    for job in (doc.get("jobs") or {}).values():
        for step in job.get("steps") or []:
            if "run" in step:
                scripts.append(str(step["run"]))
    return scripts


def invoke_commands(script: str) -> list[list[str]]:
    """The argv (after `invoke`) of each invoke command in a shell script."""
    joined = script.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words and words[0].endswith("invoke"):
                found.append(words[1:])
    return found


def parse(argv: list[str]) -> dict[str, Any]:
    parser = Parser(initial=ParserContext(), contexts=tasks.ns.to_contexts())
    result = parser.parse_argv(argv)
    assert len(result) == 2, f"one task per command: {argv}"
    task = result[1]
    return {"task": task.name, **{k: a.value for k, a in task.args.items() if a.got_value}}


def test_there_is_a_pipeline_example() -> None:
    assert EXAMPLES, "examples/*.yml"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_invoke_command_exists_with_its_flags(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    commands = [c for s in run_steps(doc) for c in invoke_commands(s)]
    assert len(commands) >= 3, "canary deploy, verify, rolling deploy"
    parsed = [parse(argv) for argv in commands]
    for args in parsed:
        if args.get("serial"):
            rollout.parse_serial(args["serial"])
        if args.get("max-fail"):
            rollout.parse_budget(args["max-fail"])
        hooks.Hooks.parse(args.get("before-stop"), args.get("after-ready"))
    rolls = [a for a in parsed if a["task"] == "deploy" and a.get("serial")]
    assert rolls and all(a.get("junit") and a.get("json") for a in rolls)  # published
    assert any(a["task"] == "verify" for a in parsed)


def test_the_checker_catches_a_wrong_flag_and_a_wrong_task() -> None:
    with pytest.raises(ParseError):
        parse(invoke_commands(".venv/bin/invoke deploy --hosts x --serail 25%")[0])
    with pytest.raises(ParseError):
        parse(invoke_commands("invoke deploi --hosts x")[0])
