"""Local inputs that are no regular file (issue 33, minor): a FIFO or /dev/zero as a
host_vars file, known_hosts or ssh config hung vigil or took all its memory."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tests.doubles import linked_inventory
from vigil.desired import inventory
from vigil.desired.inputs import read_input, read_optional
from vigil.errors import ConfigError


def _hosts_with(tmp_path: Path) -> Path:
    inv = linked_inventory(tmp_path, "hosts:\n  gpu-01: {address: 10.0.0.1, model: tiny-cpu}\n")
    (inv / "host_vars").mkdir()
    return inv


def test_a_fifo_as_host_vars_is_one_clear_error_not_a_hang(tmp_path: Path) -> None:
    inv = _hosts_with(tmp_path)
    os.mkfifo(inv / "host_vars" / "gpu-01.yml")
    done: list[BaseException] = []

    def load() -> None:
        try:
            inventory.load(inv)
        except BaseException as exc:  # the test reads what came out
            done.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "the inventory load waited on the FIFO"
    assert isinstance(done[0], ConfigError) and "a FIFO, not a regular file" in str(done[0])
    assert "host_vars/gpu-01.yml" in str(done[0])


def test_dev_zero_linked_as_host_vars_is_refused_before_a_byte_is_read(tmp_path: Path) -> None:
    inv = _hosts_with(tmp_path)
    (inv / "host_vars" / "gpu-01.yml").symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="a character device, not a regular file"):
        inventory.load(inv)


def test_an_input_past_the_cap_and_one_not_utf8_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yml"
    big.write_bytes(b"a: 1\n" * 100)
    with pytest.raises(ConfigError, match="more than 64 bytes"):
        read_input(big, cap=64)
    latin = tmp_path / "latin.yml"
    latin.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        read_input(latin)


def test_files_read_as_ssh_reads_them_skip_what_is_no_file(tmp_path: Path) -> None:
    """/dev/null (UserKnownHostsFile /dev/null, a common idiom) reads empty; a FIFO or
    /dev/zero is skipped, never waited on."""
    os.mkfifo(tmp_path / "kh")
    assert read_optional(tmp_path / "kh") is None
    assert read_optional(Path("/dev/zero")) is None
    assert read_optional(Path("/dev/null")) is None  # not a regular file: nothing in it
    (tmp_path / "real").write_text("h1 ssh-ed25519 AAAA\n")
    assert read_optional(tmp_path / "real") == "h1 ssh-ed25519 AAAA\n"


def test_a_stack_lock_that_is_no_file_is_refused_never_installed_unlocked(
        tmp_path: Path) -> None:
    """Issue 33 (minor): a lock that is a directory, a FIFO or /dev/zero was ignored
    silently: the stack then installed unlocked."""
    inv = tmp_path / "inventory"
    (inv / "stacks").mkdir(parents=True)
    (inv / "models").symlink_to(Path(__file__).resolve().parents[2] / "inventory" / "models")
    (inv / "hosts.yml").write_text("hosts:\n  gpu-01: {address: 10.0.0.1, model: tiny-cpu}\n")
    stack = Path(__file__).resolve().parents[2] / "inventory" / "stacks" / "lab-cpu.yml"
    (inv / "stacks" / "lab-cpu.yml").write_text(stack.read_text())
    (inv / "stacks" / "lab-cpu.lock").symlink_to("/dev/zero")
    loaded = inventory.load(inv)
    with pytest.raises(ConfigError, match="the stack's lock is not a regular file") as err:
        loaded.stack("lab-cpu")
    assert err.value.file is not None and err.value.file.endswith("stacks/lab-cpu.lock")
    assert loaded.stack("lab-cpu", with_lock=False).lock is None  # stack.lock may redo it
