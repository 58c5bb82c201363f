"""One snapshot of a vLLM service, printed as JSON. Runs ON the host.

Stdlib only and Python 3.8+: it is piped to the host's python over SSH
(`python3 - --unit vllm.service --port 8000 < probe.py`), so it imports nothing from
vigil. It never raises: each part that fails carries an `error` string instead.
The shape is parsed by `vigil.snapshot.Snapshot.from_json`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Dict  # noqa: UP035 - Python 3.8 on the hosts

CMD_TIMEOUT = 5.0
HTTP_TIMEOUT = 2.0
MAX_CACHE_ENTRIES = 200000  # bounds the probe's cost on a huge cache
Json = Dict[str, Any]  # noqa: UP006 - evaluated at runtime, and 3.8 lacks dict[...]


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _run(argv: list[str]) -> str:
    out = subprocess.run(
        argv, capture_output=True, timeout=CMD_TIMEOUT, check=False
    )
    if out.returncode != 0:
        msg = out.stderr.decode("utf-8", "replace").strip() or f"exit {out.returncode}"
        raise RuntimeError(f"{argv[0]}: {msg[:300]}")
    return out.stdout.decode("utf-8", "replace")


def _int(text: str, default: int = 0) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


def unit_state(unit: str) -> Json:
    props = "ActiveState,SubState,MainPID,NRestarts,ExecMainStatus," \
        "ExecMainStartTimestampMonotonic,ControlGroup,InvocationID"
    try:
        text = _run(["systemctl", "show", unit, "-p", props])
    except Exception as exc:  # any failure becomes the part's error
        return {"name": unit, "error": _err(exc)}
    kv = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    start_us = _int(kv.get("ExecMainStartTimestampMonotonic", "0"))
    epoch = None
    if start_us > 0:
        # Same clock as systemd's monotonic stamps: map the start onto the epoch.
        now_mono = time.clock_gettime(time.CLOCK_MONOTONIC)
        epoch = time.time() - (now_mono - start_us / 1e6)
    return {
        "name": unit,
        "active_state": kv.get("ActiveState", ""),
        "sub_state": kv.get("SubState", ""),
        "main_pid": _int(kv.get("MainPID", "0")),
        "n_restarts": _int(kv.get("NRestarts", "0")),
        "exec_main_status": _int(kv.get("ExecMainStatus", "0")),
        "exec_main_start_us": start_us,
        "exec_main_start_epoch": epoch,
        "control_group": kv.get("ControlGroup", ""),
        "invocation_id": kv.get("InvocationID", ""),
        "error": None,
    }


def _message(value: Any) -> str | None:
    # journald gives non-UTF-8 or binary messages as a list of byte values.
    if isinstance(value, list):
        return bytes(int(b) & 0xFF for b in value).decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    return None


def _other_start(rec: Json, invocation: str | None, since_us: int) -> bool:
    """A line of an earlier run of the unit. `--since` has whole seconds, and a restart
    puts the old run's shutdown lines (EngineDeadError, …) in the same second as the new
    start: match journald's invocation id, else the exact start time."""
    inv = rec.get("_SYSTEMD_INVOCATION_ID") or rec.get("INVOCATION_ID")
    if invocation and inv:
        return bool(inv != invocation)
    return since_us > 0 and _int(rec.get("__REALTIME_TIMESTAMP", "0")) < since_us


def journal(unit: str, cursor: str | None, max_lines: int,
            since_epoch: float | None, invocation: str | None = None) -> Json:
    argv = ["journalctl", "-u", unit, "-o", "json", "--no-pager"]
    if cursor:
        argv += ["--after-cursor", cursor]
    else:
        argv += ["-n", str(max_lines)]
        if since_epoch:
            argv += ["--since", f"@{int(since_epoch)}"]
    lines: list[Json] = []
    new_cursor = cursor
    truncated = False
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except Exception as exc:
        return {"lines": [], "cursor": cursor, "truncated": False, "error": _err(exc)}
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + CMD_TIMEOUT
        for raw in proc.stdout:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            text = _message(rec.get("MESSAGE"))
            if not cursor and _other_start(rec, invocation, int((since_epoch or 0) * 1e6)):
                text = None
            if text is not None:
                us = _int(rec.get("__REALTIME_TIMESTAMP", "0"))
                for part in text.splitlines() or [""]:
                    lines.append({"us": us, "text": part})
            new_cursor = rec.get("__CURSOR", new_cursor)
            if len(lines) >= max_lines or time.monotonic() > deadline:
                # Stop here; the cursor points at the last kept entry, the rest next poll.
                truncated = True
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    err = None
    if proc.returncode not in (0, None, -9) and not lines:
        assert proc.stderr is not None
        err = "journalctl: {}".format(proc.stderr.read().decode("utf-8", "replace").strip()[:300])
    return {"lines": lines, "cursor": new_cursor, "truncated": truncated, "error": err}


def _read(path: str) -> str:
    with open(path, "rb") as fh:
        return fh.read().decode("utf-8", "replace")


def proc_info(pid: int) -> Json | None:
    """One /proc entry; None when the process is gone."""
    try:
        stat = _read(f"/proc/{pid}/stat")
    except OSError:
        return None
    # comm may contain spaces and parens: split at the last ')'.
    lpar, rpar = stat.find("("), stat.rfind(")")
    comm = stat[lpar + 1:rpar]
    rest = stat[rpar + 2:].split()
    ticks = float(os.sysconf("SC_CLK_TCK"))
    rss = 0
    with contextlib.suppress(OSError, IndexError, ValueError):
        rss = int(_read(f"/proc/{pid}/statm").split()[1]) * os.sysconf("SC_PAGE_SIZE")
    cmdline = ""
    with contextlib.suppress(OSError):
        cmdline = _read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()[:300]
    return {
        "pid": pid,
        "ppid": _int(rest[1]),
        "comm": comm,
        "cmdline": cmdline,
        "state": rest[0],
        "cpu_s": (_int(rest[11]) + _int(rest[12])) / ticks,
        "rss_bytes": rss,
    }


def cgroup_pids(control_group: str) -> list[int] | None:
    """Every PID in the unit's cgroup and its sub-cgroups (v2, then v1's systemd tree)."""
    if not control_group:
        return None
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"):
        base = root + control_group
        if not os.path.isfile(os.path.join(base, "cgroup.procs")):
            continue
        pids: list[int] = []
        for dirpath, _dirs, files in os.walk(base):
            if "cgroup.procs" in files:
                try:
                    pids += [int(x) for x in _read(os.path.join(dirpath, "cgroup.procs")).split()]
                except (OSError, ValueError):
                    continue
        return sorted(set(pids))
    return None


def tree_pids(root: int) -> list[int]:
    """root and all its descendants, from /proc (ppid links)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = _read(f"/proc/{name}/stat")
        except OSError:
            continue
        ppid = _int(stat[stat.rfind(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(out)


def processes(control_group: str, main_pid: int) -> Json:
    try:
        pids = cgroup_pids(control_group)
        source = "cgroup"
        if not pids:
            if main_pid <= 0:
                return {"source": "none", "items": [], "error": None}
            pids, source = tree_pids(main_pid), "proc-tree"
        items = [info for info in (proc_info(p) for p in pids) if info is not None]
        return {"source": source, "items": items, "error": None}
    except Exception as exc:
        return {"source": "none", "items": [], "error": _err(exc)}


def gpus_nvml() -> Json | None:
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except Exception:  # absent or broken: try nvidia-smi
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: a CPU host, or try nvidia-smi
        return None
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            if isinstance(name, bytes):
                name = name.decode("utf-8", "replace")
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            procs = []
            try:
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                    used = p.usedGpuMemory
                    procs.append({"pid": int(p.pid),
                                  "used_mib": (used or 0) / 1048576.0})
            except Exception:  # some drivers refuse per-process info
                pass
            devices.append({"index": i, "name": str(name),
                            "memory_used_mib": mem.used / 1048576.0,
                            "memory_total_mib": mem.total / 1048576.0, "processes": procs})
        return {"source": "nvml", "devices": devices, "error": None}
    except Exception as exc:
        return {"source": "nvml", "devices": [], "error": _err(exc)}
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _csv(text: str) -> list[list[str]]:
    return [[c.strip() for c in ln.split(",")] for ln in text.splitlines() if ln.strip()]


def gpus_smi() -> Json | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        rows = _csv(_run([smi, "--query-gpu=index,name,memory.used,memory.total,uuid",
                          "--format=csv,noheader,nounits"]))
        by_uuid: dict[str, Json] = {}
        devices = []
        for r in rows:
            d = {"index": _int(r[0]), "name": r[1], "memory_used_mib": float(r[2]),
                 "memory_total_mib": float(r[3]), "processes": []}
            by_uuid[r[4]] = d
            devices.append(d)
        try:
            apps = _csv(_run([smi, "--query-compute-apps=gpu_uuid,pid,used_memory",
                              "--format=csv,noheader,nounits"]))
            for a in apps:
                if a[0] in by_uuid:
                    by_uuid[a[0]]["processes"].append(
                        {"pid": _int(a[1]), "used_mib": float(a[2]) if a[2][:1].isdigit() else 0.0}
                    )
        except Exception:  # per-process info is a bonus
            pass
        return {"source": "nvidia-smi", "devices": devices, "error": None}
    except Exception as exc:
        return {"source": "nvidia-smi", "devices": [], "error": _err(exc)}


def gpus(no_nvml: bool = False) -> Json | None:
    """NVML, else nvidia-smi, else None (a CPU host)."""
    found = None if no_nvml else gpus_nvml()
    return found if found is not None else gpus_smi()


def walk_dir(path: str) -> Json:
    out: Json = {"path": path, "exists": os.path.isdir(path), "bytes": 0, "files": 0,
                 "newest_mtime": None, "oldest_mtime": None, "truncated": False,
                 "error": None}
    if not out["exists"]:
        return out
    seen = 0
    newest: float | None = None
    oldest: float | None = None  # files older than the start: the cache was warm
    todo = [path]
    try:
        while todo:
            d = todo.pop()
            try:
                entries = list(os.scandir(d))
            except PermissionError as exc:
                out["error"] = _err(exc)
                continue
            for e in entries:
                seen += 1
                if seen > MAX_CACHE_ENTRIES:
                    out["truncated"] = True
                    todo = []
                    break
                try:
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        out["files"] += 1
                        out["bytes"] += st.st_size
                        if newest is None or st.st_mtime > newest:
                            newest = st.st_mtime
                        if oldest is None or st.st_mtime < oldest:
                            oldest = st.st_mtime
                except OSError:
                    continue  # a file vanished mid-walk: inductor renames temp files
    except Exception as exc:
        out["error"] = _err(exc)
    out["newest_mtime"] = newest
    out["oldest_mtime"] = oldest
    return out


def cache_dirs(user: str | None, extra: list[str]) -> list[str]:
    if extra:
        return extra
    home = os.path.expanduser("~")
    if user:
        with contextlib.suppress(KeyError):
            home = pwd.getpwnam(user).pw_dir
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "vllm")
    name = user or pwd.getpwuid(os.getuid()).pw_name
    return [os.path.join(root, "torch_compile_cache"), f"/tmp/torchinductor_{name}"]


def cache(user: str | None, extra: list[str]) -> Json:
    try:
        return {"dirs": [walk_dir(d) for d in cache_dirs(user, extra)], "error": None}
    except Exception as exc:
        return {"dirs": [], "error": _err(exc)}


def _get(url: str, token: str | None) -> tuple[int | None, bytes | None, str | None]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
            return int(resp.status), resp.read(1 << 20), None
    except urllib.error.HTTPError as exc:
        return int(exc.code), None, None
    except Exception as exc:  # refused, timeout, reset: all "not up"
        reason = getattr(exc, "reason", exc)
        return None, None, f"{reason}"


def http(port: int, host: str, token: str | None) -> Json:
    base = f"http://{host}:{port}"
    status, _body, err = _get(base + "/health", None)
    out: Json = {"health_status": status, "health_error": err, "models": None,
                 "models_error": None}
    if status is None:
        out["models_error"] = "not queried: /health did not answer"
        return out
    mstatus, body, merr = _get(base + "/v1/models", token)
    if mstatus == 200 and body is not None:
        try:
            out["models"] = [str(m.get("id")) for m in json.loads(body).get("data", [])]
        except Exception as exc:
            out["models_error"] = _err(exc)
    else:
        out["models_error"] = merr or f"HTTP {mstatus}"
    return out


def snapshot(args: argparse.Namespace) -> Json:
    snap: Json = {"v": 1, "time": time.time(), "errors": []}
    main_pid = args.pid or 0
    cgroup = ""
    since = None
    if args.unit:
        unit = unit_state(args.unit)
        snap["unit"] = unit
        main_pid = main_pid or int(unit.get("main_pid") or 0)
        cgroup = str(unit.get("control_group") or "")
        since = unit.get("exec_main_start_epoch")
        snap["journal"] = journal(args.unit, args.cursor, args.max_lines, since,
                                  str(unit.get("invocation_id") or "") or None)
    snap["processes"] = processes(cgroup, main_pid)
    snap["gpus"] = gpus(args.no_nvml)
    snap["cache"] = cache(args.user, args.cache_dir or [])
    if args.port:
        token = os.environ.get(args.api_key_env) if args.api_key_env else None
        snap["http"] = http(args.port, args.host, token)
    return snap


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--unit", help="systemd unit (omit to probe a bare process tree)")
    p.add_argument("--pid", type=int, default=0, help="root PID when there is no unit")
    p.add_argument("--cursor", help="journal cursor from the previous poll")
    p.add_argument("--max-lines", type=int, default=2000)
    p.add_argument("--port", type=int, default=0, help="vLLM port on 127.0.0.1 (0: skip)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--cache-dir", action="append", help="compile cache dir (repeatable)")
    p.add_argument("--user", help="service user: its ~/.cache and /tmp/torchinductor_USER")
    p.add_argument("--api-key-env", help="env var holding the API key for /v1/models")
    p.add_argument("--no-nvml", action="store_true", help="skip pynvml (tests)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        snap = snapshot(args)
    except Exception as exc:  # still print a snapshot, never a traceback
        snap = {"v": 1, "time": time.time(), "errors": [_err(exc)]}
    sys.stdout.write(json.dumps(snap) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
