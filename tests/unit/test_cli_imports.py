"""`vigil --version`, `--help` and `--list` start without any task's library (issue 30.2):
a task imports what it needs when it runs. bench/cli/ measures the time."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.paths import REPO

# Libraries of the tasks, and vigil's own packages that load them: none at start.
HEAVY = ("paramiko", "fabric", "pydantic", "jinja2", "rich", "cryptography",
         "vigil.deploy", "vigil.transport", "vigil.desired.inventory", "vigil.desired.render",
         "vigil.verify.watch", "vigil.verify.reducer", "vigil.verify.catalog")
_ROW = re.compile(r"import time:\s+\d+ \|\s+\d+ \|\s*(\S+)")


def _imported(*argv: str) -> set[str]:
    got = subprocess.run([sys.executable, "-X", "importtime", "-m", "vigil", *argv],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert got.returncode == 0, got.stderr[-2000:]
    return {m.group(1) for m in map(_ROW.match, got.stderr.splitlines()) if m}


@pytest.mark.parametrize("argv", [("--version",), ("--help",), ("--list",),
                                  ("--help", "deploy")])
def test_the_cli_starts_without_any_tasks_library(argv: tuple[str, ...]) -> None:
    names = _imported(*argv)
    assert "vigil.cli" in names and "vigil.tasks.deploy" in names
    loaded = sorted(n for n in names for h in HEAVY if n == h or n.startswith(h + "."))
    assert loaded == []


def test_version_prints_the_version() -> None:
    from vigil import __version__

    got = subprocess.run([sys.executable, "-m", "vigil", "--version"], capture_output=True,
                         text=True, cwd=REPO, timeout=60)
    assert got.returncode == 0 and got.stdout.strip() == f"vigil {__version__}"


def test_deploys_forks_default_is_the_librarys() -> None:
    from vigil.deploy import apply
    from vigil.tasks import deploy

    assert deploy.FORKS == apply.FORKS
