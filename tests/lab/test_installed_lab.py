"""vigil as a user meets it: a wheel built from this checkout, installed in a fresh venv
outside it, run from the user's own ops repository — never from the checkout.

`vigil init` scaffolds an empty folder (which renders at once from the wheel's built-in
templates), the test adds lab host lab1 with the tiny model, `vigil deploy` runs from a
subfolder of that repo, and `invoke verify` runs through the scaffold's two-line
tasks.py: ready, with the reports and the history mirror under the ops repo and nothing
written in the checkout. The unit is its own (vllm-e2e, port 8197), so lab1's
vllm.service of the other modules is untouched; the stack is lab-cpu, whose environment
lab1 already holds (same hash, same env_root): no reinstall.

The interpreter is VIGIL_E2E_PYTHON when set (.ci/run sets the newest CPython it finds,
3.13 where the machine has it), else this one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from lab import hosts as lab
from tests.paths import REPO

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.drives(1, 2)]

INDEX, UNIT, PORT = 1, "vllm-e2e", 8197
PYTHON = os.environ.get("VIGIL_E2E_PYTHON") or sys.executable


def run(args: list[str], cwd: Path, timeout: float = 900,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # no INVOKE_VIGIL_* from the test session: the ops repo alone decides
    clean = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_VIGIL_")}
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**clean, **(env or {})})
    print(f"$ {' '.join(args)}  (in {cwd})\n{proc.stdout}{proc.stderr}")
    return proc


def checkout_state() -> str:
    """What a run could leave in the checkout: git's view plus the ignored state/."""
    status = subprocess.run(["git", "status", "--porcelain", "--ignored",
                             "--untracked-files=all", "--", "state", "rendered", "reports",
                             "inventory", "build", "dist", "summary.md"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout
    return status


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from this checkout, in a fresh venv: its bin/ folder."""
    work = tmp_path_factory.mktemp("installed")
    dist = work / "dist"
    # built from a copy: setuptools writes build/ and *.egg-info into the tree it builds
    source = work / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "state", "mutants", "build", "dist", "*.egg-info", "__pycache__",
        ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"))
    built = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist),
                 str(source)], cwd=work)
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("vigil_vllm-*.whl")  # the distribution vigil-vllm (issue 29.2)
    venv = work / "venv"
    assert run([PYTHON, "-m", "venv", str(venv)], cwd=work).returncode == 0
    pip = run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
               "--disable-pip-version-check", "-c", str(REPO / "requirements.lock"),
               str(wheel)], cwd=work)
    assert pip.returncode == 0, pip.stderr
    return venv / "bin"


@pytest.fixture(scope="module")
def ops_repo(installed: Path, lab_hosts: list[lab.HostStatus],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    assert f"lab{INDEX}" in {h.name for h in lab_hosts}
    repo = tmp_path_factory.mktemp("user") / "ops"
    made = run([str(installed / "vigil"), "init", str(repo)], cwd=repo.parent)
    assert made.returncode == 0, made.stderr
    yield repo
    lab.run(INDEX, f"systemctl stop {UNIT}; systemctl disable {UNIT}; "
            f"rm -f /etc/systemd/system/{UNIT}.service; systemctl daemon-reload", timeout=120)


def test_the_installed_wheel_carries_the_tool_and_nothing_of_the_checkout(
        installed: Path) -> None:
    site = run([str(installed / "python"), "-c",
                "import vigil, pathlib; print(pathlib.Path(vigil.__file__).parent)"],
               cwd=installed)
    package = Path(site.stdout.strip())
    assert REPO not in package.parents, package
    for shipped in ("roles/service/templates/vllm.service.j2", "roles/verify/defaults.yml",
                    "host/agent.py", "scaffold/vigil.yaml"):
        assert (package / shipped).is_file(), shipped
    assert not (package.parent / "lab").exists()  # the lab is the checkout's test bench
    # every module of the checkout's package, none left out of the wheel
    ours = {p.relative_to(REPO / "vigil") for p in (REPO / "vigil").rglob("*.py")}
    assert ours <= {p.relative_to(package) for p in package.rglob("*.py")}
    version = run([str(installed / "vigil"), "--version"], cwd=installed)
    assert version.returncode == 0 and version.stdout.startswith("vigil "), version.stdout
    assert "0.0.0+source" not in version.stdout  # the version of the installed vigil-vllm
    shown = run([str(installed / "python"), "-m", "pip", "show", "vigil-vllm"], cwd=installed)
    assert shown.returncode == 0 and "Name: vigil-vllm" in shown.stdout, shown.stdout
    listed = run([str(installed / "vigil"), "--list"], cwd=installed)
    assert "deploy" in listed.stdout and "lab.up" not in listed.stdout
    typo = run([str(installed / "vigil"), "deplyo"], cwd=installed)
    assert typo.returncode == 2 and "Did you mean 'deploy'?" in typo.stderr


def test_init_scaffolds_a_repo_that_renders_at_once_and_never_overwrites(
        installed: Path, ops_repo: Path) -> None:
    for f in ("vigil.yaml", "tasks.py", ".gitignore", "README.md", "inventory/hosts.yml",
              "inventory/group_vars/all.yml", "inventory/models/example-model.yml",
              "inventory/stacks/vllm-0.16-nightly.yml", ".github/workflows/vigil-rollout.yml"):
        assert (ops_repo / f).is_file(), f
    rendered = run([str(installed / "vigil"), "render", "--hosts", "all"],
                   cwd=ops_repo / "inventory")  # from a subfolder: the same repo
    assert rendered.returncode == 0, rendered.stderr
    unit = ops_repo / "rendered" / "gpu-01" / "vllm.service"
    assert unit.is_file() and "--model=/srv/models/example-model" in unit.read_text()
    assert "site-packages/vigil/roles/service/templates/vllm.service.j2)" in rendered.stdout
    # a second init overwrites nothing: every file is there, so it adds none (29.10)
    again = run([str(installed / "vigil"), "init"], cwd=ops_repo)
    assert again.returncode == 0 and again.stdout.startswith("nothing to add"), again.stdout
    assert "Traceback" not in again.stderr
    shutil.rmtree(ops_repo / "rendered")


def test_deploy_and_verify_from_the_users_repo_against_a_lab_host(
        installed: Path, ops_repo: Path) -> None:
    """The user's repo gets lab1 with the tiny model; deploy from a subfolder, verify
    through the two-line tasks.py with `invoke`: ready, state in the user's repo only."""
    inv = ops_repo / "inventory"
    shutil.copy(REPO / "inventory" / "models" / "tiny-cpu.yml", inv / "models")
    shutil.copy(REPO / "inventory" / "stacks" / "lab-cpu.yml", inv / "stacks")
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["hosts"]["e2e"] = {"address": "127.0.0.1", "ssh_port": lab.host_port(INDEX),
                             "port": PORT}
    # nothing listens on port 1: a host the pipeline must report as failed
    hosts["hosts"]["gone"] = {"address": "127.0.0.1", "ssh_port": 1, "port": PORT}
    hosts["groups"]["lab"] = {"hosts": ["e2e", "gone"], "vars": {
        "model": "tiny-cpu", "stack": "lab-cpu", "service": UNIT, "ssh_user": "root",
        "ssh_key": str(lab.key_path()), "known_hosts": str(lab.known_hosts_path()),
        "connect_timeout_s": 5}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    before = checkout_state()
    deployed = run([str(installed / "vigil"), "deploy", "--hosts", "e2e", "--json",
                    "reports/deploy.json"], cwd=inv / "models")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    summary = json.loads((ops_repo / "reports" / "deploy.json").read_text())
    assert summary["ok"] is True and summary["hosts"]["e2e"]["status"] == "changed"
    github = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(ops_repo / "summary.md")}
    verified = run([str(installed / "invoke"), "verify", "--hosts", "e2e", "--json",
                    "reports/verify.json"], cwd=ops_repo, env=github)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads((ops_repo / "reports" / "verify.json").read_text())
    assert report["hosts"]["e2e"]["verdict"] == "ready", report
    assert "::error" not in verified.stdout
    # the pipeline's view of a failed host, from a real run: one annotation, one row
    lost = run([str(installed / "vigil"), "deploy", "--hosts", "gone"], cwd=ops_repo,
               env=github)
    assert lost.returncode == 8, lost.stdout + lost.stderr  # UNREACHABLE
    (annotation,) = [ln for ln in lost.stdout.splitlines() if ln.startswith("::error")]
    assert annotation.startswith("::error title=vigil deploy%3A gone::gone UNREACHABLE: ")
    summary = (ops_repo / "summary.md").read_text()
    assert "### vigil verify: 1 of 1 hosts fine" in summary and "| e2e | ready |" in summary
    assert "### vigil deploy: 0 of 1 hosts fine" in summary
    assert "| gone | ❌ UNREACHABLE |" in summary
    assert (ops_repo / "state" / "history.sqlite").is_file()
    # the installed vLLM's own parser decides the flags: one it lacks is refused up front
    unit = lab.run(INDEX, f"cat /etc/systemd/system/{UNIT}.service")[1]
    refused = run([str(installed / "vigil"), "deploy", "--hosts", "e2e", "--set",
                   "extra_args=[--no-such-option-of-vllm]"], cwd=ops_repo)
    said = refused.stdout + refused.stderr  # the host's line, then the recap
    assert refused.returncode == 2, said
    assert "e2e: vLLM 0.32.0 in /opt/vigil/envs/lab-cpu-" in said, said
    assert "rejects --no-such-option-of-vllm: its own argument parser has no such " \
        "option" in said, said
    assert lab.run(INDEX, f"cat /etc/systemd/system/{UNIT}.service")[1] == unit
    assert checkout_state() == before  # nothing written in the checkout
