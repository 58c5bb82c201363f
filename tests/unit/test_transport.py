"""Transport: host keys checked by default, clear errors, local connection, the lock."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doubles import fake_home
from vigil.desired.config import HostVars
from vigil.errors import ConfigError, HostError, UnreachableError
from vigil.transport.base import privileged
from vigil.transport.local import LocalTransport
from vigil.transport.remote import call
from vigil.transport.ssh import SSHTransport, connect


def test_local_transport_runs_the_agent_on_this_machine(tmp_path: Path) -> None:
    t = LocalTransport("here")
    hv = HostVars(connection="local")
    reply = call(t, hv, "facts", {
        "unit": "vigil-test-none", "port": 1, "service_user": "root", "model": str(tmp_path),
        "paths": {"unit": str(tmp_path / "u.service"), "env": str(tmp_path / "u.env"),
                  "env_dir": str(tmp_path / "envs" / "x"), "current": str(tmp_path / "cur"),
                  "backup_dir": str(tmp_path / "b")},
    })
    assert reply["files"] == {"unit": None, "env": None}
    assert reply["writable"]["unit"] is True
    assert (reply["model"]["exists"], reply["model"]["config"]) == (True, None)
    assert json.loads(json.dumps(reply))["service_user_exists"] is True
    assert t.round_trips == 1


def test_the_agent_command_line_stays_constant_however_large_the_agent_grows(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The agent travels on stdin behind a fixed bootstrap: an agent padded past Linux's
    128 KiB cap on one argument (MAX_ARG_STRLEN) leaves the command line as it was, and
    still answers through bash as SSH would run it."""
    from vigil.transport import remote

    before = {(v, p): remote.agent_command(v, p) for v in ("facts", "stream")
              for p in (None, "/opt/vigil/envs/current/bin/python")}
    padded = remote.agent_source() + "#" * 200_000 + "\n"
    monkeypatch.setattr(remote, "agent_source", lambda: padded)
    for (verb, python), command in before.items():
        assert remote.agent_command(verb, python) == command
        assert len(command) < 600, command
        sudo = privileged(command, HostVars(ssh_user="deploy", sudo=True))
        assert len(sudo) < 800 and "#" * 100 not in sudo
    assert padded.isascii()  # the length header counts characters as bytes
    hv = HostVars(connection="local")
    reply = call(LocalTransport("here"), hv, "facts", {
        "unit": "vigil-test-none", "port": 1, "service_user": "root", "model": str(tmp_path),
        "paths": {"unit": str(tmp_path / "u.service"), "env": str(tmp_path / "u.env"),
                  "env_dir": str(tmp_path / "envs" / "x"), "current": str(tmp_path / "cur"),
                  "backup_dir": str(tmp_path / "b")},
    })
    assert reply["files"] == {"unit": None, "env": None}


def test_an_agent_cut_short_on_stdin_is_one_clear_error() -> None:
    from vigil.transport import remote

    proc = subprocess.run(["bash", "-c", remote.agent_command("facts")],
                          input=remote.agent_stdin("{}")[:5000], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.strip() == \
        "vigil: the agent was cut short on stdin", proc.stderr


def test_ssh_config_decides_what_the_inventory_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As with ssh and Ansible: ~/.ssh/config's HostName, User and Port apply where the
    inventory sets nothing; the inventory's own ssh_user/ssh_port win; vigil's defaults
    (root, 22) only where neither says. sudo follows the user actually logged in as."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(
        "Host bw-01\n  HostName 10.9.9.9\n  User deploy\n  Port 2222\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    from vigil.transport.ssh import SSHTransport

    hv = HostVars.model_validate({"address": "bw-01", "sudo": True})
    by_config = SSHTransport("bw-01", hv)
    assert (by_config.login_user, by_config.login_port, by_config.conn.host) == (
        "deploy", 2222, "10.9.9.9")
    assert privileged("id", hv, by_config) == "sudo -n -- bash -c id"
    mine = SSHTransport("bw-01", HostVars.model_validate(
        {"address": "bw-01", "ssh_user": "root", "ssh_port": 22, "sudo": True}))
    assert (mine.login_user, mine.login_port) == ("root", 22)
    assert privileged("id", mine.host, mine) == "id"
    other = SSHTransport("x", HostVars.model_validate({"address": "x.example"}))
    assert (other.login_user, other.login_port) == ("root", 22)


def test_a_missing_ssh_key_is_bad_input_before_anything_is_contacted(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        connect("bw-01", HostVars.model_validate(
            {"address": "10.255.255.1", "ssh_key": str(tmp_path / "no-such-key")}))
    assert err.value.exit_code == 2
    assert f"host bw-01: ssh_key {tmp_path / 'no-such-key'} does not exist" in str(err.value)


def test_a_connection_closed_at_once_is_not_called_a_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sshd's MaxStartups, tcp wrappers or a ban close the connection at once: said so,
    with the time it took, not "timed out after 10 s"."""
    monkeypatch.setenv("HOME", str(tmp_path))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]

    def close_each() -> None:
        for _ in range(4):
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=close_each, daemon=True).start()
    known = tmp_path / "known_hosts"
    known.write_text("")
    t = connect("h1", HostVars.model_validate(
        {"address": "127.0.0.1", "ssh_port": port, "known_hosts": str(known),
         "connect_timeout_s": 10}))
    try:
        with pytest.raises(UnreachableError) as err:
            t.run("true")
    finally:
        t.close()
        listener.close()
    message = str(err.value)
    assert f"root@127.0.0.1:{port} closed the connection before its SSH banner" in message
    assert "timed out" not in message and "MaxStartups" in message


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("jump, why", [
    ("root@no-such-hop.invalid:22", "no-such-hop.invalid does not resolve"),
    ("root@127.0.0.1:{closed}", "Connection refused"),
])
def test_a_proxyjump_hop_that_fails_is_named_as_the_hop_not_the_target(
        jump: str, why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22.7: a hop that does not resolve was reported as the target's own failure
    ("cannot connect to root@10.0.0.5:22: Name or service not known")."""
    closed = _free_port()
    jump = jump.format(closed=closed)
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                   check=True)
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(f"Host 10.0.0.5\n  ProxyJump {jump}\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    known = tmp_path / "known_hosts"
    known.write_text("")
    t = connect("gpu1", HostVars.model_validate({
        "address": "10.0.0.5", "ssh_user": "root", "ssh_key": str(key),
        "known_hosts": str(known), "connect_timeout_s": 5}))
    try:
        with pytest.raises(UnreachableError) as err:
            t.run("true")
    finally:
        t.close()
    host, _, port = jump.partition("@")[2].partition(":")
    assert str(err.value).startswith(
        f"gpu1: ProxyJump hop root@{host}:{port} on the way to root@10.0.0.5:22: {why}"), \
        str(err.value)


# -- issue 33.9: bounded replies, a deadline that holds while bytes keep coming, EOF ------


class _ExecServer:
    """A real SSH server on 127.0.0.1 (paramiko's server side, one connection) whose
    commands are behaviours: ``flood`` sends without end, ``late`` sends its exit status
    before its output (as sshd may, under load), ``say N`` sends N bytes and ends."""

    def __init__(self) -> None:
        import paramiko

        self.key = paramiko.ECDSAKey.generate()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.sock.settimeout(10)
        self.port = self.sock.getsockname()[1]
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _behave(self, channel: object, command: str) -> None:
        import paramiko

        assert isinstance(channel, paramiko.Channel)
        try:
            if command == "flood":
                chunk = b"x" * 65536
                while not self.stop.is_set() and not channel.closed:
                    channel.sendall(chunk)
                    self.sent += len(chunk)
            elif command == "late":
                channel.send_exit_status(0)
                time.sleep(0.5)
                channel.sendall(b"y" * 300_000)
                channel.sendall_stderr(b"last words\n")
            elif command.startswith("say "):
                channel.sendall(b"z" * int(command.split()[1]))
                channel.send_exit_status(0)
            channel.shutdown_write()  # EOF
            time.sleep(0.1)
            channel.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def _serve(self) -> None:
        import paramiko

        behave = self._behave

        class Iface(paramiko.ServerInterface):
            def get_allowed_auths(self, username: str) -> str:
                return "publickey"

            def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
                return paramiko.AUTH_SUCCESSFUL

            def check_channel_request(self, kind: str, chanid: int) -> int:
                return paramiko.OPEN_SUCCEEDED

            def check_channel_exec_request(self, channel: paramiko.Channel,
                                           command: bytes) -> bool:
                threading.Thread(target=behave, args=(channel, command.decode()),
                                 daemon=True).start()
                return True

        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        transport = paramiko.Transport(conn)
        transport.add_server_key(self.key)
        try:
            transport.start_server(server=Iface())
            while not self.stop.wait(0.1) and transport.is_active():
                transport.accept(0.1)
        except (paramiko.SSHException, EOFError, OSError):
            pass
        finally:
            transport.close()

    def transport(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SSHTransport:
        import paramiko

        monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
        fake_home(tmp_path, monkeypatch)
        key = tmp_path / "client_key"
        paramiko.ECDSAKey.generate().write_private_key_file(str(key))
        known = tmp_path / "known_hosts"
        known.write_text(f"[127.0.0.1]:{self.port} {self.key.get_name()} "
                         f"{self.key.get_base64()}\n")
        return SSHTransport("h1", HostVars.model_validate({
            "address": "127.0.0.1", "ssh_port": self.port, "ssh_user": "root",
            "ssh_key": str(key), "known_hosts": str(known), "connect_timeout_s": 5}))

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        self.thread.join(10)


@pytest.fixture
def exec_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                ) -> Iterator[tuple[_ExecServer, SSHTransport]]:
    server = _ExecServer()
    t = server.transport(tmp_path, monkeypatch)
    try:
        yield server, t
    finally:
        t.close()
        server.close()


def test_an_endless_reply_is_cut_at_its_cap_as_one_error(
        exec_server: tuple[_ExecServer, SSHTransport]) -> None:
    """`while channel.recv_ready(): out += ...` held a 600 MB reply whole (and `vigil
    status` died of MemoryError): the read stops at the cap, one HostError for the host."""
    _, t = exec_server
    started = time.monotonic()
    with pytest.raises(HostError) as err:
        t.run("flood", timeout=60, limit=2 * 2**20)
    assert time.monotonic() - started < 10
    assert str(err.value).startswith("h1: the reply is over 2 MiB"), str(err.value)


def test_the_deadline_holds_while_bytes_keep_coming(
        exec_server: tuple[_ExecServer, SSHTransport]) -> None:
    """The old loop checked the deadline only when no byte was waiting: a host that kept
    sending was never timed out."""
    server, t = exec_server
    started = time.monotonic()
    with pytest.raises(HostError, match="command timed out after 1 s"):
        t.run("flood", timeout=1, limit=2**40)
    assert time.monotonic() - started < 4
    assert server.sent > 0


def test_a_verbs_reply_over_its_cap_is_that_hosts_error(
        exec_server: tuple[_ExecServer, SSHTransport], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the agent call: `status` is a small verb; a host flooding it is refused at
    its cap (4 MiB), long before memory matters."""
    from vigil.transport import remote

    server, t = exec_server
    monkeypatch.setattr(remote, "agent_command", lambda verb, python=None: "flood")
    with pytest.raises(HostError, match=r"^h1: the reply is over 4 MiB"):
        remote.call(t, HostVars(), "status", {})
    assert server.sent < 64 * 2**20
    assert remote.reply_max("status") == 4 * 2**20
    assert remote.reply_max("cache_read") > 4 * (16 * 2**20) // 3 + 4096  # a whole chunk


def test_a_reply_is_read_to_eof_not_to_its_exit_status(
        exec_server: tuple[_ExecServer, SSHTransport]) -> None:
    """An exit status that comes before the output (seen under load as a cut reply): the
    read goes on to EOF."""
    _, t = exec_server
    got = t.run("late", timeout=30, limit=2**20)
    assert (len(got.stdout), got.stderr, got.exit_status) == (300_000, "last words\n", 0)
    assert t.run("say 70000", timeout=30).stdout == "z" * 70000
