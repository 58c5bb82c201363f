"""The attacks of tests/unit/test_attacks.py that need a real sshd: replayed against a lab host.

Named as there: ``test_a<N>_...`` for item N of issue 8, ``test_i21_<N>_...`` for item N of
issue 21.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from lab import hosts as lab
from tests.doubles import fake_home, other_key
from vigil.desired.config import HostVars
from vigil.desired.targets import Target
from vigil.errors import UnreachableError
from vigil.transport.ssh import SSHTransport

HOST = "lab2"
INDEX = 2
pytestmark = pytest.mark.drives(1, 2)


def lab_vars(**changes: object) -> HostVars:
    base: dict[str, object] = {
        "address": "127.0.0.1", "ssh_port": lab.host_port(INDEX), "ssh_user": "root",
        "ssh_key": str(lab.key_path()), "connect_timeout_s": 5,
    }
    return HostVars.model_validate({**base, **changes})


def lab_key_lines() -> str:
    return lab.known_hosts_path().read_text()


def connects(hv: HostVars) -> str:
    t = SSHTransport(HOST, hv)
    try:
        return t.run("hostname").stdout.strip()
    finally:
        t.close()


def _as_pattern(lines: str, pattern: str) -> str:
    """The lab host's own key lines, under ``pattern`` instead of its name."""
    port = lab.host_port(INDEX)
    return "".join(f"{pattern} {line.split(None, 1)[1]}\n" for line in lines.splitlines()
                   if line.startswith(f"[127.0.0.1]:{port} "))


def _lab_fingerprint(keytype: str) -> str:
    for line in lab_key_lines().splitlines():
        if f":{lab.host_port(INDEX)} {keytype} " in line:
            out = subprocess.run(["ssh-keygen", "-lf", "-"], input=line, text=True,
                                 capture_output=True, check=True).stdout
            return out.split()[1]
    raise AssertionError(f"no {keytype} key for the lab")


SERVICE = "attack16"  # its own unit, lock, env root and port: the lab's vllm is untouched


def _lab_target(tmp_path: Path, name: str) -> Target:
    from tests.doubles import target_in

    return target_in(tmp_path / name, (
        f"hosts:\n  {HOST}: {{address: 127.0.0.1, ssh_port: {lab.host_port(INDEX)}, "
        f"ssh_key: {lab.key_path()}, known_hosts: {lab.known_hosts_path()}, "
        f"service: {SERVICE}, port: 8162, env_root: /opt/vigil/{SERVICE}-envs, "
        "model: tiny-cpu, stack: lab-cpu, connect_timeout_s: 5, lock_timeout_s: 120}\n"
    ), HOST)


_KILL_SESSION = r"""
import os, signal, sys
lock = sys.argv[1]
def comm(p):
    with open("/proc/%d/comm" % p) as fh:
        return fh.read().strip()
def ppid(p):
    with open("/proc/%d/stat" % p) as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])
def holds(p):
    try:
        return any(os.readlink("/proc/%d/fd/%s" % (p, fd)) == lock
                   for fd in os.listdir("/proc/%d/fd" % p))
    except OSError:
        return False
(pid,) = [int(p) for p in os.listdir("/proc") if p.isdigit() and holds(int(p))
          and comm(int(p)) == "cat"]
chain = []  # the holder's sshd ancestors below the listener, read before any kill
while pid > 1:
    pid = ppid(pid)
    if comm(pid).startswith("sshd") and ppid(pid) != 1:
        chain.append(pid)
for pid in chain:
    os.kill(pid, signal.SIGKILL)
print(" ".join(map(str, chain)))
"""


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


@pytest.mark.lab
def test_a1_a_wildcard_entry_trusts_the_host_and_a_changed_key_under_it_is_refused(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = fake_home(tmp_path, monkeypatch)
    kh = home / ".ssh" / "known_hosts"
    kh.write_text(_as_pattern(lab_key_lines(), "[127.0.0.?]:22*"))
    assert connects(lab_vars()) == HOST
    keytype, data = other_key(tmp_path)
    kh.write_text(f"[127.0.0.*]:* {keytype} {data}\n")
    with pytest.raises(UnreachableError, match="does NOT match known_hosts"):
        connects(lab_vars())
    # ruled out by a negated pattern: the host is unknown, not trusted
    kh.write_text(_as_pattern(lab_key_lines(),
                              f"[127.0.0.*]:*,![127.0.0.1]:{lab.host_port(INDEX)}"))
    with pytest.raises(UnreachableError, match="is unknown: in none of"):
        connects(lab_vars())


@pytest.mark.lab
def test_a1_a_host_vouched_for_only_by_a_cert_authority_is_refused_with_the_reason(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = fake_home(tmp_path, monkeypatch)
    keytype, data = other_key(tmp_path)
    (home / ".ssh" / "known_hosts").write_text(f"@cert-authority [127.0.0.1]:* {keytype} {data}\n")
    with pytest.raises(UnreachableError) as err:
        connects(lab_vars())
    text = str(err.value)
    assert "only by @cert-authority [127.0.0.1]:* in " in text
    assert "cannot check host certificates" in text and "host_key_fingerprints: [SHA256:" in text


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


@pytest.mark.lab
def test_a16_killed_sshd_session_mid_deploy_stops_it_and_the_waiting_deploy_goes_on(
    lab_hosts: list[lab.HostStatus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import shlex
    import sys
    import threading

    from tests.paths import REPO
    from vigil.deploy.apply import Options, deploy_host
    from vigil.deploy.hooks import Hooks
    from vigil.report import Log

    lock = f"/var/lib/vigil/{SERVICE}.lock"
    first, second = _lab_target(tmp_path, "a"), _lab_target(tmp_path, "b")
    killed = tmp_path / "killed"
    # The first deploy's drain hook (run mid-deploy: after the new environment is built,
    # before the round trip that writes the release and restarts) starts the second
    # deploy, waits until it queues for the lock, then kills the first deploy's sshd
    # session on the host.
    hook = tmp_path / "hook.py"
    hook.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from lab import hosts as lab\n"
        "from pathlib import Path\n"
        f"waiting = Path({str(tmp_path / 'waiting')!r})\n"
        f"gave_up = Path({str(tmp_path / 'gave-up')!r})\n"
        # evidence, not a deadline: the second deploy queued, or it ended without queueing
        "while not waiting.exists():\n"
        "    if gave_up.exists():\n"
        "        sys.exit('the second deploy ended without queueing: ' + gave_up.read_text())\n"
        "    time.sleep(0.1)\n"
        f"code, out, err = lab.run({INDEX}, 'python3 -c ' + {shlex.quote(_KILL_SESSION)!r}"
        f" + ' {lock}')\n"
        f"Path({str(killed)!r}).write_text(out + err)\n"
        "sys.exit(code)\n")
    second_log = io.StringIO()
    results = {}
    started: list[threading.Thread] = []

    def second_deploy() -> None:
        results["second"] = deploy_host(second, Options(check=True), Log(second_log))

    class Starter(io.StringIO):
        # starts the second deploy once the first holds the lock, notes when it waits
        def write(self, text: str) -> int:
            if "hook before_stop" in text and not started:
                started.append(threading.Thread(target=second_deploy, daemon=True))
                started[0].start()
            return super().write(text)

    first_done = threading.Event()

    def mark_waiting() -> None:
        # follows the second deploy (however long a loaded machine makes it): it queues
        # for the lock, or ends without queueing, or the first deploy ends first
        while not first_done.is_set():
            if "waiting up to" in second_log.getvalue():
                (tmp_path / "waiting").write_text("")
                return
            if "second" in results:
                (tmp_path / "gave-up").write_text(second_log.getvalue()[-2000:])
                return
            time.sleep(0.1)

    threading.Thread(target=mark_waiting, daemon=True).start()
    first_log = Starter()
    opts = Options(restart=True, hooks=Hooks(before_stop=(sys.executable, str(hook))))
    try:
        result = deploy_host(first, opts, Log(first_log))
    finally:
        first_done.set()
    assert killed.exists(), (f"first deploy:\n{first_log.getvalue()}\nsecond deploy:\n"
                             f"{second_log.getvalue()}")
    assert killed.read_text().split(), killed.read_text()  # at least one sshd process
    assert result.status == "failed", first_log.getvalue()
    assert result.error is not None and "lost the deploy lock" in result.error
    assert "another deploy may act on this host now" in result.error
    started[0].join(timeout=900)  # it ends on its own: ok, or its lock wait runs out
    assert results["second"].status in ("ok", "changed"), second_log.getvalue()
    assert "waiting up to 120 s for the deploy lock held by" in second_log.getvalue()
    # the first deploy changed nothing after it lost the lock: no unit written, no
    # environment switched to (its new one was built before, unmarked and unused)
    code, _, _ = lab.run(INDEX, f"test -e /etc/systemd/system/{SERVICE}.service || "
                         f"test -e /opt/vigil/{SERVICE}-envs/current")
    assert code != 0


@pytest.mark.lab
def test_a13_rollback_waits_for_the_deploy_lock(
    lab_hosts: list[lab.HostStatus], tmp_path: Path
) -> None:
    from vigil.deploy.service import rollback
    from vigil.errors import LockTimeoutError
    from vigil.transport.lock import deploy_lock
    from vigil.transport.ssh import connect
    from vigil.verify.watch import Settings

    t = _lab_target(tmp_path, "a")
    hv = t.vars.model_copy(update={"lock_timeout_s": 1.0})
    said: list[str] = []
    with connect(HOST, hv) as holder, deploy_lock(holder, hv, said.append), \
            connect(HOST, hv) as other, \
            pytest.raises(LockTimeoutError, match=r"still held after 1 s"):
        rollback(other, hv, wait=False, settings=Settings(), state_dir=tmp_path,
                 log=lambda host, message: said.append(message))
    assert any("waiting up to 1 s for the deploy lock" in m for m in said)
