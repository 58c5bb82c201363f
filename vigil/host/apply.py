"""``apply`` (one applier per action kind), ``rollback`` and ``status``.

Part of the host agent (joined into one script by vigil/host/payload.py): stdlib only,
Python 3.8+.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import signal
import stat
import time
from typing import Any, Callable, Dict, List, Optional

from vigil.host.caches import seed
from vigil.host.common import (
    O_NOFOLLOW,
    O_NONBLOCK,
    RELEASE_FILES,
    ROLE_FILES,
    Json,
    _err,
    _int,
    _kind,
    cmdline,
    get_health,
    open_dir,
    read_text,
    run,
    start_time,
    systemctl_show,
)
from vigil.host.files import _split, switch_link, write_atomic
from vigil.host.install import env_child, install_env, remove_envs
from vigil.host.roles import record_written


def backup_release(paths: Dict[str, str], files: Optional[List[Json]] = None) -> None:
    """Keep the release being replaced (unit, env, environment link, and the user roles'
    files the deploy is about to write) as one set."""
    bdir = paths["backup_dir"]
    tmp = bdir + ".new"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp, mode=0o700)
    for name in RELEASE_FILES:
        if os.path.exists(paths[name]):
            shutil.copy2(paths[name], os.path.join(tmp, name))
    if os.path.islink(paths["current"]):
        write_atomic(os.path.join(tmp, "current"), os.readlink(paths["current"]), 0o600)
    kept = []
    for n, f in enumerate(files or []):
        entry = {"path": f["path"], "restart": f.get("restart"), "saved": None}
        # absent now: a rollback removes it again
        entry.update(_keep_role_file(f["path"], os.path.join(tmp, "file-%d" % n)))
        kept.append(entry)
    if kept:
        write_atomic(os.path.join(tmp, ROLE_FILES), json.dumps(kept), 0o600)
    old = bdir + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.isdir(bdir):
        os.replace(bdir, old)
    os.replace(tmp, bdir)
    shutil.rmtree(old, ignore_errors=True)


def _keep_role_file(path: str, into: str) -> Json:
    """What a rollback needs to put one role file back, read without following a symlink
    (open_dir, O_NOFOLLOW): a regular file's bytes copied to `into` with its mode and
    owner, a symlink's target (never the file it points at), or for anything else its
    kind (a rollback leaves that alone); {} when absent."""
    directory, name = _split(path)
    try:
        dfd = open_dir(directory)
    except FileNotFoundError:
        return {}
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return {}
        if stat.S_ISLNK(st.st_mode):
            return {"link": os.readlink(name, dir_fd=dfd)}
        if not stat.S_ISREG(st.st_mode):
            return {"kind": _kind(st.st_mode)}
        fd = os.open(name, os.O_RDONLY | O_NOFOLLOW | O_NONBLOCK, dir_fd=dfd)
        with os.fdopen(fd, "rb") as src:
            fst = os.fstat(src.fileno())
            if not stat.S_ISREG(fst.st_mode):
                return {"kind": _kind(fst.st_mode)}
            with open(into, "wb") as dst:
                shutil.copyfileobj(src, dst)
        return {"saved": os.path.basename(into), "mode": stat.S_IMODE(fst.st_mode),
                "uid": fst.st_uid, "gid": fst.st_gid}
    finally:
        os.close(dfd)


def kill_pids(action: Json) -> Json:
    """End the stale GPU holders named by the controller: TERM, then KILL after 10 s.

    Each PID must come with the start time and command line the facts saw: a process
    that is no longer that one (it ended; its PID was reused during a long install) is
    left alone. PIDs <= 1 and vigil's own process are refused outright."""
    expect = action.get("expect") or {}
    bad = [p for p in action["pids"] if isinstance(p, bool) or not isinstance(p, int)
           or p <= 1 or p == os.getpid() or str(p) not in expect]
    if bad:
        return {"ok": False, "error": "refusing to signal %s: not a PID the facts named"
                % ", ".join(map(str, bad))}
    pids = []
    gone = []
    handles: Dict[int, Any] = {}
    for pid in action["pids"]:
        want = expect[str(pid)]
        # pin the process first (pidfd: Linux 5.3+, Python 3.9+), then check it is the
        # one the facts saw; the signal then cannot reach a newcomer with the same PID
        fd = None
        if hasattr(os, "pidfd_open"):
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                gone.append(pid)
                continue
            except OSError:
                fd = None
        if start_time(pid) != want.get("start") or cmdline(pid) != want.get("cmdline"):
            if fd is not None:
                os.close(fd)
            gone.append(pid)
            continue
        handles[pid] = fd
        pids.append(pid)

    def send(pid: int, sig: int) -> None:
        fd = handles.get(pid)
        with contextlib.suppress(ProcessLookupError):
            if fd is not None and hasattr(signal, "pidfd_send_signal"):
                signal.pidfd_send_signal(fd, sig)
            else:
                os.kill(pid, sig)

    try:
        for pid in pids:
            send(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        alive = pids
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [p for p in alive if start_time(p) == expect[str(p)].get("start")]
        for pid in alive:
            send(pid, signal.SIGKILL)
    finally:
        for fd in handles.values():
            if fd is not None:
                os.close(fd)
    return {"ok": True, "killed": pids, "forced": alive, "gone": gone}


STARTS = ("start", "restart", "try-restart", "reload-or-restart")


def _systemctl(args: List[str]) -> Json:
    code, out = run(["systemctl"] + args, timeout=300)
    res: Json = {"ok": code == 0, "error": out if code else None}
    if code and args and args[0] in STARTS:
        res["tail"] = systemd_account(args[-1])
    return res


def systemd_account(unit: str, lines: int = 8) -> str:
    """Why systemd says a start failed, in its own words: the unit's result and exit status,
    then systemd's last lines about it ("Main process exited, code=exited,
    status=219/CGROUP", "Failed at step EXEC spawning ..."). Only systemd's lines: UNIT=
    from the process whose _PID (a field journald sets, no client can) is 1. UNIT= alone
    is a field any client may send: the service's own output, which can hold what the
    operator keeps secret, or lines it forges to look like systemd's."""
    _, show = run(["systemctl", "show", unit, "-p", "Result", "-p", "ExecMainCode",
                   "-p", "ExecMainStatus"], timeout=60)
    _, said = run(["journalctl", "--no-pager", "-o", "cat", "-n", str(lines),
                   "_PID=1", "UNIT=%s" % unit], timeout=60)
    account = ["  systemd: %s" % " ".join(show.split())] if show else []
    account += ["  | %s" % ln for ln in said.splitlines() if ln.strip()
                and not ln.startswith("-- ")]
    return "\n".join(account)


def _restart(unit: str) -> Json:
    # clears a start-limit hit left by an earlier crash loop, then restarts
    run(["systemctl", "reset-failed", unit], timeout=60)
    return _systemctl(["restart", unit])


def _write(paths: Dict[str, str], key: str, action: Json) -> Json:
    write_atomic(paths[key], action["content"], int(action["mode"], 8))
    return {"ok": True}


def _write_file(action: Json, paths: Dict[str, str]) -> Json:
    """A user role's file: atomic, with its mode and owner (`user` or `user:group`)."""
    user, _, group = action["owner"].partition(":")
    try:
        pw = pwd.getpwnam(user)
        gid = grp.getgrnam(group).gr_gid if group else pw.pw_gid
    except KeyError:
        return {"ok": False, "error": "no user or group %s on the host" % action["owner"]}
    write_atomic(action["path"], action["content"], int(action["mode"], 8), (pw.pw_uid, gid))
    with contextlib.suppress(OSError):  # unrecorded: the next --check shows hashes only
        record_written(action["path"], action["content"])
    return {"ok": True}


def _backup(action: Json, paths: Dict[str, str]) -> Json:
    backup_release(paths, action.get("files"))
    return {"ok": True}


def _switch(action: Json, paths: Dict[str, str]) -> Json:
    switch_link(paths["current"], action.get("target") or paths["env_dir"])
    return {"ok": True}


def _mark(action: Json, paths: Dict[str, str]) -> Json:
    write_atomic(os.path.join(action["env_dir"], ".vigil-complete"),
                 json.dumps(action.get("packages")), 0o644)
    return {"ok": True}


# One applier per action kind, each (action, release paths) -> result. A new kind is one
# entry here and one in vigil/deploy/plan.py.
Applier = Callable[[Json, Dict[str, str]], Json]
APPLIERS: Dict[str, Applier] = {
    "install_env": lambda a, p: install_env(a),
    "backup": _backup,
    "switch_env": _switch,
    "mark_env": _mark,
    "discard_env": lambda a, p: remove_envs({"paths": [a["env_dir"]]}, p),
    "remove_envs": remove_envs,
    "kill": lambda a, p: kill_pids(a),
    "write_unit": lambda a, p: _write(p, "unit", a),
    "write_env": lambda a, p: _write(p, "env", a),
    "restart": lambda a, p: _restart(a["unit"]),
    "systemctl": lambda a, p: _systemctl(a["args"]),
    "write_file": _write_file,
    "seed_cache": seed,
}


def apply(req: Json) -> Json:
    paths = req["paths"]
    results: List[Json] = []
    for action in req["actions"]:
        kind = str(action.get("kind")) if isinstance(action, dict) else "?"
        applier = APPLIERS.get(kind)
        try:
            if not isinstance(action, dict):
                raise ValueError("an action is a JSON object, got %r" % (action,))
            if "env_dir" in action and env_child(action["env_dir"], paths) is None:
                raise ValueError("env_dir %r is not under %s" % (
                    action["env_dir"], os.path.dirname(paths["env_dir"])))
            res = applier(action, paths) if applier else {
                "ok": False, "error": "unknown action %s" % kind}
        except PermissionError as exc:
            res = {"ok": False, "error": "permission denied: %s" % exc.filename,
                   "permission": True}
        except OSError as exc:
            res = {"ok": False, "error": "%s: %s" % (exc.strerror, exc.filename)}
        except Exception as exc:  # a malformed action: say so, keep what was done
            res = {"ok": False, "malformed": True,
                   "error": "malformed %s action: %s" % (kind, _err(exc))}
        res["kind"] = kind
        results.append(res)
        if not res["ok"]:
            break
    return {"results": results}


def rollback(req: Json) -> Json:
    paths = req["paths"]
    bdir = paths["backup_dir"]
    if not os.path.isdir(bdir):
        return {"ok": False, "error": "no previous release kept in %s" % bdir}
    # Swap: the release being rolled back becomes the backup, so a second rollback undoes it.
    restore = {name: read_text(os.path.join(bdir, name)) for name in RELEASE_FILES}
    link = read_text(os.path.join(bdir, "current"))
    kept = kept_role_files(bdir)  # read before the swap replaces the backup directory
    backup_release(paths, kept)
    for name in RELEASE_FILES:
        if isinstance(restore[name], str):
            write_atomic(paths[name], restore[name], 0o600 if name == "env" else 0o644)
    if isinstance(link, str) and os.path.isdir(link):
        switch_link(paths["current"], link)
    restored_files = restore_role_files(kept)
    restarts = [["restart", req["unit"]]] + [
        ["try-restart", u] for u in dict.fromkeys(f["restart"] for f in kept if f["restart"])]
    for args in [["daemon-reload"], ["reset-failed", req["unit"]]] + restarts:
        code, out = run(["systemctl"] + args, timeout=300)
        if code != 0 and args[0] != "reset-failed":
            return {"ok": False, "error": "systemctl %s: %s" % (" ".join(args), out)}
    return {"ok": True, "restored": [n for n in RELEASE_FILES if restore[n]] + restored_files,
            "env": link if isinstance(link, str) else None}


def kept_role_files(bdir: str) -> List[Json]:
    """The kept user-role files with their text (None: the file did not exist)."""
    text = read_text(os.path.join(bdir, ROLE_FILES))
    kept = list(json.loads(text)) if isinstance(text, str) else []
    for f in kept:
        f["text"] = read_text(os.path.join(bdir, f["saved"])) if f["saved"] else None
    # a kept copy that cannot be read is left alone, never taken for "absent before"
    return [f for f in kept if f["saved"] is None or isinstance(f["text"], str)]


def restore_role_files(kept: List[Json]) -> List[str]:
    """Put each kept user-role file back as it was (absent before: removed again)."""
    restored = []
    for f in kept:
        if f.get("kind"):
            continue  # not a file nor a link when kept: left as it is
        restored.append(f["path"])
        if f.get("link") is not None:
            switch_link(f["path"], f["link"])  # the kept link back, atomically
        elif f["text"] is None:
            directory, name = _split(f["path"])
            with contextlib.suppress(FileNotFoundError):
                dfd = open_dir(directory)
                try:
                    os.unlink(name, dir_fd=dfd)
                finally:
                    os.close(dfd)
        else:
            write_atomic(f["path"], f["text"], f["mode"], (f["uid"], f["gid"]))
            with contextlib.suppress(OSError):
                record_written(f["path"], f["text"])
    return restored


def status(req: Json) -> Json:
    """Unit state, uptime, the ExecStart line of the unit file and /health."""
    service = systemctl_show(req["unit"])
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    since = _int(service.get("ActiveEnterTimestampMonotonic")) / 1e6
    unit = read_text(req["unit_path"])
    exec_start = ""
    if isinstance(unit, str):
        # lines end at \n only, as systemd reads them (not at U+2028 inside a value)
        exec_start = next((line[10:] for line in unit.split("\n")
                           if line.startswith("ExecStart=")), "")
    health = None
    if service.get("ActiveState") == "active":
        health = get_health(req["port"])["status"]
    return {"service": service, "uptime_s": uptime - since if since else None,
            "exec_start": exec_start, "health": health}
