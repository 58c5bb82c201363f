"""The `vigil` command's manners: --help anywhere, usage errors exit 2 with the closest
task, -h never taken by a task flag, -i/--inventory on every task that reads one, and
the ops repo found from any folder inside it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vigil.tasks.collection import ns


def vigil(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vigil", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_help_after_a_task_is_that_tasks_help_even_with_a_positional(tmp_path: Path) -> None:
    for args in (["replay", "--help"], ["group.verify", "-h"], ["deploy", "--hosts", "x",
                                                                  "--help"]):
        proc = vigil(*args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"Usage: vigil [--core-opts] {args[0]} "), proc.stdout


def test_usage_errors_exit_2_and_name_the_closest_task(tmp_path: Path) -> None:
    typo = vigil("deplyo", cwd=tmp_path)
    assert typo.returncode == 2
    assert "No idea what 'deplyo' is! Did you mean 'deploy'?" in typo.stderr
    flag = vigil("deploy", "--hots", "a", cwd=tmp_path)
    assert flag.returncode == 2 and "Traceback" not in flag.stderr
    assert vigil("--version", cwd=tmp_path).stdout.startswith("vigil ")


def test_every_task_that_reads_an_inventory_takes_i_and_none_takes_h() -> None:
    for name in ns.task_names:
        flags = {n for a in ns[name].get_arguments() for n in a.names}
        assert "h" not in flags, name
        if name not in ("replay", "init"):
            assert {"inventory", "i"} <= flags, name
        if "hosts" in flags:
            assert "H" in flags, name  # the same short flag wherever --hosts is


def test_the_ops_repo_is_found_from_a_subfolder_and_relative_paths_are_its(
        tmp_path: Path) -> None:
    made = vigil("init", str(tmp_path / "ops"), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    deep = tmp_path / "ops" / "inventory" / "models"
    out = vigil("render", "--hosts", "all", "--out", "r", cwd=deep)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "ops" / "r" / "gpu-01" / "vllm.service").is_file()
    assert not (deep / "r").exists()
    moved = tmp_path / "elsewhere"
    (tmp_path / "ops" / "inventory").rename(moved)
    flagged = vigil("render", "--hosts", "all", "-i", str(moved), cwd=tmp_path / "ops")
    assert flagged.returncode == 0, flagged.stderr


@pytest.mark.parametrize("text, message", [
    ("inventroy: inv\n", "unknown setting 'inventroy'"),
    ("- a\n", "expected a mapping of vigil settings"),
])
def test_a_bad_vigil_yaml_is_one_error_naming_the_file(tmp_path: Path, text: str,
                                                      message: str) -> None:
    (tmp_path / "vigil.yaml").write_text(text)
    proc = vigil("render", "--hosts", "all", cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert str(tmp_path / "vigil.yaml") in proc.stderr and "Traceback" not in proc.stderr
