"""The CI recipes `vigil init` writes (vigil/scaffold/ci/: GitHub Actions and GitLab CI)
run only commands vigil has, with flags it knows.

Every `vigil`/`invoke` line of every GitHub `run:` step and GitLab `script:` entry is
parsed by Invoke's own parser against vigil's task collection (what the command does
before it runs anything), and the values of the rollout flags go through vigil's own
parsers, so a renamed task or flag, or a `--serial` vigil would refuse, fails here
instead of in someone's pipeline. The recipes install vigil from a pin (never a
vendored checkout) and publish JUnit.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from invoke.exceptions import ParseError
from invoke.parser.context import ParserContext
from invoke.parser.parser import Parser

from tests.paths import REPO
from vigil.deploy import hooks, rollout
from vigil.tasks.collection import ns

EXAMPLES = sorted((REPO / "vigil" / "scaffold" / "ci")
                  .glob("*.yml"))


def run_steps(doc: dict[str, Any]) -> list[str]:
    """GitHub's jobs.*.steps[].run, or GitLab's script/before_script lists."""
    scripts = []
    for job in (doc.get("jobs") or {}).values():
        for step in job.get("steps") or []:
            if "run" in step:
                scripts.append(str(step["run"]))
    for name, job in doc.items():
        if isinstance(job, dict) and name not in ("jobs", "variables"):
            for key in ("before_script", "script"):
                scripts += [str(line) for line in job.get(key) or []]
    return scripts


def invoke_commands(script: str) -> list[list[str]]:
    """The argv (after `invoke`) of each invoke command in a shell script."""
    joined = script.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words and words[0].endswith(("invoke", "vigil")):
                found.append(words[1:])
    return found


def parse(argv: list[str]) -> dict[str, Any]:
    parser = Parser(initial=ParserContext(), contexts=ns.to_contexts())
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
    assert rolls and all(a.get("junit") for a in rolls)  # published
    assert any(a["task"] == "verify" for a in parsed)
    text = path.read_text()
    # from an exact pin of vigil's own distribution, wheels only: never a vendored
    # checkout, never "vigil" (another project on the index, issue 29.2)
    assert 'pip install --only-binary=:all: "vigil-vllm==$VIGIL_VERSION"' in text or \
        'pip install -q --only-binary=:all: "vigil-vllm==$VIGIL_VERSION"' in text
    assert "{vigil_version}" in text  # vigil init writes its own version there
    if "jobs" in doc:  # GitHub: a stock runner's Python, the reports published
        assert "actions/setup-python@" in text and "action-junit-report@" in text


def test_the_checker_catches_a_wrong_flag_and_a_wrong_task() -> None:
    with pytest.raises(ParseError):
        parse(invoke_commands(".venv/bin/invoke deploy --hosts x --serail 25%")[0])
    with pytest.raises(ParseError):
        parse(invoke_commands("invoke deploi --hosts x")[0])


SECRETS = ("HF_TOKEN", "SSH_KEY", "VLLM_API_KEY")


def test_the_github_recipe_gives_each_secret_only_to_the_steps_that_use_it() -> None:
    """Issue 29.2: a workflow-wide HF_TOKEN was in the environment of `pip install`."""
    path = REPO / "vigil" / "scaffold" / "ci" / "github-actions.yml"
    doc = yaml.safe_load(path.read_text())
    assert "secrets." not in str(doc.get("env")), "a secret in the workflow's env"
    (job,) = doc["jobs"].values()
    assert "secrets." not in str(job.get("env")), "a secret in the job's env"
    steps = job["steps"]
    for step in steps:
        env = str(step.get("env") or "")
        run = str(step.get("run") or "")
        if "pip install" in run:
            assert "secrets." not in env and "secrets." not in run, step
        if "secrets.HF_TOKEN" in env:
            assert "vigil deploy" in run, step  # deploy writes it into the unit's env file
    given = [s for s in steps if "secrets.HF_TOKEN" in str(s.get("env"))]
    deploys = [s for s in steps if "vigil deploy" in str(s.get("run"))]
    assert given == deploys  # the plan (--check renders the env file) and each deploy


def test_the_gitlab_recipe_installs_with_no_secret_and_scopes_the_jobs() -> None:
    path = REPO / "vigil" / "scaffold" / "ci" / "gitlab-ci.yml"
    doc = yaml.safe_load(path.read_text())
    (install,) = [ln for ln in doc["default"]["before_script"] if "pip install" in ln]
    assert install.startswith("env -u HF_TOKEN -u SSH_KEY pip install"), install
    jobs = {k: v for k, v in doc.items() if isinstance(v, dict) and "script" in v}
    assert jobs and all(j["environment"]["name"] == "fleet" for j in jobs.values())
    assert "secret" not in str(doc.get("variables")).lower()


# -- issue 29.9: recipes that work as they are, checked by a well-kept validator ------

GITHUB = REPO / "vigil" / "scaffold" / "ci" / "github-actions.yml"
GITLAB = REPO / "vigil" / "scaffold" / "ci" / "gitlab-ci.yml"
SCHEMAS = {GITHUB: "vendor.github-workflows", GITLAB: "vendor.gitlab-ci"}


def check_jsonschema(path: Path, schema: str) -> subprocess.CompletedProcess[str]:
    """check-jsonschema with its own vendored schema (no network)."""
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                           schema, str(path)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_each_recipe_vigil_init_writes_passes_its_platforms_schema(
        ci: str, tmp_path: Path) -> None:
    from vigil.tasks import init

    init.scaffold(tmp_path, ci)
    written = tmp_path / init.CI[ci]
    assert "{vigil_version}" not in written.read_text()
    done = check_jsonschema(written, SCHEMAS[REPO / "vigil" / "scaffold" / init.CI_SOURCE[ci]])
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_schema_check_sees_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / "wf.yml"
    broken.write_text(GITHUB.read_text().replace("checks: write", "checks: writ"))
    assert check_jsonschema(broken, SCHEMAS[GITHUB]).returncode == 1
    job = tmp_path / "gl.yml"
    job.write_text(GITLAB.read_text().replace("when: manual", "when: by_hand"))
    assert check_jsonschema(job, SCHEMAS[GITLAB]).returncode == 1


def test_the_github_recipe_knows_the_host_keys_may_publish_and_runs_where_hosts_are() -> None:
    doc = yaml.safe_load(GITHUB.read_text())
    # the JUnit action publishes a check run: without checks: write a good rollout ends red
    assert doc["permissions"] == {"contents": "read", "checks": "write"}
    (job,) = doc["jobs"].values()
    assert "self-hosted" in job["runs-on"]  # a hosted runner cannot reach private hosts
    names = [s.get("name", s.get("uses")) for s in job["steps"]]
    keys = names.index("Host keys")
    first_vigil = next(i for i, s in enumerate(job["steps"]) if "vigil " in str(s.get("run")))
    assert keys < first_vigil  # strict host keys: a fresh runner knows none (exit 8)
    step = job["steps"][keys]
    assert "ssh-keyscan" not in step["run"]  # trusting whoever answers is no check
    assert "~/.ssh/known_hosts" in step["run"] and "inventory/known_hosts" in step["run"]
    for s in job["steps"]:  # a secret reaches a script by env, never pasted into it
        assert "${{ secrets." not in str(s.get("run")), s


def test_only_the_default_branch_deploys_on_gitlab() -> None:
    doc = yaml.safe_load(GITLAB.read_text())
    jobs = {k: v for k, v in doc.items() if isinstance(v, dict) and "script" in v}
    assert set(jobs) == {"plan", "canary", "rollout"}
    for name, job in jobs.items():
        assert [r["if"] for r in job["rules"]] == [
            "$CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH"], name
        assert "when" not in job or name != "rollout"  # `when` sits in the rule
    assert jobs["rollout"]["rules"][0]["when"] == "manual"
    assert doc["default"]["tags"] == ["fleet"]  # its own runner, inside the network
    script = "\n".join(doc["default"]["before_script"])
    assert "SSH_KNOWN_HOSTS" in script and "~/.ssh/known_hosts" in script
    assert "ssh-keyscan" not in script
