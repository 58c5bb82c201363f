"""Helpers every verb shares: reading files safely, JSON, systemctl show, HTTP, the
service's process tree, running a command.

Part of the host agent (joined into one script by vigil/host/payload.py): stdlib only,
Python 3.8+.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

Json = Dict[str, Any]
RELEASE_FILES = ("unit", "env")
ROLE_FILES = "role-files.json"  # the kept user-role files, in the backup directory


def read_text(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        return None
    except PermissionError:
        return {"error": "permission denied"}


# -- files: opened without following what another user controls, read bounded -----------

O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | O_NOFOLLOW
MAX_SYMLINKS = 40


def _trusted(uid: int) -> bool:
    return uid == 0 or uid == os.geteuid()


def open_dir(path: str, create: bool = False, _hops: int = 0) -> int:
    """A descriptor of directory `path`, walked from / one component at a time (openat
    with O_NOFOLLOW), so no component can be swapped for a symlink behind a check. A
    symlink is followed only when root (or this user) owns it; one another user owns is
    refused (ELOOP, naming it). create: missing directories are made (0755)."""
    if not path.startswith("/"):
        raise ValueError("not an absolute path: %r" % (path,))
    parts = [p for p in path.split("/") if p not in ("", ".")]
    fd = os.open("/", O_DIR)
    try:
        for i, name in enumerate(parts):
            here = "/" + "/".join(parts[:i + 1])
            if name == "..":
                raise OSError(errno.EINVAL, "a '..' in the path", here)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT),
                                            here) from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if not _trusted(st.st_uid):
                    raise OSError(errno.ELOOP, "a symlink owned by uid %d, not followed"
                                  % st.st_uid, here)
                if _hops >= MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), here)
                target = os.readlink(name, dir_fd=fd)
                # every component so far is a real directory: '..' in the target is exact
                rest = os.path.join("/" + "/".join(parts[:i]), target, *parts[i + 1:])
                return open_dir(os.path.normpath(rest), create, _hops + 1)
            nfd = os.open(name, O_DIR, dir_fd=fd)
            os.close(fd)
            fd = nfd
        kept, fd = fd, -1
        return kept
    finally:
        if fd >= 0:
            os.close(fd)


class Refused(Exception):
    """A host file this agent will not read (not a regular file, too large, too deep);
    the message names the file, ``reason`` is the message without it."""

    def __init__(self, path: str, reason: str) -> None:
        Exception.__init__(self, "%s: %s" % (path, reason))
        self.reason = reason


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _read_fd(fd: int, limit: int) -> bytes:
    chunks: List[bytes] = []
    got = 0
    while got < limit:
        chunk = os.read(fd, min(1 << 20, limit - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_regular(path: str, cap: int, dir_fd: Optional[int] = None,
                 nofollow: bool = False) -> bytes:
    """A regular file's bytes, at most `cap`: opened O_NONBLOCK (a FIFO cannot block the
    agent), checked on the open descriptor (no /dev/zero, no device), never more than
    cap read. Refused names the file; FileNotFoundError and PermissionError pass."""
    flags = os.O_RDONLY | O_NONBLOCK | (O_NOFOLLOW if nofollow else 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and nofollow:
            raise Refused(path, "a symlink, not followed") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(path, "%s, not a regular file" % _kind(st.st_mode))
        if st.st_size > cap:
            raise Refused(path, "%d bytes, more than the %d read here" % (st.st_size, cap))
        data = _read_fd(fd, cap + 1)
    finally:
        os.close(fd)
    if len(data) > cap:
        raise Refused(path, "grew past the %d bytes read here" % cap)
    return data


# JSON a host holds is parsed only this deep (json.loads recurses; 200k-deep input would
# abort the whole facts call) and only this large.
JSON_DEPTH_MAX = 512
JSON_READ_MAX = 64 * 1024 * 1024
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
JSON_INVALID = "not valid JSON: "
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"{}[]")


def parse_json(data: bytes, path: str) -> Any:
    """json.loads, depth-safe: nesting is counted (outside strings) before parsing."""
    depth = 0
    for ch in _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKET):
        depth += 1 if ch in (0x7B, 0x5B) else -1
        if depth > JSON_DEPTH_MAX:
            raise Refused(path, "nested deeper than %d levels" % JSON_DEPTH_MAX)
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise Refused(path, JSON_INVALID + str(exc)[:200]) from None


def read_json(path: str, cap: Optional[int] = None) -> Tuple[Any, Optional[str]]:
    """(value, None), (None, None) when absent, or (None, one refusal naming the file)."""
    try:
        return parse_json(read_regular(path, cap or JSON_READ_MAX), path), None
    except FileNotFoundError:
        return None, None
    except Refused as exc:
        return None, str(exc)
    except OSError as exc:
        return None, "%s: cannot read: %s" % (path, exc.strerror)


# -- shared helpers: one of each, used by every verb ------------------------------------

SERVICE_PROPS = ("LoadState,ActiveState,SubState,MainPID,NRestarts,UnitFileState,"
                 "ExecMainStatus,ExecMainStartTimestampMonotonic,"
                 "ActiveEnterTimestampMonotonic,ControlGroup,InvocationID")
CMD_TIMEOUT = 10.0


def _err(exc: BaseException) -> str:
    return "%s: %s" % (type(exc).__name__, exc)


def _int(text: Any, default: int = 0) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


def systemctl_show(unit: str) -> Dict[str, str]:
    """Every unit property a verb reads, in one `systemctl show`; `error` when it failed."""
    try:
        proc = subprocess.run(["systemctl", "show", unit, "-p", SERVICE_PROPS],
                              capture_output=True, text=True, timeout=CMD_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": _err(exc)}
    out: Dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        out[key] = value
    if proc.returncode != 0:
        out["error"] = proc.stderr.strip()[:300] or "systemctl exit %d" % proc.returncode
    return out


def http(
    port: int, path: str, body: Optional[Json] = None,
    headers: Optional[Dict[str, str]] = None, timeout: float = 3.0, limit: int = 4000,
) -> Json:
    """One request to the service on 127.0.0.1: {status, body, seconds}; status None and an
    error when nothing answered (refused, timeout, reset all mean "not serving")."""
    url = "http://127.0.0.1:%d%s" % (port, path)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read(limit).decode("utf-8", "replace")
            return {"status": resp.status, "body": text, "error": None,
                    "seconds": time.monotonic() - started}
    except urllib.error.HTTPError as exc:
        text = exc.read(limit).decode("utf-8", "replace")
        return {"status": exc.code, "body": text, "error": None,
                "seconds": time.monotonic() - started}
    except Exception as exc:  # refused, timeout, reset: all mean "not serving"
        return {"status": None, "body": None, "error": str(getattr(exc, "reason", exc))}


def get_health(port: int) -> Json:
    """GET /health: vLLM answers 200 once it serves."""
    return http(port, "/health", timeout=2.0)


def bearer(api_key: Optional[str]) -> Dict[str, str]:
    return {"Authorization": "Bearer " + api_key} if api_key else {}


def _stat_fields(pid: int) -> Optional[List[str]]:
    """/proc/PID/stat after the command name (which may hold spaces and parens)."""
    stat = read_text("/proc/%d/stat" % pid)
    if not isinstance(stat, str):
        return None
    return stat[stat.rfind(")") + 2:].split()


def start_time(pid: int) -> Optional[int]:
    """When the process started, in clock ticks since boot: with the PID, its identity."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def tree_pids(root: int) -> List[int]:
    """root and all its descendants, from /proc (ppid links)."""
    children: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields and len(fields) > 1:
                children.setdefault(_int(fields[1]), []).append(int(name))
    out: List[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(out)


def cgroup_pids(control_group: str) -> Optional[List[int]]:
    """Every PID in the unit's cgroup and its sub-cgroups (v2, then v1's systemd tree)."""
    if not control_group:
        return None
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"):
        base = root + control_group
        if not os.path.isfile(os.path.join(base, "cgroup.procs")):
            continue
        pids: List[int] = []
        for dirpath, _dirs, files in os.walk(base):
            if "cgroup.procs" in files:
                text = read_text(os.path.join(dirpath, "cgroup.procs"))
                if isinstance(text, str):
                    pids += [int(x) for x in text.split() if x.isdigit()]
        return sorted(set(pids))
    return None


def service_pids(control_group: str, main_pid: int) -> Tuple[List[int], str]:
    """Every process of the service (workers included): its cgroup, else the MainPID tree."""
    pids = cgroup_pids(control_group)
    if pids:
        return pids, "cgroup"
    if main_pid > 0:
        return tree_pids(main_pid), "proc-tree"
    return [], "none"


def cmdline(pid: int) -> Optional[str]:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def run(
    cmd: List[str], log: Optional[str] = None, timeout: Optional[float] = None
) -> Tuple[int, str]:
    if log is not None:
        with open(log, "a") as fh:
            fh.write("$ %s\n" % " ".join(cmd))
            fh.flush()
            logged = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
        return logged.returncode, ""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def tail(path: str, lines: int = 15) -> str:
    text = read_text(path)
    return "\n".join(text.splitlines()[-lines:]) if isinstance(text, str) else ""


def errno_name(exc: OSError) -> Optional[str]:
    if isinstance(exc, TimeoutError) or exc.__class__.__name__ == "timeout":
        return "ETIMEDOUT"
    return errno.errorcode.get(exc.errno or 0)
