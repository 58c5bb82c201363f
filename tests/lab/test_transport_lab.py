"""The SSH transport against a real lab host."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from lab import hosts as lab
from vigil.desired.config import HostVars
from vigil.errors import LockTimeoutError, UnreachableError
from vigil.transport.lock import host_lock
from vigil.transport.ssh import connect

HOST = "lab2"
INDEX = 2
pytestmark = pytest.mark.drives(1, 2)


def lab_vars(**changes: object) -> HostVars:
    base: dict[str, object] = {
        "address": "127.0.0.1", "ssh_port": lab.host_port(INDEX), "ssh_user": "root",
        "ssh_key": str(lab.key_path()), "known_hosts": str(lab.known_hosts_path()),
        "connect_timeout_s": 5,
    }
    return HostVars.model_validate({**base, **changes})


@pytest.mark.lab
def test_known_host_key_connects(lab_hosts: list[lab.HostStatus]) -> None:
    t = connect(HOST, lab_vars())
    try:
        assert t.run("hostname").stdout.strip() == HOST
        assert t.run("exit 7").exit_status == 7
        assert t.run("cat", stdin="through stdin").stdout == "through stdin"
        assert t.round_trips == 3
    finally:
        t.close()


@pytest.mark.lab
def test_unknown_host_key_is_refused_with_the_fix(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/known_hosts to fall back on
    t = connect(HOST, lab_vars(known_hosts=str(empty)))
    with pytest.raises(UnreachableError) as err:
        t.run("true")
    assert f"host key of root@127.0.0.1:{lab.host_port(INDEX)} (" in str(err.value)
    assert "is unknown" in str(err.value)
    assert "ssh-keyscan" in str(err.value)


@pytest.mark.lab
def test_changed_host_key_is_refused(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A known_hosts entry with someone else's key for this address: a man in the middle.
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                   check=True)
    pub = (tmp_path / "other.pub").read_text().split()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{lab.host_port(INDEX)} {pub[0]} {pub[1]}\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    t = connect(HOST, lab_vars(known_hosts=str(wrong)))
    with pytest.raises(UnreachableError, match="does NOT match known_hosts"):
        t.run("true")


@pytest.mark.lab
def test_no_opt_out_of_host_key_checks(lab_hosts: list[lab.HostStatus]) -> None:
    # host_key_check: false accepted any key; it is refused now (tests/lab/test_attacks_lab.py
    # covers pins and accept-new, the explicit choices that replace it).
    with pytest.raises(ValueError, match="host_key_check was removed"):
        lab_vars(known_hosts=None, host_key_check=False)


@pytest.mark.lab
def test_wrong_key_is_an_authentication_error(
    lab_hosts: list[lab.HostStatus], tmp_path: Path
) -> None:
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    t = connect(HOST, lab_vars(ssh_key=str(key), ssh_user="nobody"))
    with pytest.raises(UnreachableError, match="authentication failed for nobody@"):
        t.run("true")


@pytest.mark.lab
def test_lock_is_exclusive_and_released_with_the_connection(
    lab_hosts: list[lab.HostStatus],
) -> None:
    hv = lab_vars()
    path = "/var/lib/vigil/test-transport.lock"
    first = connect(HOST, hv)
    second = connect(HOST, hv)
    waits: list[str] = []
    try:
        with host_lock(first, hv, path, "first-owner", 5, waits.append):
            with (pytest.raises(LockTimeoutError, match="still held after 1 s"),
                  host_lock(second, hv, path, "second", 1, waits.append)):
                pass
            assert waits == ["waiting up to 1 s for the deploy lock held by first-owner"]
        # released at the end of the block: the second one gets it at once
        started = time.monotonic()
        with host_lock(second, hv, path, "second", 5, waits.append):
            assert time.monotonic() - started < 3
    finally:
        first.close()
        second.close()


@pytest.mark.lab
def test_lock_of_a_dead_deploy_does_not_linger(lab_hosts: list[lab.HostStatus]) -> None:
    hv = lab_vars()
    path = "/var/lib/vigil/test-transport-dead.lock"
    dying = connect(HOST, hv)
    entered = threading.Event()

    def hold_and_die() -> None:
        with host_lock(dying, hv, path, "dying", 5, print):
            entered.set()
            time.sleep(60)

    threading.Thread(target=hold_and_die, daemon=True).start()
    assert entered.wait(10)
    dying.close()  # the connection drops as if the deploy was killed
    other = connect(HOST, hv)
    try:
        with host_lock(other, hv, path, "next", 10, print):
            pass
    finally:
        other.close()


@pytest.mark.lab
def test_a_proxyjump_hop_from_ssh_config_is_host_key_checked_like_the_host(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """~/.ssh/config sends the connection to lab2 through lab1 (ProxyJump, by the name
    `localhost`, whose key no known_hosts file has): refused naming the hop, before the
    host itself is reached; once the hop's key is known, the command runs on lab2 through
    it. (Fabric's own gateway connection would accept any hop key.)"""
    hop_port = lab.host_port(1)
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    (ssh / "config").write_text(
        f"Host 127.0.0.1\n  ProxyJump root@localhost:{hop_port}\n"
        f"Host localhost\n  IdentityFile {lab.key_path()}\n  IdentitiesOnly yes\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    known = tmp_path / "known_hosts"
    known.write_text(lab.known_hosts_path().read_text())  # lab1 as 127.0.0.1, not localhost
    t = connect(HOST, lab_vars(known_hosts=str(known)))
    try:
        with pytest.raises(UnreachableError) as err:
            t.run("true")
    finally:
        t.close()
    message = str(err.value)
    hop = f"root@localhost:{hop_port} ([localhost]:{hop_port})"
    assert f"host key of ProxyJump hop {hop}" in message
    assert "is unknown" in message and "ssh-keyscan" in message, message
    # the hop's key under the name the hop is reached by (lab hosts share one key)
    line = next(ln for ln in known.read_text().splitlines()
                if ln.startswith(f"[127.0.0.1]:{hop_port} "))
    known.write_text(known.read_text() + line.replace("[127.0.0.1]", "[localhost]", 1) + "\n")
    t = connect(HOST, lab_vars(known_hosts=str(known)))
    try:
        assert t.run("hostname").stdout.strip() == HOST
    finally:
        t.close()


@pytest.mark.lab
def test_a_host_reached_by_its_ssh_config_alias_alone(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inventory names only an alias; ~/.ssh/config gives HostName, Port, User and
    IdentityFile, and the host key is checked under the real name and port."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(
        f"Host lab-by-alias\n  HostName 127.0.0.1\n  Port {lab.host_port(INDEX)}\n"
        f"  User root\n  IdentityFile {lab.key_path()}\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    hv = HostVars.model_validate({"address": "lab-by-alias",
                                  "known_hosts": str(lab.known_hosts_path())})
    t = connect(HOST, hv)
    try:
        assert t.run("hostname").stdout.strip() == HOST
    finally:
        t.close()
