"""The reinstall incident for real: flashinfer-python 0.6.4 next to flashinfer-cubin 0.6.3,
with the real wheels, on a real lab host running the vLLM CPU build.

`import flashinfer` checks its pair and raises at once when they differ (LAB.md). The
lab stack `lab-cpu-flashinfer` pins the matching 0.6.3 pair with the same_version rule
and verifies `import vllm` and `import flashinfer` before an environment may become
current; the profile `tiny-cpu-flashinfer` makes every vLLM worker import flashinfer at
init, as the CUDA build does.

Host lab7 belongs to this module, and the order of the tests is the story: one
environment is built and reused, drifted by hand, crashes a start, is repaired beside.
The wheels come from the lab's machine-wide wheel cache (lab/wheels.py); lab7 installs
with uv (4x faster than pip, bench/runtime/RESULTS.md).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import hosts, wheels
from tests.paths import REPO
from vigil.verify import replay

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.drives(7)]

INVOKE = str(Path(sys.executable).parent / "invoke")
HOST, INDEX = "lab7", 7
UV = "/opt/vigil/bin/uv"  # wheels.install_uv puts it there
CURRENT = "/opt/vigil/envs/current"
STACK = "lab-cpu-flashinfer"
PAIR = ("flashinfer-python==0.6.3", "flashinfer-cubin==0.6.3", "flashinfer-python==0.6.4")
# flashinfer 0.6.4's own words, from flashinfer/jit/env.py (_get_cubin_dir)
MISMATCH = ("RuntimeError: flashinfer-cubin version (0.6.3) does not match flashinfer "
            "version (0.6.4). Please install the same version of both packages.")


def sh(command: str, timeout: float = 300) -> str:
    code, out, err = hosts.run(INDEX, command, timeout=timeout)
    assert code == 0, f"{HOST}: {command}: {err or out}"
    return out.strip()


def current() -> str:
    return sh(f"readlink {CURRENT}")


def main_pid() -> int:
    return int(sh("systemctl show vllm -p MainPID --value"))


def family(env_dir: str) -> str:
    return re.sub(r"-r\d+$", "", env_dir)


def health(within_s: float = 60.0) -> int | None:
    """/health's status once it answers 200, else its last answer (None: no answer) after
    within_s: a loaded 2-core machine can keep a serving vLLM from answering in 3 s (one
    try then read a healthy server as down), so this waits on the answer, not a clock."""
    deadline = time.monotonic() + within_s
    last: int | None = None
    while True:
        try:
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{hosts.service_port(INDEX)}/health", timeout=10) as r:
                last = int(r.status)
        except Exception:
            last = None
        if last == 200 or time.monotonic() >= deadline:
            return last
        time.sleep(1)


def journal(invocation: str | None = None) -> str:
    """The service's journal of one start (default: the latest)."""
    inv_id = invocation or sh("systemctl show vllm -p InvocationID --value")
    return sh(f"journalctl -u vllm -o cat --no-pager _SYSTEMD_INVOCATION_ID={inv_id}")


def envs_named(prefix: str) -> str:
    return sh(f"find /opt/vigil/envs -maxdepth 1 -type d -name '{prefix}-*' | wc -l")


@pytest.fixture(scope="module")
def inv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """lab7 up with uv, the wheels cached, and an inventory where lab7 runs the flashinfer
    profile and stack; beside it the two broken stacks of the incident."""
    if not any(h.name == HOST and h.running for h in hosts.status()):
        hosts.up(INDEX)  # lab1..lab7; hosts already running stay as they are
    cached = wheels.ensure(*PAIR)
    print(f"wheel cache {wheels.machine_dir()}: downloaded {cached.downloaded or 'nothing'}")
    wheels.install_uv(INDEX)
    root = tmp_path_factory.mktemp("flashinfer") / "inventory"
    shutil.copytree(REPO / "inventory", root)
    (root / "host_vars" / f"{HOST}.yml").write_text(
        f"model: tiny-cpu-flashinfer\nstack: {STACK}\n")
    text = (REPO / "inventory" / "stacks" / f"{STACK}.yml").read_text()
    bumped = text.replace(f"name: {STACK}", f"name: {STACK}-bump").replace(
        'flashinfer-python: "0.6.3"', 'flashinfer-python: "0.6.4"')
    assert bumped.count("0.6.4") == 2  # the pin, and the rule's comment
    (root / "stacks" / f"{STACK}-bump.yml").write_text(bumped)
    norule = re.sub(r"  same_version:\n    - \[flashinfer-python, flashinfer-cubin\]\n", "",
                    bumped.replace(f"name: {STACK}-bump", f"name: {STACK}-norule"))
    assert "same_version" not in norule
    (root / "stacks" / f"{STACK}-norule.yml").write_text(norule)
    yield root
    # 2 cores: no vLLM left running; 4 GB per environment: keep only the current one
    hosts.run(INDEX, "systemctl stop vllm; systemctl reset-failed vllm", timeout=120)
    hosts.run(INDEX, f"cd /opt/vigil/envs && for d in {STACK}-*; do [ -d \"$d\" ] && "
              f"[ \"/opt/vigil/envs/$d\" != \"$(readlink current)\" ] && rm -rf \"$d\" "
              "\"$d.install.log\" \"$d.constraints.txt\"; done; true", timeout=300)


def invoke(inv: Path, *args: str, timeout: float = 1500,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([INVOKE, *args], cwd=REPO, capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, "INVOKE_VIGIL_INVENTORY": str(inv),
                                               **(env or {})})
    print(f"$ invoke {' '.join(args)}  -> {res.returncode}\n{res.stdout}{res.stderr}")
    return res


def test_matching_pair_serves(inv: Path) -> None:
    """Built (and its imports verified) on a fresh host; an earlier run's environment is
    reused as it is: test_deploy_repairs... below proves every build's import check."""
    res = invoke(inv, "deploy", "--hosts", HOST)
    assert res.returncode == 0, res.stdout + res.stderr
    assert health() == 200
    assert current().startswith(f"/opt/vigil/envs/{STACK}-")
    assert sh(f"test -f {CURRENT}/.vigil-complete && echo yes") == "yes"
    assert sh(f"{CURRENT}/bin/python -c \"import importlib.metadata as m; "
              "print(m.version('flashinfer-python'), m.version('flashinfer-cubin'))\"") == \
        "0.6.3 0.6.3"
    # every worker imported flashinfer at init (the worker extension of the profile)
    assert "Injected <class 'flashinfer.artifacts.ArtifactPath'>" in journal()
    check = invoke(inv, "stack.check", "--hosts", HOST)
    assert check.returncode == 0 and f" ok  /opt/vigil/envs/{STACK}-" in check.stdout


def test_reinstall_moving_flashinfer_python_alone_is_refused(inv: Path) -> None:
    """The incident's reinstall: a stack whose flashinfer-python moved to 0.6.4 alone.
    Refused before any host is touched; the running service keeps serving."""
    before_env, before_pid = current(), main_pid()
    res = invoke(inv, "deploy", "--hosts", HOST, "--reinstall", "--stack", f"{STACK}-bump")
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert (f"{STACK}-bump.yml: the pins break rule same_version(flashinfer-python, "
            "flashinfer-cubin): flashinfer-cubin 0.6.3 (must be 0.6.4 like the others)") in out
    assert "fix: pin flashinfer-cubin to 0.6.4 too, or put the others back to 0.6.3" in out
    assert (current(), main_pid(), health()) == (before_env, before_pid, 200)
    assert envs_named(f"{STACK}-bump") == "0"


def test_hand_made_drift_is_reported_with_the_fix(inv: Path) -> None:
    env = current()
    # a uv environment (no pip in it): the drift made the way its fix says
    sh(f"VIRTUAL_ENV={CURRENT} UV_CACHE_DIR=/opt/vigil/envs/.uv-cache {UV} pip install -q "
       f"--no-deps --no-index --find-links {wheels.IN_HOST} flashinfer-python==0.6.4")
    res = invoke(inv, "stack.check", "--hosts", HOST)
    assert res.returncode == 1 and "DRIFT" in res.stdout, res.stdout
    assert (f"flashinfer-python 0.6.4 breaks pin: pinned ==0.6.3; fix: VIRTUAL_ENV={env} "
            f"{UV} pip install flashinfer-python==0.6.3") in res.stdout
    assert ("flashinfer-python 0.6.4 breaks same_version(flashinfer-python, flashinfer-cubin): "
            "must be 0.6.3 like the others") in res.stdout
    # the running server imported flashinfer before the drift: it keeps serving
    assert health() == 200


def test_a_start_that_imports_the_drifted_pair_crashes_with_cause_and_remedy(
        inv: Path, tmp_path: Path) -> None:
    start = sh("systemctl restart vllm && systemctl show vllm -p InvocationID --value")
    try:
        res = invoke(inv, "verify", "--hosts", HOST, "--poll", "2",
                     env={"INVOKE_VIGIL_STATE_DIR": str(tmp_path)})
    finally:
        # the API server outlives its dead engine (SIGTERM would wait TimeoutStopSec)
        sh("systemctl kill -s SIGKILL vllm; systemctl stop vllm; systemctl reset-failed vllm")
    out = res.stdout + res.stderr
    assert res.returncode == 3, out
    assert "crashed (flashinfer_version_mismatch)" in out
    assert "flashinfer-cubin version (0.6.3) does not match flashinfer version (0.6.4)" in out
    assert "pip install flashinfer-cubin==0.6.4" in out  # the remedy
    # the real message, as the worker raised it, in the service's journal
    assert MISMATCH in journal(start)
    # within one poll: the verdict came at the first poll whose new lines held it
    (trace,) = (tmp_path / "traces").glob(f"{HOST}-*.jsonl")
    snaps = replay.load(trace)[1]
    first = next(i for i, snap in enumerate(snaps)
                 if any(MISMATCH in line.text for line in snap.journal.lines))
    assert first == len(snaps) - 1


def test_deploy_repairs_beside_and_switches_after_the_import_check(inv: Path) -> None:
    drifted = current()
    res = invoke(inv, "deploy", "--hosts", HOST)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "install_env: flashinfer-python 0.6.4 != 0.6.3" in out
    # switched to only after each of the stack's modules imported in the new environment
    assert re.search(r"verified \(uv, [\d.]+ s\): pins, rules, pip check, "
                     r"import vllm, flashinfer", out), out
    after = current()
    assert after != drifted and after.startswith(family(drifted) + "-r")  # built beside
    assert health() == 200
    assert invoke(inv, "stack.check", "--hosts", HOST).returncode == 0
    # the drifted environment is the kept release (rollback), untouched
    assert sh("cat /var/lib/vigil/backup/vllm/current") == drifted


def test_without_the_rule_the_import_check_catches_the_pair(inv: Path) -> None:
    """Same drifted pins, rule taken out: pins and pip check pass; `import flashinfer`
    in the new environment does not, so nothing is switched or restarted."""
    before_env, before_pid = current(), main_pid()
    res = invoke(inv, "deploy", "--hosts", HOST, "--stack", f"{STACK}-norule")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "failed verification; nothing was switched or restarted" in out
    assert f"import flashinfer: {MISMATCH}" in out
    # the fix is the log catalog's, the same a crashed start gets
    assert re.search(r"fix: .*pip install flashinfer-cubin==0\.6\.4", out), out
    assert (current(), main_pid(), health()) == (before_env, before_pid, 200)
    assert envs_named(f"{STACK}-norule") == "0"
