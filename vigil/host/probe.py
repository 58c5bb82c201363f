"""``probe``: one poll of a starting service (unit, journal, processes, GPUs, caches, HTTP).

Part of the host agent (joined into one script by vigil/host/payload.py): stdlib only,
Python 3.8+.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
import time
from typing import Any, Dict, List, Optional

from vigil.host.common import (
    CMD_TIMEOUT,
    Json,
    _err,
    _int,
    bearer,
    cmdline,
    get_health,
    http,
    read_text,
    service_pids,
    systemctl_show,
)
from vigil.host.facts import _NVML, smi_facts, smi_rows

# -- probe: one snapshot of a starting service (the watcher's one round trip per poll) --

MAX_CACHE_ENTRIES = 200000  # bounds the probe's cost on a huge cache


def unit_state(unit: str) -> Json:
    kv = systemctl_show(unit)
    if kv.get("error"):
        return {"name": unit, "error": kv["error"]}
    start_us = _int(kv.get("ExecMainStartTimestampMonotonic", "0"))
    epoch = None
    if start_us > 0:
        # Same clock as systemd's monotonic stamps: map the start onto the epoch.
        epoch = time.time() - (time.clock_gettime(time.CLOCK_MONOTONIC) - start_us / 1e6)
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


def _message(value: Any) -> Optional[str]:
    # journald gives non-UTF-8 or binary messages as a list of byte values.
    if isinstance(value, list):
        return bytes(int(b) & 0xFF for b in value).decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    return None


def _other_start(rec: Json, invocation: Optional[str], since_us: int) -> bool:
    """A line of an earlier run of the unit. `--since` has whole seconds, and a restart
    puts the old run's shutdown lines (EngineDeadError, ...) in the same second as the new
    start: match journald's invocation id, else the exact start time."""
    inv = rec.get("_SYSTEMD_INVOCATION_ID") or rec.get("INVOCATION_ID")
    if invocation and inv:
        return bool(inv != invocation)
    return since_us > 0 and _int(rec.get("__REALTIME_TIMESTAMP", "0")) < since_us


def journal_argv(unit: str, cursor: Optional[str], max_lines: int,
                 since_epoch: Optional[float]) -> List[str]:
    """journalctl for the unit's lines after the cursor, else this start's last lines."""
    argv = ["journalctl", "-u", unit, "-o", "json", "--no-pager"]
    if cursor:
        argv += ["--after-cursor", cursor]
    else:
        argv += ["-n", str(max_lines)]
        if since_epoch:
            argv += ["--since", "@%d" % int(since_epoch)]
    return argv


def journal(unit: str, cursor: Optional[str], max_lines: int,
            since_epoch: Optional[float], invocation: Optional[str] = None) -> Json:
    argv = journal_argv(unit, cursor, max_lines, since_epoch)
    lines: List[Json] = []
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
        err = "journalctl: %s" % proc.stderr.read().decode("utf-8", "replace").strip()[:300]
    return {"lines": lines, "cursor": new_cursor, "truncated": truncated, "error": err}


def proc_info(pid: int) -> Optional[Json]:
    """One /proc entry; None when the process is gone."""
    stat = read_text("/proc/%d/stat" % pid)
    if not isinstance(stat, str):
        return None
    comm = stat[stat.find("(") + 1:stat.rfind(")")]
    rest = stat[stat.rfind(")") + 2:].split()
    ticks = float(os.sysconf("SC_CLK_TCK"))
    rss = 0
    statm = read_text("/proc/%d/statm" % pid)
    if isinstance(statm, str) and len(statm.split()) > 1:
        rss = _int(statm.split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {
        "pid": pid,
        "ppid": _int(rest[1]),
        "comm": comm,
        "cmdline": (cmdline(pid) or "")[:300],
        "state": rest[0],
        "cpu_s": (_int(rest[11]) + _int(rest[12])) / ticks,
        "rss_bytes": rss,
    }


def processes(control_group: str, main_pid: int) -> Json:
    try:
        pids, source = service_pids(control_group, main_pid)
        items = [info for info in (proc_info(p) for p in pids) if info is not None]
        return {"source": source, "items": items, "error": None}
    except Exception as exc:
        return {"source": "none", "items": [], "error": _err(exc)}


def probe_gpus(no_nvml: bool) -> Optional[Json]:
    """Memory per GPU: NVML in-process (the probe runs on the environment's python), else
    nvidia-smi, else None (a CPU host)."""
    read = None if no_nvml else _NVML["nvml_read"]()
    if read is not None and "error" not in read:
        return {"source": "nvml", "error": None, "devices": [
            {"index": g["index"], "name": str(g["name"]),
             "memory_used_mib": g["memory_used"] / 1048576.0,
             "memory_total_mib": g["memory_total"] / 1048576.0,
             "processes": [{"pid": int(p["pid"]), "used_mib": (p["used_memory"] or 0) / 1048576.0}
                           for p in g["processes"]]} for g in read["gpus"]]}
    smi = smi_facts()  # the one nvidia-smi query of the facts, read by field name
    if not smi:
        return None
    if smi.get("smi_gpus") is None:
        return {"source": "nvidia-smi", "devices": [], "error": smi.get("smi_error")}
    try:
        by_uuid: Dict[str, Json] = {}
        devices = []
        for r in smi_table(smi["smi_gpus"]):
            d = {"index": _int(r["index"]), "name": r["name"],
                 "memory_total_mib": _mib(r["memory.total"]),
                 "memory_used_mib": _mib(r["memory.used"]), "processes": []}
            by_uuid[r["uuid"]] = d
            devices.append(d)
        apps = smi_rows(smi.get("smi_apps"))
        head = [h.split(" [", 1)[0] for h in (apps[0] if apps else [])]
        for a in apps[1:]:
            # uuid and pid come before process_name (which may hold commas); the memory last
            app = dict((h, a[i]) for i, h in enumerate(head) if i < len(a))
            if app.get("gpu_uuid") in by_uuid:
                by_uuid[app["gpu_uuid"]]["processes"].append(
                    {"pid": _int(app.get("pid")), "used_mib": _mib(a[-1])})
        return {"source": "nvidia-smi", "devices": devices, "error": None}
    except (KeyError, ValueError) as exc:
        return {"source": "nvidia-smi", "devices": [], "error": _err(exc)}


def smi_table(text: Optional[str]) -> List[Dict[str, str]]:
    """CSV with headers (`--format=csv`) as one dict per row, keyed by the field name."""
    rows = smi_rows(text)
    if not rows:
        return []
    head = [h.split(" [", 1)[0] for h in rows[0]]
    return [dict((h, r[i]) for i, h in enumerate(head) if i < len(r)) for r in rows[1:]]


def _mib(value: str) -> float:
    """"81559 MiB" -> 81559.0; "[N/A]" (WDDM, some MIG readings) -> 0."""
    word = value.split(" ", 1)[0]
    return float(word) if word[:1].isdigit() else 0.0


def walk_dir(path: str) -> Json:
    out: Json = {"path": path, "exists": os.path.isdir(path), "bytes": 0, "files": 0,
                 "newest_mtime": None, "oldest_mtime": None, "truncated": False,
                 "error": None}
    if not out["exists"]:
        return out
    seen = 0
    newest: Optional[float] = None
    oldest: Optional[float] = None  # files older than the start: the cache was warm
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


def cache_dirs(user: Optional[str], extra: List[str]) -> List[str]:
    if extra:
        return extra
    home = os.path.expanduser("~")
    if user:
        with contextlib.suppress(KeyError):
            home = pwd.getpwnam(user).pw_dir
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "vllm")
    name = user or pwd.getpwuid(os.getuid()).pw_name
    return [os.path.join(root, "torch_compile_cache"), "/tmp/torchinductor_%s" % name]


def cache(user: Optional[str], extra: List[str]) -> Json:
    try:
        return {"dirs": [walk_dir(d) for d in cache_dirs(user, extra)], "error": None}
    except Exception as exc:
        return {"dirs": [], "error": _err(exc)}


# -- starvation: the tree waiting for CPU it is not given (a quota, a loaded host) --------
# Each fact is a read and a pure parser of the kernel's text. The reducer compares two
# polls' counters: a quiet tree that the host starves is slow, not stalled.


def parse_cpu_stat(text: Optional[str]) -> Optional[Json]:
    """A cgroup's cpu.stat as vigil's counters. v2: ``usage_usec``, ``nr_periods``,
    ``nr_throttled``, ``throttled_usec``; v1 (the cpu controller): ``nr_periods``,
    ``nr_throttled``, ``throttled_time`` in ns. None when there is no such counter."""
    if not isinstance(text, str):
        return None
    kv: Dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            kv[parts[0]] = int(parts[1])
    out: Json = {}
    if "nr_periods" in kv and "nr_throttled" in kv:
        out["nr_periods"] = kv["nr_periods"]
        out["nr_throttled"] = kv["nr_throttled"]
    if "throttled_usec" in kv:
        out["throttled_us"] = kv["throttled_usec"]
    elif "throttled_time" in kv:
        out["throttled_us"] = kv["throttled_time"] // 1000
    if "usage_usec" in kv:
        out["usage_us"] = kv["usage_usec"]
    return out or None


def parse_pressure(text: Optional[str]) -> Optional[int]:
    """PSI (``/proc/pressure/cpu``, a cgroup's ``cpu.pressure``): the ``some`` line's
    ``total=`` (us during which at least one runnable task waited for a CPU)."""
    if not isinstance(text, str):
        return None
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "some":
            for field in parts[1:]:
                if field.startswith("total=") and field[6:].isdigit():
                    return int(field[6:])
    return None


def parse_proc_stat(text: Optional[str]) -> Optional[Json]:
    """/proc/stat's aggregate ``cpu`` line: steal ticks (time a hypervisor ran someone
    else on this guest's CPUs) and all ticks (user to steal; guest time is inside user)."""
    if not isinstance(text, str):
        return None
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu" and len(parts) >= 9 \
                and all(p.isdigit() for p in parts[1:9]):
            ticks = [int(p) for p in parts[1:9]]
            return {"steal_ticks": ticks[7], "total_ticks": sum(ticks)}
    return None


def cgroup_cpu_dirs(control_group: str) -> List[Any]:
    """Where the unit's CPU accounting lives: v2 (unified, or hybrid's unified tree),
    then v1's cpu controller (mounted as cpu,cpuacct or cpu)."""
    if not control_group:
        return []
    return [("v2", "/sys/fs/cgroup" + control_group),
            ("v2", "/sys/fs/cgroup/unified" + control_group),
            ("v1", "/sys/fs/cgroup/cpu,cpuacct" + control_group),
            ("v1", "/sys/fs/cgroup/cpu" + control_group)]


def cpu_load(control_group: str) -> Json:
    """The unit's cgroup throttling and CPU pressure, the host's CPU pressure and steal."""
    out: Json = {"cgroup": "", "error": None}
    try:
        for version, d in cgroup_cpu_dirs(control_group):
            stat = parse_cpu_stat(read_text(os.path.join(d, "cpu.stat")))
            if stat is None or (version == "v2" and "nr_periods" not in stat
                                and "usage_us" not in stat):
                continue
            out["cgroup"] = version
            out.update(stat)
            if version == "v1" and "usage_us" not in stat:
                usage = read_text(os.path.join(d, "cpuacct.usage"))
                if isinstance(usage, str) and usage.strip().isdigit():
                    out["usage_us"] = int(usage.strip()) // 1000
            pressure = parse_pressure(read_text(os.path.join(d, "cpu.pressure")))
            if pressure is not None:
                out["pressure_some_us"] = pressure
            break
        host = parse_pressure(read_text("/proc/pressure/cpu"))
        if host is not None:
            out["host_pressure_some_us"] = host
        ticks = parse_proc_stat(read_text("/proc/stat"))
        if ticks is not None:
            out.update(ticks)
    except Exception as exc:
        out["error"] = _err(exc)
    return out


def http_state(port: int, api_key: Optional[str]) -> Json:
    h = get_health(port)
    out: Json = {"health_status": h["status"], "health_error": h["error"], "models": None,
                 "models_error": None}
    if h["status"] is None:
        out["models_error"] = "not queried: /health did not answer"
        return out
    m = http(port, "/v1/models", headers=bearer(api_key), timeout=2.0, limit=1 << 20)
    if m["status"] == 200:
        try:
            out["models"] = [str(x.get("id")) for x in json.loads(m["body"]).get("data", [])]
        except Exception as exc:
            out["models_error"] = _err(exc)
    else:
        out["models_error"] = m["error"] or "HTTP %s" % m["status"]
    return out


def probe(req: Json) -> Json:
    """One snapshot (parsed by vigil.verify.snapshot.Snapshot). Never fails as a whole:
    each part that fails carries an `error` instead."""
    try:
        snap: Json = {"v": 1, "time": time.time(), "errors": []}
        main_pid = _int(req.get("pid"))
        cgroup = ""
        if req.get("unit"):
            unit = unit_state(req["unit"])
            snap["unit"] = unit
            main_pid = main_pid or _int(unit.get("main_pid"))
            cgroup = str(unit.get("control_group") or "")
            snap["journal"] = journal(req["unit"], req.get("cursor"),
                                      _int(req.get("max_lines"), 2000),
                                      unit.get("exec_main_start_epoch"),
                                      str(unit.get("invocation_id") or "") or None)
        snap["processes"] = processes(cgroup, main_pid)
        snap["cpu_load"] = cpu_load(cgroup)
        snap["gpus"] = probe_gpus(bool(req.get("no_nvml")))
        snap["cache"] = cache(req.get("user"), list(req.get("cache_dirs") or []))
        port = _int(req.get("port"))
        if port > 0:
            snap["http"] = http_state(port, req.get("api_key"))
        return snap
    except Exception as exc:  # still a snapshot, never a traceback
        return {"v": 1, "time": time.time(), "errors": [_err(exc)]}
