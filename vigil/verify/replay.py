"""Replay a recorded trace or a plain vLLM log through the same pure reducer.

Inputs, detected by content:
- a trace: JSONL, one `Snapshot` per line (what `verify` writes);
- a `journalctl -o json` export: JSONL with MESSAGE and __REALTIME_TIMESTAMP;
- a plain log: a file or `journalctl` text dump, optionally with short prefixes
  (`Nov 29 10:01:02 host python[123]: `, `-o short-iso`, `-o short-precise`).

A plain log has only lines, so snapshots are synthesised from the log's own timestamps
(one per distinct second) and the reducer runs with `log_only`: no stall can be proven,
and `Application startup complete.` with no fatal error after it stands in for
/health + a completion. The result says so in `note`.
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from vigil.errors import ConfigError
from vigil.verify import reducer
from vigil.verify.budgets import Budgets
from vigil.verify.snapshot import Journal, LogLine, Snapshot

_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}

# journalctl short / short-precise: "Nov 29 10:01:02[.123456] host ident[pid]: "
_SHORT = re.compile(
    r"^(?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)"
    r"(?:\.(?P<frac>\d+))? \S+ [^\s:]+(?:\[\d+\])?: ?"
)
# journalctl short-iso(-precise): "2025-11-29T10:01:02[.123456]+0000 host ident[pid]: "
_ISO = re.compile(
    r"^(?P<y>\d{4})-(?P<mo>\d\d)-(?P<day>\d\d)T(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)"
    r"(?:\.(?P<frac>\d+))?(?:[+-]\d\d:?\d\d|Z)? \S+ [^\s:]+(?:\[\d+\])?: ?"
)
# vLLM's own stamp (no year): "INFO 11-29 10:01:02"
_VLLM = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<mo>\d\d)-(?P<day>\d\d) "
    r"(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)"
)

DEFAULT_YEAR = 2000  # logs carry no year; durations are all that matter (leap year: Feb 29)


def _epoch(year: int, month: int, day: int, h: int, m: int, s: int, frac: str | None) -> float:
    try:
        base = calendar.timegm((year, month, day, h, m, s, 0, 0, 0))
    except (ValueError, OverflowError):
        return -1.0
    return base + (float(f"0.{frac}") if frac else 0.0)


def split_log_line(raw: str, *, year: int = DEFAULT_YEAR) -> tuple[float | None, str]:
    """(epoch seconds or None, text without any journal prefix)."""
    m = _ISO.match(raw)
    if m:
        t = _epoch(int(m["y"]), int(m["mo"]), int(m["day"]), int(m["h"]), int(m["m"]),
                   int(m["s"]), m["frac"])
        return (t if t >= 0 else None), raw[m.end():]
    m = _SHORT.match(raw)
    if m and m["mon"] in _MONTHS:
        t = _epoch(year, _MONTHS[m["mon"]], int(m["day"]), int(m["h"]), int(m["m"]),
                   int(m["s"]), m["frac"])
        return (t if t >= 0 else None), raw[m.end():]
    v = _VLLM.search(raw)
    if v:
        t = _epoch(year, int(v["mo"]), int(v["day"]), int(v["h"]), int(v["m"]), int(v["s"]),
                   None)
        return (t if t >= 0 else None), raw
    return None, raw


def snapshots_from_log(lines: Iterable[str], *, year: int = DEFAULT_YEAR) -> list[Snapshot]:
    """One snapshot per distinct second of the log; lines without a stamp (tracebacks,
    tqdm, uvicorn) take the time of the line before them."""
    groups: list[tuple[float, list[LogLine]]] = []
    last: float | None = None
    pending: list[str] = []  # lines before the first stamped line
    for raw in lines:
        raw = raw.rstrip("\n")
        if not raw.strip():
            continue
        t, text = split_log_line(raw, year=year)
        if t is not None:
            t = float(int(t))
            last = t if last is None else max(last, t)  # never backwards
        if last is None:
            pending.append(text)
            continue
        if pending:
            groups.append((last, [LogLine(us=int(last * 1e6), text=p) for p in pending]))
            pending = []
        if not groups or groups[-1][0] != last:
            groups.append((last, []))
        groups[-1][1].append(LogLine(us=int(last * 1e6), text=text))
    if pending:  # a log without a single timestamp: one snapshot at t=0
        groups.append((0.0, [LogLine(us=0, text=p) for p in pending]))
    return [Snapshot(time=t, journal=Journal(lines=tuple(ls))) for t, ls in groups]


def snapshots_from_journal_json(records: Iterable[dict[str, Any]]) -> list[Snapshot]:
    lines: list[str] = []
    for rec in records:
        msg = rec.get("MESSAGE")
        if isinstance(msg, list):
            msg = bytes(int(b) & 0xFF for b in msg).decode("utf-8", "replace")
        if not isinstance(msg, str):
            continue
        us = int(rec.get("__REALTIME_TIMESTAMP", 0) or 0)
        for part in msg.splitlines() or [""]:
            lines.append(f"{us}\t{part}")
    snaps: list[Snapshot] = []
    for entry in lines:
        us_s, text = entry.split("\t", 1)
        t = int(us_s) / 1e6
        line = LogLine(us=int(us_s), text=text)
        if snaps and int(snaps[-1].time) == int(t):
            prev = snaps[-1]
            snaps[-1] = prev.model_copy(
                update={"journal": Journal(lines=(*prev.journal.lines, line))}
            )
        else:
            snaps.append(Snapshot(time=t, journal=Journal(lines=(line,))))
    return snaps


def load(path: str | Path) -> tuple[str, list[Snapshot]]:
    """Read a trace, a journal JSON export or a plain log: (kind, snapshots)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=str(p)) from None
    lines = text.splitlines()
    first = next((ln for ln in lines if ln.strip()), "")
    obj: object = None
    if first.lstrip().startswith("{"):
        try:
            obj = json.loads(first)
        except json.JSONDecodeError:
            obj = None
    if isinstance(obj, dict) and "time" in obj:
        snaps: list[Snapshot] = []
        for n, ln in enumerate(lines, 1):
            if not ln.strip():
                continue
            try:
                snaps.append(Snapshot.from_json(ln))
            except ValueError as exc:
                raise ConfigError(str(exc), file=str(p), key=f"line {n}",
                                  fix="a trace has one snapshot JSON object per line") from None
        return "trace", snaps
    if isinstance(obj, dict) and "MESSAGE" in obj:
        records: list[dict[str, Any]] = []
        for n, ln in enumerate(lines, 1):
            if not ln.strip():
                continue
            try:
                rec = json.loads(ln)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"bad JSON: {exc.msg}", file=str(p), key=f"line {n}") from None
            if isinstance(rec, dict):
                records.append(rec)
        return "journal-json", snapshots_from_journal_json(records)
    snaps = snapshots_from_log(lines)
    if not snaps:
        raise ConfigError("no log lines in the file", file=str(p),
                          fix="pass a trace (JSONL) or a vLLM log / journal dump")
    return "log", snaps


def run(
    snapshots: Sequence[Snapshot], budgets: Budgets | None = None, *, log_only: bool = False
) -> reducer.WatchState:
    """Fold snapshots through the reducer; for a plain log, settle `ready` at the end
    when the log reached `Application startup complete.` with no fatal error after it."""
    b = budgets or Budgets()
    state = reducer.initial()
    for snap in snapshots:
        state = reducer.step(state, snap, b, log_only=log_only)
    if log_only and state.verdict not in reducer.TERMINAL and state.startup_complete:
        state = reducer.ready_from_log(state, b)
    return state


def replay(
    snapshots: Sequence[Snapshot], budgets: Budgets | None = None, *, kind: str = "trace"
) -> dict[str, Any]:
    log_only = kind != "trace"
    state = run(snapshots, budgets, log_only=log_only)
    out: dict[str, Any] = dict(reducer.report(state))
    out["source"] = kind
    out["snapshots"] = len(snapshots)
    if log_only and state.verdict == "ready":
        out["note"] = ("replayed from a plain log: ready means serving evidence (requests "
                       "answered, throughput lines, `Application startup complete.`) with "
                       "no fatal error after it; /health and a real completion were not "
                       "observed" + ("; then stopped in order" if state.stop_at else ""))
    elif state.verdict not in reducer.TERMINAL:
        out["note"] = (f"the input ends in phase {state.phase} without a final verdict"
                       + ("; /health was 200 but no completion was recorded"
                          if state.health_ok else ""))
    return out


def replay_file(path: str | Path, budgets: Budgets | None = None) -> dict[str, Any]:
    """`invoke replay FILE --json` prints this."""
    kind, snaps = load(path)
    return replay(snaps, budgets, kind=kind)


def write_trace(path: str | Path, snapshots: Iterable[Snapshot]) -> None:
    """Write snapshots as JSONL (one per line), the format `load` reads back."""
    with Path(path).open("w", encoding="utf-8") as fh:
        for snap in snapshots:
            fh.write(snap.to_json() + "\n")
