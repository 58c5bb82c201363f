"""The lab links identical environment files across hosts (lab/dedupe.py): one inode for
the same bytes, never for different bytes, modes or small files; a host's later
replacement of its copy leaves the others' alone."""

from __future__ import annotations

import os
from pathlib import Path

from lab import dedupe

BIG = dedupe.MIN_SIZE


def _file(path: Path, data: bytes, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    return path


def _lab(tmp_path: Path) -> Path:
    for h in ("lab1", "lab2", "lab3"):
        env = tmp_path / "hosts" / h / "opt-vigil" / "envs" / "e" / "lib"
        _file(env / "libtorch.so", b"t" * BIG * 2)
        _file(env / "small.py", b"s" * 100)
    _file(tmp_path / "hosts/lab3/opt-vigil/envs/e/lib/other.so", b"o" * BIG * 2)
    _file(tmp_path / "hosts/lab2/opt-vigil/envs/e/lib/exec.so", b"x" * BIG, 0o755)
    _file(tmp_path / "hosts/lab3/opt-vigil/envs/e/lib/exec.so", b"x" * BIG, 0o644)
    return tmp_path


def test_identical_big_files_share_one_inode_and_the_rest_stay_apart(tmp_path: Path) -> None:
    lab = _lab(tmp_path)
    roots = dedupe.env_roots(lab)
    assert len(roots) == 3
    freed = dedupe.link_identical(roots, lab / dedupe.INDEX)
    assert freed == 2 * BIG * 2
    lib = [lab / f"hosts/{h}/opt-vigil/envs/e/lib" for h in ("lab1", "lab2", "lab3")]
    assert len({os.stat(d / "libtorch.so").st_ino for d in lib}) == 1
    assert len({os.stat(d / "small.py").st_ino for d in lib}) == 3
    assert os.stat(lib[2] / "other.so").st_nlink == 1
    assert os.stat(lib[1] / "exec.so").st_ino != os.stat(lib[2] / "exec.so").st_ino
    assert not list(lab.glob("hosts/*/opt-vigil/envs/e/lib/*.lab-link"))
    # a second pass reads nothing new and frees nothing
    assert dedupe.link_identical(roots, lab / dedupe.INDEX) == 0


def test_a_host_replacing_its_copy_leaves_the_other_hosts_alone(tmp_path: Path) -> None:
    lab = _lab(tmp_path)
    dedupe.link_identical(dedupe.env_roots(lab), lab / dedupe.INDEX)
    mine = lab / "hosts/lab1/opt-vigil/envs/e/lib/libtorch.so"
    # what pip and uv do: a new file in place of the old name
    new = mine.with_suffix(".new")
    new.write_bytes(b"n" * BIG)
    os.replace(new, mine)
    assert (lab / "hosts/lab2/opt-vigil/envs/e/lib/libtorch.so").read_bytes() == b"t" * BIG * 2


def test_install_logs_are_never_linked(tmp_path: Path) -> None:
    # the installer appends to its log in place: one inode would give every host the
    # last writer's log (a CI run read lab3's "with uv" in lab4's pip install log)
    logs = [_file(tmp_path / f"hosts/{h}/opt-vigil/envs/e.install.log", b"l" * BIG * 2)
            for h in ("lab1", "lab2")]
    assert dedupe.link_identical(dedupe.env_roots(tmp_path), tmp_path / dedupe.INDEX) == 0
    assert os.stat(logs[0]).st_ino != os.stat(logs[1]).st_ino


def test_no_lab_yet_is_nothing_to_do(tmp_path: Path) -> None:
    assert dedupe.env_roots(tmp_path) == []
    assert dedupe.link_identical([], tmp_path / dedupe.INDEX) == 0
