"""`vigil init` (issue 29.10): no DIR is here, as its help says; an existing repository
(an Ansible one) gets only the missing files and keeps its own inventory, .gitignore and
README.md; everything is checked before anything is written; a planted link is never
followed.

Before: `vigil init` with no DIR failed (Invoke: "did not receive required positional
arguments"), an Ansible repo was refused for its .gitignore, and would have got a
hosts.yml beside its hosts.ini (then: two hosts files)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vigil.desired import inventory
from vigil.errors import ConfigError
from vigil.tasks import init


def vigil(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vigil", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() if p.is_file() else "/"
            for p in sorted(root.rglob("*")) if not p.is_symlink()}


def test_init_with_no_dir_is_here(tmp_path: Path) -> None:
    made = vigil("init", "--ci", "gitlab", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "vigil.yaml").is_file() and (tmp_path / ".gitlab-ci.yml").is_file()
    assert (tmp_path / "inventory" / "hosts.yml").is_file()
    again = vigil("init", "--ci", "gitlab", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"nothing to add: {tmp_path} has every file"), again.stdout
    assert vigil("init", "ops", cwd=tmp_path).returncode == 0  # a DIR still works
    assert (tmp_path / "ops" / "vigil.yaml").is_file()


def _ansible_repo(root: Path) -> dict[str, str]:
    (root / "inventory" / "group_vars" / "all").mkdir(parents=True)
    (root / "ansible.cfg").write_text("[defaults]\ninventory = inventory/hosts.ini\n")
    (root / "inventory" / "hosts.ini").write_text("[gpu]\ngpu-[01:02]\n")
    (root / "inventory" / "group_vars" / "all" / "main.yml").write_text("ntp: x\n")
    (root / ".gitignore").write_text("*.retry\n")
    (root / "README.md").write_text("# our playbooks\n")
    return _tree(root)


def test_an_ansible_repo_gets_only_the_missing_files_and_keeps_its_inventory(
        tmp_path: Path) -> None:
    before = _ansible_repo(tmp_path)
    made = vigil("init", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    after = _tree(tmp_path)
    assert {k: after[k] for k in before} == before  # nothing of theirs changed
    added = set(after) - set(before)
    assert {"vigil.yaml", "tasks.py", ".github/workflows/vigil-rollout.yml",
            "inventory/models/example-model.yml",
            "inventory/stacks/vllm-0.16-nightly.yml"} <= added, added
    assert "inventory/hosts.yml" not in added  # not beside hosts.ini
    assert "inventory/group_vars/all.yml" not in added  # not beside group_vars/all/
    assert "inventory: inventory/hosts.ini  # as ansible.cfg says" in after["vigil.yaml"]
    assert "your .gitignore lacks /state/, /rendered/, /reports/" in made.stdout
    inv = inventory.load(tmp_path / "inventory" / "hosts.ini")  # one hosts file: reads
    assert inv.select("gpu") == ["gpu-01", "gpu-02"]


def test_a_planted_inventory_link_is_never_followed_and_nothing_is_written(
        tmp_path: Path) -> None:
    repo, elsewhere = tmp_path / "repo", tmp_path / "elsewhere"
    repo.mkdir()
    elsewhere.mkdir()
    (repo / "inventory").symlink_to(elsewhere)
    made = vigil("init", cwd=repo)
    assert made.returncode == 2 and "Traceback" not in made.stderr, made.stderr
    assert f"{repo / 'inventory'}: is a symbolic link (to {elsewhere}): vigil init " \
        "writes only into real folders" in made.stderr
    assert "nothing was written" in made.stderr
    assert list(elsewhere.iterdir()) == [] and sorted(p.name for p in repo.iterdir()) == [
        "inventory"]


def test_a_conflict_found_late_writes_nothing(tmp_path: Path) -> None:
    """vigil.yaml is the last file of the plan: a folder in its place is found before
    any file is written; so is a file where the workflow folder goes."""
    (tmp_path / "vigil.yaml").mkdir()
    with pytest.raises(ConfigError) as err:
        init.scaffold(tmp_path)
    assert f"{tmp_path / 'vigil.yaml'}: is not a regular file" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vigil.yaml"]
    (tmp_path / "vigil.yaml").rmdir()
    (tmp_path / ".github").write_text("not a folder\n")
    with pytest.raises(ConfigError) as err:
        init.scaffold(tmp_path)
    assert f"{tmp_path / '.github'}: is not a folder" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".github"]


def test_a_write_that_fails_midway_takes_back_what_it_wrote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = init.os.fdopen
    calls = []

    def failing(fd: int, *args: object, **kwargs: object) -> object:
        calls.append(fd)
        if len(calls) == 3:
            init.os.close(fd)
            raise OSError(28, "No space left on device", "somewhere")
        return real(fd, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(init.os, "fdopen", failing)
    target = tmp_path / "ops"
    with pytest.raises(ConfigError) as err:
        init.scaffold(target)
    assert "cannot write: No space left on device" in str(err.value)
    assert not target.exists()  # the folder it made, too


def test_ansible_cfg_pointing_outside_the_folder_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "ansible.cfg").write_text("[defaults]\ninventory = ../other/hosts\n")
    with pytest.raises(ConfigError) as err:
        init.scaffold(repo)
    assert "its inventory ../other/hosts is outside" in str(err.value)
    assert sorted(p.name for p in repo.iterdir()) == ["ansible.cfg"]


def test_init_here_adds_the_dot_only_where_no_dir_is_given() -> None:
    from vigil.cli import init_here

    assert init_here(["vigil", "init"]) == ["vigil", "init", "."]
    assert init_here(["vigil", "init", "--ci", "gitlab"]) == [
        "vigil", "init", ".", "--ci", "gitlab"]
    assert init_here(["vigil", "init", "ops", "--ci", "gitlab"]) == [
        "vigil", "init", "ops", "--ci", "gitlab"]
    assert init_here(["vigil", "init", "--ci=gitlab", "ops"]) == [
        "vigil", "init", "--ci=gitlab", "ops"]
    assert init_here(["vigil", "render", "--hosts", "init"]) == [
        "vigil", "render", "--hosts", "init"]
