"""The `vigil` command's manners: --help anywhere, usage errors exit 2 with the closest
task, -h never taken by a task flag, short flags as Ansible means them, only the core
options vigil honours, -i/--inventory on every task that reads one, and
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
            # the same short flag wherever --hosts is, and Ansible's --limit beside it
            assert {"l", "limit"} <= flags, name


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


# -- issue 29.3 and 29.4: only options vigil honours; short flags as Ansible means them --

ANSIBLE_SHORTS = {"f": "forks", "l": "hosts", "C": "check", "e": "set", "i": "inventory"}
ANSIBLE_ELSE = set("uDvKkbctTMJ")  # Ansible's, for options vigil has no flag for


def test_core_help_shows_only_options_vigil_honours(tmp_path: Path) -> None:
    text = vigil("--help", cwd=tmp_path).stdout
    core = text.split("Subcommands:")[0]
    for gone in ("--dry", "--warn-only", "--echo", "--pty", "--hide", "--command-timeout",
                 "--write-pyc", "--prompt-for-sudo-password", "-f STRING", "-l [STRING]",
                 "-D INT", "-d,", "-e,", "-p,", "-w,", "-T INT", "-R,"):
        assert gone not in core, gone
    assert "--list" in core and "-V, --version" in core and "-h [STRING]" in core


@pytest.mark.parametrize("args", [["--dry", "deploy"], ["deploy", "--dry"], ["-R", "deploy"]])
def test_dry_is_refused_with_the_way_to_a_plan(tmp_path: Path, args: list[str]) -> None:
    proc = vigil(*args, "--hosts", "all", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "deploy --check" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args", [["-w", "status"], ["status", "-e"], ["status", "-p"],
                                  ["status", "--hide", "x"], ["status", "-T", "3"],
                                  ["--write-pyc", "status"],
                                  ["--prompt-for-sudo-password", "status"]])
def test_invokes_inert_options_are_refused_not_ignored(tmp_path: Path, args: list[str]) -> None:
    proc = vigil(*args, cwd=tmp_path)
    assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
    assert "No idea what" in proc.stderr and "Traceback" not in proc.stderr


def test_short_flags_mean_what_they_mean_to_ansible_and_one_option_each() -> None:
    letter_of: dict[str, str] = {}
    for name in ns.task_names:
        for arg in ns[name].get_arguments():
            long = next(n for n in arg.names if len(n) > 1 and n != "limit")
            for short in (n for n in arg.names if len(n) == 1):
                assert letter_of.setdefault(short, long) == long, (name, short, long)
                assert short not in ANSIBLE_ELSE, (name, short, long)
    for short, long in ANSIBLE_SHORTS.items():
        assert letter_of.get(short) == long, (short, letter_of.get(short))


def test_ansibles_short_flags_parse_as_ansible_means_them() -> None:
    from invoke.parser import Parser

    parsed = Parser(contexts=ns.to_contexts()).parse_argv(
        ["deploy", "-l", "gpu-01", "-f", "10", "-C", "-e", "port=9000", "-i", "inv"])
    args = parsed[0].args
    assert (args.hosts.value, args.forks.value, args.check.value, args.set_.value,
            args.inventory.value) == ("gpu-01", 10, True, ["port=9000"], "inv")
    assert args.after_ready.value is None and args.html.value is None and \
        args.junit.value is None
    limit = Parser(contexts=ns.to_contexts()).parse_argv(["status", "--limit", "g:!h"])
    assert limit[0].args.hosts.value == "g:!h"


def test_an_unknown_flag_gets_the_closest_of_the_tasks_flags(tmp_path: Path) -> None:
    proc = vigil("deploy", "--hots", "a", cwd=tmp_path)
    assert proc.returncode == 2
    assert "No idea what '--hots' is! Did you mean '--hosts'? (`vigil deploy --help` " \
        "lists its flags)" in proc.stderr, proc.stderr
    ansible = vigil("deploy", "-u", "ops", cwd=tmp_path)
    assert ansible.returncode == 2 and "ssh_user" in ansible.stderr, ansible.stderr
