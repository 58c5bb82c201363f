"""``stream``: follow a starting service, one JSON line per event, until stdin closes.

Part of the host agent (joined into one script by vigil/host/payload.py): stdlib only,
Python 3.8+.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import time
from typing import List, Optional

from vigil.host.common import Json, _err, _int
from vigil.host.probe import (
    _message,
    _other_start,
    cache,
    http_state,
    journal_argv,
    probe_gpus,
    processes,
    unit_state,
)

# -- stream: the watcher's persistent channel (one snapshot per event and per second) ---

STREAM_BATCH_S = 0.05  # lines arriving together go out in one snapshot
STREAM_PID_CHECK_S = 0.2  # how often the service's processes are checked for an exit
SYSTEMD_COMMS = ("systemd",)
# The access-log line of the stream's own /health and /v1/models requests: it rides with
# the next snapshot but wakes none (else each snapshot's request logs the next one's news).
OWN_REQUEST = re.compile(r'127\.0\.0\.1:\d+ - "GET /(?:health|v1/models) HTTP/')


def wakes(line: Json) -> bool:
    """Whether a followed line is news that sends a snapshot at once."""
    return not OWN_REQUEST.search(str(line.get("text", "")))


def _die_with_parent() -> None:
    """journalctl -f must not outlive the stream (a killed stream leaves no orphan)."""
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _journal_record(rec: Json, catch_up_us: int, invocation: Optional[str],
                    since_us: int) -> List[Json]:
    """One journal record as the stream's lines (each carries the record's cursor `c`).
    Without a cursor, the lines written before the stream began are filtered as the probe
    filters them (an earlier run's); followed lines never are (a restart's are news)."""
    text = _message(rec.get("MESSAGE"))
    us = _int(rec.get("__REALTIME_TIMESTAMP", "0"))
    if text is None or (us < catch_up_us and _other_start(rec, invocation, since_us)):
        return []
    c = rec.get("__CURSOR")
    return [{"us": us, "text": part, "c": c} for part in (text.splitlines() or [""])]


def _from_systemd(rec: Json) -> bool:
    return rec.get("_PID") == "1" or rec.get("_COMM") in SYSTEMD_COMMS


def stream(req: Json, inp: int = 0, out: int = 1) -> int:
    """Follow the unit: one JSON line per event (new journal lines, a systemd line about
    the unit, a process of the service exiting) and a full snapshot every `interval_s`.
    Each line is {"k": "hello"|"snap"|"error", ...}; a snapshot's journal lines carry their
    record's cursor so the watcher can resume after a dropped channel and drop repeats.
    Ends when stdin closes (the channel dropped) or stdout breaks: no orphan on the host."""
    unit = str(req["unit"])
    interval = max(float(req.get("interval_s") or 1.0), 0.1)
    cursor = req.get("cursor") or None
    max_lines = _int(req.get("max_lines"), 2000)
    port = _int(req.get("port"))
    user = req.get("user")
    dirs = list(req.get("cache_dirs") or [])
    no_nvml = bool(req.get("no_nvml"))

    def emit(obj: Json) -> None:
        data = (json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(out, data):]

    u = unit_state(unit)
    argv = journal_argv(unit, cursor, max_lines, u.get("exec_main_start_epoch")) + ["-f"]
    invocation = str(u.get("invocation_id") or "") or None
    since_us = int((u.get("exec_main_start_epoch") or 0) * 1e6)
    catch_up_us = 0 if cursor else int(time.time() * 1e6)
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)
    except Exception as exc:
        emit({"k": "error", "error": "journalctl: %s" % _err(exc)})
        return 1
    assert proc.stdout is not None
    jfd = proc.stdout.fileno()
    slow: Json = {}  # the parts read only at the steady cadence (GPU, compile cache)
    pending: List[Json] = []
    news = False  # a line in `pending` that wakes the stream (not only its own echoes)
    pending_since = 0.0
    buf = b""
    last_cursor = cursor
    pids: List[int] = []
    force = True
    next_tick = 0.0
    next_pid_check = 0.0
    try:
        emit({"k": "hello", "v": 1, "pid": os.getpid()})
        while True:
            now = time.monotonic()
            wait = min(next_tick, next_pid_check) - now
            if news:
                wait = min(wait, pending_since + STREAM_BATCH_S - now)
            ready, _, _ = select.select([inp, jfd], [], [], max(wait, 0.0))
            if inp in ready and not os.read(inp, 4096):
                return 0  # the channel closed
            if jfd in ready:
                chunk = os.read(jfd, 1 << 16)
                if not chunk:
                    emit({"k": "error", "error": "journalctl -f ended (exit %s)"
                          % proc.wait()})
                    return 1
                buf += chunk
                *records, buf = buf.split(b"\n")
                for raw in records:
                    try:
                        rec = json.loads(raw)
                    except ValueError:
                        continue
                    lines = _journal_record(rec, catch_up_us, invocation, since_us)
                    if not news and any(wakes(x) for x in lines):
                        news, pending_since = True, time.monotonic()
                    pending += lines
                    last_cursor = rec.get("__CURSOR", last_cursor)
                    force = force or _from_systemd(rec)
            now = time.monotonic()
            if now >= next_pid_check:
                next_pid_check = now + STREAM_PID_CHECK_S
                if any(not os.path.exists("/proc/%d" % p) for p in pids):
                    force = True  # a process of the service exited
            tick = now >= next_tick
            if not (tick or force or (news and now - pending_since >= STREAM_BATCH_S)):
                continue
            u = unit_state(unit)
            snap: Json = {"v": 1, "time": time.time(), "errors": [], "unit": u}
            snap["journal"] = {"lines": pending, "cursor": last_cursor, "truncated": False,
                               "error": None}
            snap["processes"] = processes(str(u.get("control_group") or ""),
                                          _int(u.get("main_pid")))
            pids = [p["pid"] for p in snap["processes"]["items"]]
            if tick or not slow:
                slow = {"gpus": probe_gpus(no_nvml), "cache": cache(user, dirs)}
                next_tick = now + interval
            snap.update(slow)
            if port > 0:
                snap["http"] = http_state(port, req.get("api_key"))
            emit({"k": "snap", "snap": snap})
            pending, force, news = [], False, False
    except OSError:
        return 0  # stdout broke: the channel is gone
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def stream_main(inp: int = 0, out: int = 1) -> int:
    """The stream's request is the first line on stdin; the rest of stdin stays open as the
    channel's life line."""
    buf = b""
    while b"\n" not in buf:
        chunk = os.read(inp, 4096)
        if not chunk:
            break
        buf += chunk
    try:
        request = json.loads(buf.split(b"\n", 1)[0] or b"{}")
        if not isinstance(request, dict) or not request.get("unit"):
            raise ValueError("the request is not a JSON object with a unit")
    except Exception as exc:
        os.write(out, (json.dumps({"k": "error", "agent_error": "malformed stream request: %s"
                                   % _err(exc)}) + "\n").encode())
        return 2
    return stream(request, inp, out)
