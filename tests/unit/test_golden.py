"""Golden rendered files: `invoke render` of one host per shipped model profile must give
exactly the files under tests/fixtures/golden/rendered/, every flag and line of them.

After a deliberate change to a template, profile, stack or group_vars, regenerate and
review the diff:

    INVOKE_VIGIL_INVENTORY=tests/fixtures/golden/inventory \\
      .venv/bin/invoke render --hosts all --out tests/fixtures/golden/rendered
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.paths import FIXTURES, REPO
from vigil.desired import inventory
from vigil.desired.targets import resolve

GOLDEN = FIXTURES / "golden"
INVOKE = str(Path(sys.executable).parent / "invoke")


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_every_shipped_profile_has_a_golden_unit() -> None:
    profiles = {p.stem for p in (REPO / "inventory" / "models").glob("*.yml")}
    hosts = {p.name for p in (GOLDEN / "rendered").iterdir()}
    assert hosts == profiles


def test_the_library_renders_the_golden_files() -> None:
    """The same, in process (what mutation testing sees): unit and masked env per host."""
    for t in resolve(inventory.load(GOLDEN / "inventory"), "all", operator_env={},
                     require_secrets=False):
        folder = GOLDEN / "rendered" / t.name
        assert t.rendered.unit_text == (folder / Path(t.rendered.paths.unit).name).read_text()
        assert t.rendered.env_masked == (folder / Path(t.rendered.paths.env).name).read_text()


def test_invoke_render_gives_the_golden_files(tmp_path: Path) -> None:
    env = {**os.environ, "INVOKE_VIGIL_INVENTORY": str(GOLDEN / "inventory")}
    proc = subprocess.run([INVOKE, "render", "--hosts", "all", "--out", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got, want = _files(tmp_path), _files(GOLDEN / "rendered")
    assert sorted(got) == sorted(want)
    for name, text in want.items():
        assert got[name] == text, f"{name} differs from its golden file (see module doc)"
    assert "hf_" not in "".join(got.values())  # secrets masked
    assert all((tmp_path / n).stat().st_mode & 0o777 == 0o600 for n in got
               if n.endswith(".env"))
