"""The attack list of issue 8, one test per attack, so the next review can re-run it.

Each test is named for the attack it replays (``test_a<N>_...`` for item N of the
issue). Attacks that need a real sshd run against a lab host and are marked ``lab``.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from lab import hosts as lab
from vigil.desired.config import HostVars
from vigil.errors import ConfigError, UnreachableError
from vigil.transport.ssh import SSHTransport, known_hosts_files

HOST = "lab2"
INDEX = 2


def lab_vars(**changes: object) -> HostVars:
    base: dict[str, object] = {
        "address": "127.0.0.1", "ssh_port": lab.host_port(INDEX), "ssh_user": "root",
        "ssh_key": str(lab.key_path()), "connect_timeout_s": 5,
    }
    return HostVars.model_validate({**base, **changes})


def lab_key_lines() -> str:
    return lab.known_hosts_path().read_text()


def fake_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    return home


def other_key(tmp_path: Path) -> tuple[str, str]:
    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                   check=True)
    keytype, data = (tmp_path / "other.pub").read_text().split()[:2]
    return keytype, data


def connects(hv: HostVars) -> str:
    t = SSHTransport(HOST, hv)
    try:
        return t.run("hostname").stdout.strip()
    finally:
        t.close()


# -- 1. the user's known_hosts files are read, the way ssh reads them --------------------


def test_a1_known_hosts_files_are_the_ones_ssh_reads(tmp_path: Path) -> None:
    home = tmp_path
    assert known_hosts_files({}, home) == [
        home / ".ssh/known_hosts", home / ".ssh/known_hosts2",
        Path("/etc/ssh/ssh_known_hosts"), Path("/etc/ssh/ssh_known_hosts2"),
    ]
    cfg = {"userknownhostsfile": "~/kh '/srv/with space/kh' %d/third",
           "globalknownhostsfile": "none"}
    assert known_hosts_files(cfg, home) == [
        home / "kh", Path("/srv/with space/kh"), home / "third"]


@pytest.mark.lab
def test_a1_users_known_hosts_is_trusted(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = fake_home(tmp_path, monkeypatch)
    (home / ".ssh" / "known_hosts").write_text(lab_key_lines())
    assert connects(lab_vars()) == HOST


@pytest.mark.lab
def test_a1_user_known_hosts_file_of_the_ssh_config_is_trusted(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = fake_home(tmp_path, monkeypatch)
    elsewhere = tmp_path / "fleet_known_hosts"
    elsewhere.write_text(lab_key_lines())
    (home / ".ssh" / "config").write_text(f"Host *\n  UserKnownHostsFile {elsewhere}\n")
    assert connects(lab_vars()) == HOST


@pytest.mark.lab
def test_a1_global_known_hosts_is_trusted(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = fake_home(tmp_path, monkeypatch)
    system = tmp_path / "ssh_known_hosts"
    system.write_text(lab_key_lines())
    (home / ".ssh" / "config").write_text(f"GlobalKnownHostsFile {system}\n")
    assert connects(lab_vars()) == HOST


@pytest.mark.lab
def test_a1_unknown_key_names_the_files_searched_and_the_key(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = fake_home(tmp_path, monkeypatch)
    (home / ".ssh" / "known_hosts").write_text("")
    with pytest.raises(UnreachableError) as err:
        connects(lab_vars())
    text = str(err.value)
    assert f"host key of root@127.0.0.1:{lab.host_port(INDEX)} (" in text
    assert "is unknown: in none of" in text and str(home / ".ssh" / "known_hosts") in text
    assert "host_key_fingerprints: [SHA256:" in text and "host_key: accept-new" in text


@pytest.mark.lab
def test_a1_revoked_key_is_refused(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = fake_home(tmp_path, monkeypatch)
    lines = lab_key_lines()
    revoked = "".join(f"@revoked {line}\n" for line in lines.splitlines())
    (home / ".ssh" / "known_hosts").write_text(lines + revoked)
    with pytest.raises(UnreachableError, match="is marked @revoked"):
        connects(lab_vars())


# -- 2. no silent opt-out: pinned fingerprints or an explicit, loud accept-new ---------------


def test_a2_host_key_check_false_is_refused_with_the_choices(tmp_path: Path) -> None:
    from tests.conftest import target_in

    with pytest.raises(ConfigError) as err:
        target_in(tmp_path, "hosts:\n  h1: {model: tiny-cpu, stack: lab-cpu, "
                  "host_key_check: false}\n", "h1")
    text = str(err.value)
    assert "host_key_check was removed" in text
    assert "host_key_fingerprints" in text and "accept-new" in text
    assert "got False" not in text


def test_a2_a_fingerprint_must_look_like_one() -> None:
    with pytest.raises(ValueError, match="not a SHA256 fingerprint"):
        HostVars(host_key_fingerprints=["MD5:aa:bb"])


def _lab_fingerprint(keytype: str) -> str:
    for line in lab_key_lines().splitlines():
        if f":{lab.host_port(INDEX)} {keytype} " in line:
            out = subprocess.run(["ssh-keygen", "-lf", "-"], input=line, text=True,
                                 capture_output=True, check=True).stdout
            return out.split()[1]
    raise AssertionError(f"no {keytype} key for the lab")


@pytest.mark.lab
def test_a2_pinned_fingerprint_connects_and_a_wrong_pin_is_refused(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_home(tmp_path, monkeypatch)
    pins = [_lab_fingerprint(t) for t in ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa")]
    assert connects(lab_vars(host_key_fingerprints=pins)) == HOST
    wrong = "SHA256:" + "A" * 43
    with pytest.raises(UnreachableError, match="is not one of host_key_fingerprints"):
        connects(lab_vars(host_key_fingerprints=[wrong]))


@pytest.mark.lab
def test_a2_pins_win_over_a_known_hosts_entry(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The key is in known_hosts, but the pins say another key: refused.
    home = fake_home(tmp_path, monkeypatch)
    (home / ".ssh" / "known_hosts").write_text(lab_key_lines())
    with pytest.raises(UnreachableError, match="is not one of host_key_fingerprints"):
        connects(lab_vars(host_key_fingerprints=["SHA256:" + "B" * 43]))


@pytest.mark.lab
def test_a2_accept_new_trusts_once_loudly_then_refuses_a_change(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake_home(tmp_path, monkeypatch)
    inv_known = tmp_path / "inventory" / "known_hosts"
    hv = lab_vars(host_key="accept-new", known_hosts=str(inv_known))
    assert connects(hv) == HOST
    written = inv_known.read_text()
    assert written.startswith(f"[127.0.0.1]:{lab.host_port(INDEX)} ")
    warning = capsys.readouterr().err
    assert "trusted on first use" in warning and str(inv_known) in warning
    assert "SHA256:" in warning
    # a second connection finds it known: nothing more written, nothing said
    assert connects(hv) == HOST
    assert inv_known.read_text() == written
    assert capsys.readouterr().err == ""
    # the host now shows another key (an impostor): refused, not re-trusted
    keytype, other = other_key(tmp_path)
    inv_known.write_text(f"[127.0.0.1]:{lab.host_port(INDEX)} {keytype} {other}\n")
    with pytest.raises(UnreachableError, match="does NOT match known_hosts"):
        connects(hv)


def test_a2_accept_new_defaults_to_the_inventorys_known_hosts(tmp_path: Path) -> None:
    from vigil.desired import inventory

    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text("hosts:\n  h1: {host_key: accept-new}\n")
    assert inventory.load(inv).host_vars("h1").known_hosts == str(inv / "known_hosts")


# -- 3. connect timeouts below a second are kept, not truncated to "none" --------------------


def test_a3_sub_second_connect_timeout_is_kept() -> None:
    t = SSHTransport("h", HostVars(address="127.0.0.1", ssh_port=9, connect_timeout_s=0.5))
    assert t.conn.connect_timeout == 0.5
    with pytest.raises(ValueError):
        HostVars(connect_timeout_s=0)


def test_a3_sub_second_banner_timeout_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_home(tmp_path, monkeypatch)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        hv = HostVars(address="127.0.0.1", ssh_port=listener.getsockname()[1],
                      connect_timeout_s=0.5)
        t = SSHTransport("h", hv)
        with pytest.raises(UnreachableError, match=r"timed out after 0\.5 s"):
            t.run("true")
    finally:
        listener.close()
