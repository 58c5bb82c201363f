"""The user's ssh config read whole, as OpenSSH resolves it (issue 29.7): ``Include`` is
followed, its User/Port apply where the inventory sets nothing, render shows them "from
ssh config", and each option vigil does not follow is one warning per run.

Before: paramiko's parser (through Fabric) followed no Include, so a `Host gpu-*` block
in an included file was never read (render: ``ssh_user = "root" (vigil default)`` for a
host that connects as ops@…:40022), and StrictHostKeyChecking, ConnectTimeout and
ForwardAgent were dropped without a word. HOME points at a temp dir, as in the other
tests; vigil reads $HOME/.ssh/config even where ssh's own home differs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO
from vigil.desired import inventory, sshconfig
from vigil.errors import ConfigError

needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client")


def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh" / "conf.d").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Include {home}/.ssh/conf.d/*.conf\n"
        "Host gpu-02\n  HostName 10.9.8.7\n  ConnectTimeout 7\n"
        "  StrictHostKeyChecking no\n  ForwardAgent yes\n")
    (home / ".ssh" / "conf.d" / "fleet.conf").write_text(
        "Host gpu-*\n  User ops\n  Port 40022\n  IdentityFile ~/.ssh/deploy\n")
    monkeypatch.setenv("HOME", str(home))
    return home


def _ansible(tmp_path: Path, hosts: str) -> Path:
    root = tmp_path / "ansible"
    root.mkdir()
    for part in ("models", "stacks"):
        shutil.copytree(REPO / "inventory" / part, root / part)
    (root / "hosts.ini").write_text(hosts)
    (root / "group_vars").mkdir()
    (root / "group_vars" / "all.yml").write_text(
        "gpu: {kind: H100, count: 8, memory_gib: 80}\nstack: vllm-0.16-nightly\n"
        "model: tiny-cpu\n")
    return root


@needs_ssh
def test_an_included_host_block_decides_user_port_and_timeout_where_the_inventory_is_silent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _home(tmp_path, monkeypatch)
    inv = inventory.load(_ansible(tmp_path, "[gpu]\ngpu-[01:02]\n"
                                  "[pinned]\ngpu-03 ansible_user=root ansible_port=22\n"))
    said: list[str] = []
    inv.notes.sink = said.append
    two = inv.resolve("gpu-02")
    assert (two.vars.ssh_user, two.vars.ssh_port, two.vars.connect_timeout_s) == (
        "ops", 40022, 7.0)
    for key in ("ssh_user", "ssh_port", "connect_timeout_s"):
        assert two.origin[key] == "from ssh config (ssh -G gpu-02)"
    one = inv.resolve("gpu-01")  # only the included block applies to it
    assert (one.vars.ssh_user, one.vars.ssh_port, one.vars.connect_timeout_s) == (
        "ops", 40022, 10.0)
    three = inv.resolve("gpu-03")  # the inventory's own values win
    assert (three.vars.ssh_user, three.vars.ssh_port) == ("root", 22)
    inv.resolve("gpu-02")
    # each option vigil does not follow: one warning per run, never one per host
    assert len(said) == 2, said
    assert said[0].startswith("ssh config sets stricthostkeychecking false for gpu-02 "
                              "(host gpu-02, ssh config (ssh -G gpu-02)): not followed; "
                              "vigil checks host keys by the inventory's host_key"), said
    assert said[1].startswith("ssh config sets forwardagent yes for gpu-02"), said

    from vigil.transport.ssh import SSHTransport

    t = SSHTransport("gpu-02", inv.host_vars("gpu-02"))
    assert (t.conn.host, t.login_user, t.login_port, t.timeout) == (
        "10.9.8.7", "ops", 40022, 7.0)
    assert str(home / ".ssh" / "deploy") in t.conn.connect_kwargs["key_filename"]
    assert t.conn.forward_agent is False
    # a HostVars built with no inventory gets the same from the transport itself
    from vigil.desired.config import HostVars

    bare = SSHTransport("x", HostVars.model_validate({"address": "gpu-02"}))
    assert (bare.conn.host, bare.login_user, bare.login_port, bare.timeout) == (
        "10.9.8.7", "ops", 40022, 7.0)


@needs_ssh
def test_render_shows_what_ssh_config_sets_and_warns_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _home(tmp_path, monkeypatch)
    root = _ansible(tmp_path, "[gpu]\ngpu-[01:02]\n")
    proc = subprocess.run([sys.executable, "-m", "vigil", "render", "-i", str(root),
                           "--hosts", "gpu", "--out", str(tmp_path / "out")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("ssh_user") and '= "ops"' in ln and
               ln.endswith("(from ssh config (ssh -G gpu-02))") for ln in lines), proc.stdout
    assert any(ln.startswith("ssh_port") and "= 40022" in ln for ln in lines)
    assert '  hostname = "10.9.8.7"  (from ssh config (ssh -G gpu-02))' in lines
    assert '  identityfile = "~/.ssh/deploy"  (from ssh config (ssh -G gpu-01))' in lines
    assert proc.stderr.count("stricthostkeychecking") == 1, proc.stderr
    assert proc.stderr.count("forwardagent") == 1, proc.stderr


@needs_ssh
def test_a_bad_ssh_config_line_is_one_error_naming_the_file_and_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _home(tmp_path, monkeypatch)
    (home / ".ssh" / "conf.d" / "fleet.conf").write_text("Host gpu-*\n  Userr ops\n")
    inv = inventory.load(_ansible(tmp_path, "[gpu]\ngpu-01\n"))
    with pytest.raises(ConfigError) as err:
        inv.resolve("gpu-01")
    text = str(err.value)
    assert "ssh -G gpu-01 refuses the ssh config: line 2: Bad configuration option: userr" \
        in text, text
    assert str(home / ".ssh" / "conf.d" / "fleet.conf") in text and "fix:" in text


def test_without_ssh_paramiko_reads_the_file_and_says_what_it_cannot_follow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _home(tmp_path, monkeypatch)
    (home / ".ssh" / "config").write_text(
        (home / ".ssh" / "config").read_text() + "Host gpu-01\n  User deploy\n  Port 2200\n")
    monkeypatch.setattr(sshconfig.shutil, "which", lambda name: None)
    inv = inventory.load(_ansible(tmp_path, "[gpu]\ngpu-01\n"))
    said: list[str] = []
    inv.notes.sink = said.append
    one = inv.resolve("gpu-01")
    assert (one.vars.ssh_user, one.vars.ssh_port) == ("deploy", 2200)
    assert one.origin["ssh_user"] == \
        f"from ssh config ({home / '.ssh' / 'config'}, read by paramiko)"
    assert said[0] == f"{home / '.ssh' / 'config'}: line 1: Include is not followed (no " \
        "ssh client on this machine: paramiko reads the file)"
    assert all(s.endswith("is not followed (no ssh client on this machine: paramiko reads "
                          "the file)") for s in said)  # the system file's Include too


def test_proxyjump_hops_are_read_in_any_form_ssh_prints() -> None:
    assert sshconfig.hops("root@[127.0.0.1]:2222,ops@bastion,ssh://j:22,[::1]:23") == [
        ("root", "127.0.0.1", "2222"), ("ops", "bastion", ""), ("", "j", "22"),
        ("", "::1", "23")]
    assert sshconfig.hops("none") == [] and sshconfig.hops(None) == []
