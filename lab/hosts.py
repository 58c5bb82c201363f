"""Real test hosts on this machine: systemd-nspawn containers reached over SSH.

Each lab host ``lab{i}`` boots the machine's own OS (``--volatile=yes``: a tmpfs root
with the machine's /usr, /etc and /root bound read-only) with a real systemd, journald
and sshd listening on 127.0.0.1:``2200+i``. What a deploy writes lands where it does in
production, in per-host directories of the lab state bound into the host:

    /etc/systemd/system  /etc/vigil  /var/lib/vigil   reset on every fresh boot (clean host)
    /opt/vigil  /var/cache/vigil                      kept: an installed vLLM is 3.5 GB,
                                                      a warm compile cache is the point
    /srv/models (ro)  /opt/wheels (ro)  /root/.cache/pip (shared, writable)
    /tmp                                              on disk, emptied at every boot

Lab state lives in ``/var/lib/vigil-lab`` (env ``VIGIL_LAB_DIR``). Host keys are the
machine's (the containers see its /etc/ssh), so ``known_hosts`` is exact and host key
checking stays on in the lab. ``up`` writes ``inventory/hosts.d/lab.yml``; ``down``
removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from lab import dedupe, tiny_model
from vigil.errors import ConfigError, HostError

REPO = Path(__file__).resolve().parent.parent
INVENTORY_FRAGMENT = REPO / "inventory" / "hosts.d" / "lab.yml"
DEFAULT_LAB_DIR = Path("/var/lib/vigil-lab")
BASE_PORT = 2200
SERVICE_BASE_PORT = 8100
MODEL_NAME = "tiny-llama"
SERVICE_USER = "vllm"
NOROOT_USER = "vigil-noroot"
# Bind targets inside read-only binds (/etc, /root) must exist on the machine.
SSHD_FRAGMENT = Path("/etc/ssh/sshd_config.d/vigil-lab.conf")
PIP_CACHE = Path("/root/.cache/pip")
WHEELS = Path("/opt/wheels")
# Units of this machine with no business in a lab host: they fail there (a database
# without its data) or wake up to do maintenance work on 2 shared cores.
MASKED_UNITS = (
    "postgresql.service",
    "e2scrub_reap.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "man-db.timer",
    "systemd-timesyncd.service",
    "systemd-pstore.service",
)
# in-host path -> per-host directory name; `fresh` ones are emptied on each fresh boot
_HOST_DIRS: tuple[tuple[str, str, bool], ...] = (
    ("/etc/systemd/system", "etc-systemd-system", True),
    ("/etc/vigil", "etc-vigil", True),
    ("/var/lib/vigil", "var-lib-vigil", True),
    ("/opt/vigil", "opt-vigil", False),
    ("/var/cache/vigil", "var-cache-vigil", False),
)


@dataclass(frozen=True)
class HostStatus:
    name: str
    port: int
    running: bool
    pid: int | None
    ssh_ok: bool
    log: Path
    failed_units: list[str] = field(default_factory=list)


def lab_dir() -> Path:
    return Path(os.environ.get("VIGIL_LAB_DIR") or DEFAULT_LAB_DIR)


def host_name(i: int) -> str:
    return f"lab{i}"


def host_port(i: int) -> int:
    return BASE_PORT + i


def service_port(i: int) -> int:
    """The vLLM port of lab host i (the hosts share one network namespace)."""
    return SERVICE_BASE_PORT + i


def key_path() -> Path:
    return lab_dir() / "ssh" / "id_ed25519"


def known_hosts_path() -> Path:
    return lab_dir() / "ssh" / "known_hosts"


def models_dir() -> Path:
    return lab_dir() / "models"


def _host_dir(i: int) -> Path:
    return lab_dir() / "hosts" / host_name(i)


def _pid_file(i: int) -> Path:
    return _host_dir(i) / "nspawn.pid"


def log_path(i: int) -> Path:
    return _host_dir(i) / "nspawn.log"


def _run(cmd: list[str], what: str) -> str:
    try:
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise ConfigError(
            f"{what}: {cmd[0]} is not installed",
            fix="apt-get install -y systemd-container openssh-server openssh-client",
        ) from None
    except subprocess.CalledProcessError as exc:
        raise ConfigError(f"{what} failed: {' '.join(cmd)}: {exc.stderr.strip()}") from None
    return done.stdout


# --- machine preparation (idempotent) -------------------------------------------------


def _check_machine() -> None:
    if os.geteuid() != 0:
        raise ConfigError("the lab needs root (systemd-nspawn)", fix="run it as root")
    for tool, pkg in (("systemd-nspawn", "systemd-container"), ("ssh-keygen", "openssh-client")):
        if shutil.which(tool) is None:
            raise ConfigError(f"{tool} is not installed", fix=f"apt-get install -y {pkg}")
    if not Path("/usr/sbin/sshd").exists():
        raise ConfigError("sshd is not installed", fix="apt-get install -y openssh-server")


def _ensure_user(name: str, *args: str) -> None:
    probe = subprocess.run(["id", "-u", name], capture_output=True)
    if probe.returncode != 0:
        _run(["useradd", *args, name], f"creating user {name}")


def _check_secure_path(path: Path) -> None:
    # sshd (StrictModes) ignores an authorized_keys file if any directory above it is
    # writable by group or others: fail here, not with a baffling "Permission denied".
    for part in [path, *path.parents]:
        st = part.stat()
        if st.st_uid != 0 or st.st_mode & 0o022:
            raise ConfigError(
                f"{part} is writable by others or not owned by root; sshd would ignore the "
                f"lab's authorized keys under {path}",
                key="VIGIL_LAB_DIR",
                fix="use a lab directory whose parents are root-owned and not "
                "group/world-writable (the default /var/lib/vigil-lab is)",
            )


def prepare_machine() -> None:
    """Users, lab key, known_hosts, bind targets and the tiny model; safe to rerun."""
    _check_machine()
    root = lab_dir()
    ssh_dir = root / "ssh"
    auth_dir = ssh_dir / "authorized_keys"
    _check_secure_path(next(p for p in [root, *root.parents] if p.exists()))
    for d in (root, ssh_dir, auth_dir, models_dir(), root / "pip-cache", root / "hosts"):
        d.mkdir(parents=True, exist_ok=True)
        # ssh/: private key inside, yet users must traverse it to their authorized keys
        d.chmod(0o711 if d == ssh_dir else 0o755)

    _ensure_user(SERVICE_USER, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin")
    _ensure_user(NOROOT_USER, "--create-home", "--shell", "/bin/bash")

    key = key_path()
    if not key.exists():
        _run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vigil-lab", "-f", str(key)],
            "generating the lab key",
        )
    pub = key.with_suffix(".pub").read_text()
    for user in ("root", NOROOT_USER):
        _write_if_changed(auth_dir / user, pub, 0o644)

    SSHD_FRAGMENT.parent.mkdir(parents=True, exist_ok=True)
    SSHD_FRAGMENT.touch(exist_ok=True)
    PIP_CACHE.mkdir(parents=True, exist_ok=True)
    Path("/etc/vigil").mkdir(exist_ok=True)

    model = models_dir() / MODEL_NAME
    if not all((model / name).exists() for name in tiny_model.FILES):
        tiny_model.generate(model)


def _write_if_changed(path: Path, text: str, mode: int) -> None:
    if not path.exists() or path.read_text() != text:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.chmod(mode)
        tmp.replace(path)


def _host_key_lines() -> list[str]:
    lines = []
    for pub in sorted(Path("/etc/ssh").glob("ssh_host_*_key.pub")):
        keytype, keydata = pub.read_text().split()[:2]
        lines.append(f"{keytype} {keydata}")
    if not lines:
        raise ConfigError("the machine has no SSH host keys in /etc/ssh", fix="run: ssh-keygen -A")
    return lines


def _write_known_hosts(indexes: Iterable[int]) -> None:
    keys = _host_key_lines()
    text = "".join(
        f"[127.0.0.1]:{host_port(i)} {key}\n" for i in sorted(set(indexes)) for key in keys
    )
    _write_if_changed(known_hosts_path(), text, 0o644)


# --- one host -----------------------------------------------------------------------


def _sshd_conf(i: int) -> str:
    auth = lab_dir() / "ssh" / "authorized_keys"
    return (
        "# written by lab/hosts.py for this lab host only\n"
        f"Port {host_port(i)}\n"
        "ListenAddress 127.0.0.1\n"
        f"AuthorizedKeysFile {auth}/%u\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
    )


def _prepare_host(i: int, clean: bool) -> list[str]:
    """Per-host directories and the nspawn command line."""
    hdir = _host_dir(i)
    hdir.mkdir(parents=True, exist_ok=True)
    name = host_name(i)
    _write_if_changed(hdir / "sshd.conf", _sshd_conf(i), 0o644)
    # The machine's /etc would make every host "vm" with one machine id (journals of
    # all hosts would claim to be the same machine).
    _write_if_changed(hdir / "hostname", f"{name}\n", 0o644)
    machine_id = hashlib.sha256(f"vigil-lab/{name}".encode()).hexdigest()[:32]
    _write_if_changed(hdir / "machine-id", f"{machine_id}\n", 0o444)
    # The machine's root .bashrc runs pyenv init, which writes to the read-only /root
    # and prints an error on every SSH command: production hosts have no such noise.
    _write_if_changed(hdir / "bashrc", "# ~/.bashrc of a lab host (lab/hosts.py)\n", 0o644)
    binds = [
        "--bind-ro=/etc",
        "--bind-ro=/root",
        "--bind-ro=/home",
        f"--bind-ro={hdir / 'sshd.conf'}:{SSHD_FRAGMENT}",
        f"--bind-ro={hdir / 'hostname'}:/etc/hostname",
        f"--bind-ro={hdir / 'machine-id'}:/etc/machine-id",
        f"--bind-ro={hdir / 'bashrc'}:/root/.bashrc",
        f"--bind-ro={lab_dir() / 'ssh' / 'authorized_keys'}",
        f"--bind-ro={models_dir()}:/srv/models",
        f"--bind={lab_dir() / 'pip-cache'}:{PIP_CACHE}",
    ]
    if WHEELS.is_dir():
        binds.append(f"--bind-ro={WHEELS}")
    # /tmp on disk as on a Debian host, not nspawn's tmpfs of 10% of RAM: pip unpacks
    # the vLLM wheels there. Emptied at every boot, as a reboot does.
    tmp = hdir / "tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    tmp.chmod(0o1777)
    binds.append(f"--bind={tmp}:/tmp")
    for inside, name, fresh in _HOST_DIRS:
        d = hdir / name
        if fresh and clean and d.exists():
            shutil.rmtree(d)
        if inside == "/etc/systemd/system" and not d.exists():
            _seed_unit_dir(d)
        d.mkdir(mode=0o755, exist_ok=True)
        binds.append(f"--bind={d}:{inside}")
    return [
        "systemd-nspawn",
        "-D",
        "/",
        "--volatile=yes",
        "-M",
        host_name(i),
        "--register=no",
        "--keep-unit",
        "--console=read-only",
        *binds,
        "--boot",
        "systemd.firstboot=off",
    ]


def _seed_unit_dir(d: Path) -> None:
    # An empty /etc/systemd/system hides every enabled unit (sshd would never start):
    # start from the machine's, minus what fails or churns in a container.
    tmp = d.with_name(d.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree("/etc/systemd/system", tmp, symlinks=True)
    for unit in MASKED_UNITS:
        for link in tmp.glob(f"*.wants/{unit}"):
            link.unlink()
        target = tmp / unit
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to("/dev/null")
    tmp.rename(d)


def _read_pid(i: int) -> int | None:
    try:
        pid = int(_pid_file(i).read_text().strip())
    except (OSError, ValueError):
        return None
    # A recorded PID may have been reused: it is ours only if it is our nspawn.
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if not cmdline or not cmdline[0].endswith(b"systemd-nspawn"):
        return None
    if host_name(i).encode() not in cmdline:
        return None
    return pid


def _start(i: int, clean: bool) -> int:
    cmd = _prepare_host(i, clean)
    with open(log_path(i), "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives the caller (invoke, pytest)
            close_fds=True,
        )
    _pid_file(i).write_text(f"{proc.pid}\n")
    return proc.pid


def _log_tail(i: int, lines: int = 15) -> str:
    try:
        text = log_path(i).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n    ".join(text.splitlines()[-lines:]) or "(empty)"


def connect(i: int, user: str = "root", timeout: float = 5.0) -> paramiko.SSHClient:
    """An SSH client to lab host i, authenticated by the lab key, host key checked."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts_path()))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        "127.0.0.1",
        port=host_port(i),
        username=user,
        key_filename=str(key_path()),
        look_for_keys=False,
        allow_agent=False,
        timeout=timeout,
        banner_timeout=timeout,
        auth_timeout=timeout,
    )
    return client


def run(i: int, command: str, user: str = "root", timeout: float = 60.0) -> tuple[int, str, str]:
    """Run a command on lab host i over SSH: (exit status, stdout, stderr). Opening the
    session is tried twice: on a loaded 2-core machine the host's sshd once took over 60 s
    to open one (paramiko's "Timeout opening channel"); nothing has run by then."""
    for attempt in (1, 2):
        client = connect(i, user, timeout=min(timeout, 20.0))
        try:
            try:
                _, out, err = client.exec_command(command, timeout=timeout)
            except paramiko.SSHException:
                if attempt == 2:
                    raise
                continue
            stdout = out.read().decode(errors="replace")
            stderr = err.read().decode(errors="replace")
            return out.channel.recv_exit_status(), stdout, stderr
        finally:
            client.close()
    raise AssertionError("unreachable")


def stop_now(unit: str = "vllm") -> str:
    """A shell command that stops `unit` on a lab host at once, for tests' cleanup.

    vLLM mid-start (and often while serving) does not answer SIGTERM soon, so a plain
    `systemctl stop` waits out TimeoutStopSec (90 s, measured) before its SIGKILL:
    start the stop, SIGKILL the unit's cgroup, then wait for the stop job. systemd in a
    lab host cannot always kill the whole cgroup itself ("Failed to kill control group
    ... Input/output error"), so any leftover is killed again at the end.
    """
    kill = (f"CG=/sys/fs/cgroup/systemd/system.slice/{unit}.service/cgroup.procs; "
            "for i in $(seq 20); do P=$(cat $CG 2>/dev/null); [ -z \"$P\" ] && break; "
            "kill -9 $P 2>/dev/null; sleep 0.5; done; ")
    return (f"systemctl stop --no-block {unit}; sleep 0.5; {kill}"
            f"systemctl stop {unit}; systemctl reset-failed {unit} || true; {kill}true")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_ready(i: int, pid: int, deadline: float) -> list[str]:
    """Until sshd takes the key and systemd settled; returns the failed units."""
    name = host_name(i)
    last = "sshd not listening yet"
    while time.monotonic() < deadline:
        if _read_pid(i) != pid:
            time.sleep(0.3)  # its last words may still be on their way to the log
            _pid_file(i).unlink(missing_ok=True)
            raise HostError(
                name,
                f"systemd-nspawn exited during boot; log {log_path(i)}:\n    {_log_tail(i)}",
                fix="read the log; `invoke lab.down` then `invoke lab.up` retries",
            )
        if _port_open(host_port(i)):
            try:
                left = max(5, int(deadline - time.monotonic()))
                code, out, _ = run(
                    i, f"timeout {left} systemctl is-system-running --wait", timeout=left + 5
                )
                state = out.strip()
                if state == "running":
                    return []
                if state == "degraded":
                    _, failed, _ = run(i, "systemctl list-units --failed --plain --no-legend")
                    return [line.split()[0] for line in failed.splitlines() if line.strip()]
                last = f"systemd state {state!r} (exit {code})"
            except (OSError, paramiko.SSHException) as exc:
                last = f"ssh: {exc}"
        time.sleep(0.5)
    raise HostError(
        name,
        f"not ready in time ({last}); nspawn log {log_path(i)}:\n    {_log_tail(i)}",
        fix=f"read the log; check port {host_port(i)} is free (ss -ltnp)",
    )


# --- the lab ------------------------------------------------------------------------


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    # Two callers at once (two pytest workers, a test run and `invoke lab.up`) must not
    # boot the same host twice: the second one waits, then finds it running.
    lab_dir().mkdir(parents=True, exist_ok=True)
    with open(lab_dir() / "lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _running() -> dict[int, int]:
    hosts = lab_dir() / "hosts"
    found: dict[int, int] = {}
    if not hosts.is_dir():
        return found
    for d in hosts.iterdir():
        if d.name.startswith("lab") and d.name[3:].isdigit():
            i = int(d.name[3:])
            pid = _read_pid(i)
            if pid is not None:
                found[i] = pid
    return found


def up(n: int = 1, *, timeout: float = 120.0, clean: bool = True) -> list[HostStatus]:
    """Boot lab1..lab{n} (hosts already running stay as they are) and wait until ready.

    ``clean`` empties a host's /etc/systemd/system, /etc/vigil and /var/lib/vigil
    before it boots, so no unit of an earlier session starts on its own; /opt/vigil and
    /var/cache/vigil always persist.
    """
    if not 1 <= n <= 99:
        raise ConfigError(f"--hosts {n}: between 1 and 99 lab hosts", key="hosts")
    with _locked():
        return _up(n, timeout, clean)


INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")


def _ensure_inotify(n: int) -> None:
    # Every lab host's systemd, journald and udev hold inotify instances (about 10 per
    # host), all counted against root's machine-wide limit (Debian: 128). Past it a
    # booting host stops at "Failed to create inotify object: Too many open files" and
    # never starts sshd: 13 hosts fit, 34 do not.
    need = 256 + 16 * n
    try:
        if int(INOTIFY_INSTANCES.read_text()) < need:
            INOTIFY_INSTANCES.write_text(f"{need}\n")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot raise fs.inotify.max_user_instances to {need}: {exc}",
                          fix=f"sysctl -w fs.inotify.max_user_instances={need}") from None


def _up(n: int, timeout: float, clean: bool) -> list[HostStatus]:
    prepare_machine()
    # many hosts on one disk: the environments earlier tests built share their files
    dedupe.link_identical(dedupe.env_roots(lab_dir()), lab_dir() / dedupe.INDEX)
    _ensure_inotify(n)
    running = _running()
    wanted = range(1, n + 1)
    _write_known_hosts([*wanted, *running])
    for i in wanted:
        if i not in running and _port_open(host_port(i)):
            raise HostError(
                host_name(i),
                f"port {host_port(i)} is taken by a process that is not this lab host",
                fix=f"find it with `ss -ltnp 'sport = :{host_port(i)}'` and stop it",
            )
    pids = {i: running.get(i) or _start(i, clean) for i in wanted}
    deadline = time.monotonic() + timeout
    with ThreadPoolExecutor(max_workers=max(1, len(pids))) as pool:
        futures = {i: pool.submit(_wait_ready, i, pid, deadline) for i, pid in pids.items()}
        failed = {i: f.result() for i, f in futures.items()}
    all_up = sorted({*wanted, *running})
    write_inventory(all_up)
    return [
        HostStatus(
            host_name(i),
            host_port(i),
            True,
            pids.get(i) or running[i],
            True,
            log_path(i),
            failed.get(i, []),
        )
        for i in all_up
    ]


def write_inventory(indexes: list[int]) -> Path:
    names = [host_name(i) for i in indexes]
    lines = ["# written by `invoke lab.up`; removed by `invoke lab.down`", "hosts:"]
    # The hosts share the machine's network: each serves vLLM on its own port.
    lines += [
        f"  {host_name(i)}: {{address: 127.0.0.1, ssh_port: {host_port(i)}, "
        f"port: {service_port(i)}}}"
        for i in indexes
    ]
    lines += [
        "groups:",
        "  lab:",
        f"    hosts: [{', '.join(names)}]",
        "    vars:",
        "      ssh_user: root",
        f"      ssh_key: {key_path()}",
        f"      known_hosts: {known_hosts_path()}",
        "      model: tiny-cpu",
        "      stack: lab-cpu",
        "      connect_timeout_s: 5",
    ]
    INVENTORY_FRAGMENT.parent.mkdir(parents=True, exist_ok=True)
    _write_if_changed(INVENTORY_FRAGMENT, "\n".join(lines) + "\n", 0o644)
    return INVENTORY_FRAGMENT


def _stop(i: int, pid: int, timeout: float) -> None:
    # Orderly first: services get their stop, journald flushes.
    with contextlib.suppress(OSError, paramiko.SSHException):
        run(i, "systemctl --no-block poweroff", timeout=5)
    deadline = time.monotonic() + timeout
    for sig in (signal.SIGTERM, signal.SIGKILL):
        while time.monotonic() < deadline and _read_pid(i) == pid:
            time.sleep(0.2)
        if _read_pid(i) != pid:
            break
        # SIGTERM makes nspawn ask the container's systemd to power off; KILL ends it.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + 10
    _pid_file(i).unlink(missing_ok=True)


def down(names: Iterable[str] | None = None, *, timeout: float = 30.0) -> list[str]:
    """Power off the named lab hosts (default: all) and update the inventory fragment.

    The fragment is removed once no lab host runs, else it lists the ones left.
    """
    with _locked():
        return _down(names, timeout)


def _down(names: Iterable[str] | None, timeout: float) -> list[str]:
    running = _running()
    if names is not None:
        wanted = set(names)
        running = {i: pid for i, pid in running.items() if host_name(i) in wanted}
    with ThreadPoolExecutor(max_workers=max(1, len(running))) as pool:
        list(pool.map(lambda item: _stop(item[0], item[1], timeout), running.items()))
    left = sorted(_running())
    if left:
        write_inventory(left)
    else:
        INVENTORY_FRAGMENT.unlink(missing_ok=True)
    return [host_name(i) for i in sorted(running)]


def status() -> list[HostStatus]:
    """Every lab host with state on this machine: running, pid, port, ssh ok."""
    hosts = lab_dir() / "hosts"
    indexes = (
        sorted(int(d.name[3:]) for d in hosts.iterdir() if d.name[3:].isdigit())
        if hosts.is_dir()
        else []
    )
    result = []
    for i in indexes:
        pid = _read_pid(i)
        ssh_ok = False
        if pid is not None:
            try:
                # a host just booted answers slowly while its units still start
                ssh_ok = run(i, "true", timeout=20)[0] == 0
            except (OSError, paramiko.SSHException):
                ssh_ok = False
        result.append(
            HostStatus(host_name(i), host_port(i), pid is not None, pid, ssh_ok, log_path(i))
        )
    return result
