"""Report files (--json, --junit, --html) written as root (issue 33.4): a device, a FIFO
or /dev/stdout is written through and stays what it was; only a regular file is replaced,
through a temp file of a random name that no planted link can redirect."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vigil.errors import ConfigError
from vigil.report import write_json, write_text


def test_dev_null_stays_a_device() -> None:
    write_json("/dev/null", {"hosts": {}})
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_dev_full_is_one_clear_error_and_stays_a_device() -> None:
    with pytest.raises(ConfigError, match="cannot write: No space left on device") as err:
        write_json("/dev/full", {"hosts": {}})
    assert err.value.file == "/dev/full"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_fifo_gets_the_report_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "report.pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_text(str(fifo), "<testsuites/>\n")
    reader.join(10)
    assert got == [b"<testsuites/>\n"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_dev_stdout_redirected_to_a_log_appends_to_it_and_never_replaces_it(
        tmp_path: Path) -> None:
    log = tmp_path / "ci.log"
    log.write_text("earlier output\n")
    with log.open("a") as out:
        subprocess.run([sys.executable, "-c", "from vigil.report import write_json; "
                        "write_json('/dev/stdout', {'ok': True})"], stdout=out, check=True)
    assert log.read_text() == 'earlier output\n{\n  "ok": true\n}\n'
    assert os.path.islink("/dev/stdout")


def test_a_link_planted_at_the_old_temp_name_is_never_written_through(
        tmp_path: Path) -> None:
    victim = tmp_path / "shadow"
    victim.write_text("root:x")
    (tmp_path / ".report.json.tmp").symlink_to(victim)
    write_json(str(tmp_path / "report.json"), {"ok": True})
    assert victim.read_text() == "root:x"
    assert (tmp_path / "report.json").read_text() == '{\n  "ok": true\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == [".report.json.tmp", "report.json",
                                                          "shadow"]


def test_a_regular_file_is_replaced_whole_keeping_its_mode_and_a_directory_is_refused(
        tmp_path: Path) -> None:
    kept = tmp_path / "r.json"
    kept.write_text("old")
    kept.chmod(0o600)
    write_json(str(kept), [1])
    assert kept.read_text() == "[\n  1\n]\n" and stat.S_IMODE(kept.stat().st_mode) == 0o600
    with pytest.raises(ConfigError, match="not a regular file"):
        write_json(str(tmp_path), [1])


def test_a_trace_is_never_written_through_a_link_planted_at_its_name(tmp_path: Path) -> None:
    """Issue 33 (minor): a trace's name is predictable (host and second) in a state
    directory others may share; a link planted there sent the trace anywhere."""
    from vigil.verify.replay import write_trace

    victim = tmp_path / "authorized_keys"
    victim.write_text("ssh-ed25519 AAAA ops\n")
    planted = tmp_path / "traces" / "gpu-01-20261204T120000Z.jsonl"
    planted.parent.mkdir()
    planted.symlink_to(victim)
    with pytest.raises(ConfigError, match="is a symbolic link") as err:
        write_trace(planted, [])
    assert err.value.file == str(planted)
    assert victim.read_text() == "ssh-ed25519 AAAA ops\n"
