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
import math
import re
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vigil.errors import ConfigError
from vigil.exitcodes import ExitCode
from vigil.report import open_new
from vigil.verify import reducer
from vigil.verify.attempts import run as run_attempts
from vigil.verify.budgets import Budgets
from vigil.verify.catalog import normalise, strip_ansi
from vigil.verify.prefilter import verbatim
from vigil.verify.reducer import Verdict
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
# journalctl short in another locale ("6月 10 16:45:05 host bash[1]: "): the prefix goes,
# the time stays unknown (a month name we cannot read).
_SHORT_LOCALE = re.compile(r"^\S{1,8} +\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)? \S+ [^\s:]+\[\d+\]: ?")
# docker logs --timestamps ("2025-05-15T03:31:20.123456789Z "), a compose or log
# viewer's gutter ("2025-05-30 18:28:27.890 | ")
_STAMPED = re.compile(
    r"^(?P<y>\d{4})-(?P<mo>\d\d)-(?P<day>\d\d)(?:T(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)"
    r"(?:[.,](?P<frac>\d{1,9}))?(?:Z|[+-]\d\d:?\d\d)\s"
    r"| (?P<h2>\d\d):(?P<m2>\d\d):(?P<s2>\d\d)(?:[.,](?P<frac2>\d{1,9}))?Z? \|)")
# vLLM's own stamp (no year): "INFO 11-29 10:01:02"
_VLLM = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<mo>\d\d)-(?P<day>\d\d) "
    r"(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)"
)

HALF_YEAR_S = 183 * 86400.0
SLACK_S = 86400.0  # a host's local time may run up to 14 h ahead of UTC


class Years:
    """The year of each stamp without one (journalctl's short format, vLLM's own stamp)
    of one log, so its times are real epochs (never the year 2000) and its durations
    right: the first such stamp takes the latest year in which it is not in the future
    (a Feb 29 the latest leap year), as a syslog reader does; when the stamps then go
    back by more than half a year (Dec 31 → Jan 01) the year steps on. ``year`` fixes
    the first stamp's year instead."""

    def __init__(self, now: float | None = None, year: int | None = None) -> None:
        self.now = time.time() if now is None else now
        self.year = year
        self.last: float | None = None
        self._last_stamp = ""  # the last stamp through `stamp`, its epoch and year
        self._last_t = -1.0
        self._last_year: int | None = None

    def _first(self, month: int, day: int, h: int, m: int, s: int) -> int:
        year = time.gmtime(self.now).tm_year
        for _ in range(8):
            if (month, day) == (2, 29) and not calendar.isleap(year):
                year -= 1
                continue
            t = _epoch(year, month, day, h, m, s, None)
            if t < 0 or t <= self.now + SLACK_S:
                break
            year -= 1
        return year

    def stamp(self, text: str) -> float:
        """``epoch`` of vLLM's stamp "MM-DD hh:mm:ss". A day's log repeats each second's
        stamp: the same stamp again, with the year where it was and nothing that would
        step it, is the same epoch (and changes nothing), so it is not computed again."""
        t = self._last_t
        if text == self._last_stamp and self.year == self._last_year and t >= 0 \
                and self.last is not None and not t < self.last - HALF_YEAR_S:
            return t
        t = self.epoch(int(text[0:2]), int(text[3:5]), int(text[6:8]), int(text[9:11]),
                       int(text[12:14]), None)
        self._last_stamp, self._last_t, self._last_year = text, t, self.year
        return t

    def epoch(self, month: int, day: int, h: int, m: int, s: int,
              frac: str | None) -> float:
        """Epoch seconds of one yearless stamp, in the log's order; -1 if none."""
        if not 1 <= month <= 12:
            return -1.0
        if self.year is None:
            self.year = self._first(month, day, h, m, s)
        t = _epoch(self.year, month, day, h, m, s, frac)
        if t >= 0 and self.last is not None and t < self.last - HALF_YEAR_S:
            self.year += 1  # the log went on past a new year
            t = _epoch(self.year, month, day, h, m, s, frac)
        if t >= 0:
            self.last = t if self.last is None else max(self.last, t)
        return t


def _epoch(year: int, month: int, day: int, h: int, m: int, s: int, frac: str | None) -> float:
    try:
        base = calendar.timegm((year, month, day, h, m, s, 0, 0, 0))
    except (ValueError, OverflowError):
        return -1.0
    return base + (float(f"0.{frac}") if frac else 0.0)


def split_log_line(raw: str, *, year: int | None = None,
                   years: Years | None = None) -> tuple[float | None, str]:
    """(epoch seconds or None, text without any journal prefix). A stamp without a year
    takes it from ``years`` (one per log, see Years), else ``year``, else this year's
    rule."""
    yearless = years or Years(year=year)
    if raw[:1] == "(" and verbatim(raw):
        # vLLM's own line as it wrote it (the common line of a day's log): no journal
        # prefix can start with "(" and the normaliser would leave it as it is
        v = _VLLM.search(raw)
        if v is None:
            return None, raw
        t = yearless.stamp(v.group(0)[-14:])
        return (t if t >= 0 else None), raw
    # Colour first: vLLM colours its prefix and level on a terminal (through `script`,
    # tmux or `docker logs -t` that reaches files), which hides the stamps below.
    raw = strip_ansi(raw)
    m = _ISO.match(raw)
    if m:
        t = _epoch(int(m["y"]), int(m["mo"]), int(m["day"]), int(m["h"]), int(m["m"]),
                   int(m["s"]), m["frac"])
        return (t if t >= 0 else None), raw[m.end():]
    m = _SHORT.match(raw)
    if m and m["mon"] in _MONTHS:
        t = yearless.epoch(_MONTHS[m["mon"]], int(m["day"]), int(m["h"]), int(m["m"]),
                           int(m["s"]), m["frac"])
        return (t if t >= 0 else None), raw[m.end():]
    if m is None or m["mon"] not in _MONTHS:
        loc = _SHORT_LOCALE.match(raw)
        if loc:
            raw = raw[loc.end():]
    d = _STAMPED.match(raw)
    if d:  # docker --timestamps, a compose/viewer gutter: the shipper's clock, with a year
        h, mi, sec, frac = ((d["h"], d["m"], d["s"], d["frac"]) if d["h"] is not None
                            else (d["h2"], d["m2"], d["s2"], d["frac2"]))
        t = _epoch(int(d["y"]), int(d["mo"]), int(d["day"]), int(h), int(mi), int(sec), frac)
        return (t if t >= 0 else None), normalise(raw)
    raw = normalise(raw)
    v = _VLLM.search(raw)
    if v:
        t = yearless.epoch(int(v["mo"]), int(v["day"]), int(v["h"]), int(v["m"]),
                           int(v["s"]), None)
        return (t if t >= 0 else None), raw
    return None, raw


# Bounds that keep memory independent of the file: a longer line is cut (vLLM's longest
# real lines, the engine config, are a few KiB), a snapshot holds at most this many lines,
# and lines before the first timestamp are flushed in blocks.
MAX_LINE = 64 * 1024
MAX_LINES_PER_SNAPSHOT = 2000
_CHUNK = 1 << 20
MAX_EPOCH_S = 253402300799.0  # 9999-12-31: later stamps are not journald's


def _lines(path: Path) -> Iterator[str]:
    """The file's lines, read in bounded chunks; each line cut at MAX_LINE characters."""
    with path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
        buf = ""
        dropping = False
        while True:
            chunk = fh.read(_CHUNK)
            if not chunk:
                break
            buf += chunk
            parts = re.split(r"\r\n|\n", buf)
            buf = parts.pop()
            for part in parts:
                if dropping:
                    dropping = False
                    continue
                yield part[:MAX_LINE]
            if len(buf) > MAX_LINE:
                if not dropping:
                    yield buf[:MAX_LINE]
                dropping = True
                buf = ""
        if buf and not dropping:
            yield buf[:MAX_LINE]


def snapshots_from_log(lines: Iterable[str], *, year: int | None = None,
                       now: float | None = None) -> Iterator[Snapshot]:
    """One snapshot per distinct second of the log (streamed); lines without a stamp
    (tracebacks, tqdm, uvicorn) take the time of the line before them. Stamps without a
    year are placed by one Years for the whole log (``now``: the clock it judges by)."""
    years = Years(now, year)
    cur_t: float | None = None
    cur: list[LogLine] = []
    last: float | None = None
    pending: list[str] = []  # lines before the first stamped line
    for raw in lines:
        raw = raw.rstrip("\n")
        if not raw.strip():
            continue
        t, text = split_log_line(raw, years=years)
        if t is not None:
            t = float(int(t))
            last = t if last is None else max(last, t)  # never backwards
        if last is None:
            pending.append(text)
            if len(pending) >= MAX_LINES_PER_SNAPSHOT:  # no stamp yet: t=0, in blocks
                yield Snapshot(time=0.0, journal=Journal(lines=tuple(
                    LogLine(us=0, text=p) for p in pending)))
                pending = []
            continue
        if pending:
            yield Snapshot(time=last, journal=Journal(lines=tuple(
                LogLine(us=int(last * 1e6), text=p) for p in pending)))
            pending = []
        if cur and (cur_t != last or len(cur) >= MAX_LINES_PER_SNAPSHOT):
            yield Snapshot(time=cur_t or 0.0, journal=Journal(lines=tuple(cur)))
            cur = []
        cur_t = last
        cur.append(LogLine(us=int(last * 1e6), text=text))
    if cur:
        yield Snapshot(time=cur_t or 0.0, journal=Journal(lines=tuple(cur)))
    if pending:  # a log without a single timestamp: one snapshot at t=0
        yield Snapshot(time=0.0, journal=Journal(lines=tuple(LogLine(us=0, text=p)
                                                              for p in pending)))


def _realtime_us(raw: object, where: str, file: str) -> int:
    """journald's __REALTIME_TIMESTAMP (µs since the epoch, a decimal string)."""
    fix = "__REALTIME_TIMESTAMP is microseconds since the epoch, e.g. \"1764410400000000\""
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise ConfigError(f"__REALTIME_TIMESTAMP {str(raw)[:40]!r} is not an integer",
                          file=file, key=where, fix=fix)
    text = str(raw).strip()
    if not text.isdigit() or len(text) > 17 or int(text) / 1e6 > MAX_EPOCH_S:
        raise ConfigError(f"__REALTIME_TIMESTAMP {text[:40]!r} is not microseconds since the "
                          "epoch", file=file, key=where, fix=fix)
    return int(text)


def _message(raw: object, where: str, file: str) -> str | None:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        # journald gives non-UTF-8 or binary messages as a list of byte values.
        if not all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 255
                   for b in raw):
            raise ConfigError("MESSAGE is a list but not of byte values (0-255)", file=file,
                              key=where, fix="journalctl -o json writes MESSAGE as a string "
                              "or a list of byte values")
        return bytes(raw).decode("utf-8", "replace")[:MAX_LINE]
    return None


def snapshots_from_journal_json(
    records: Iterable[dict[str, Any]], *, file: str = "<journal>"
) -> Iterator[Snapshot]:
    cur_s: int | None = None
    cur: list[LogLine] = []
    for n, rec in enumerate(records, 1):
        where = f"record {n}"
        msg = _message(rec.get("MESSAGE"), where, file)
        if msg is None:
            continue
        us = _realtime_us(rec.get("__REALTIME_TIMESTAMP", 0) or 0, where, file)
        for part in msg.splitlines() or [""]:
            sec = us // 1_000_000
            if cur and (sec != cur_s or len(cur) >= MAX_LINES_PER_SNAPSHOT):
                yield Snapshot(time=cur[0].us / 1e6, journal=Journal(lines=tuple(cur)))
                cur = []
            cur_s = sec
            cur.append(LogLine(us=us, text=part[:MAX_LINE]))
    if cur:
        yield Snapshot(time=cur[0].us / 1e6, journal=Journal(lines=tuple(cur)))


def _json_line(line: str, n: int, file: str) -> object:
    try:
        return json.loads(line)
    except RecursionError:
        raise ConfigError("JSON nested too deep", file=file, key=f"line {n}",
                          fix="pass a vigil trace, a journalctl -o json export or a plain "
                          "log") from None
    except ValueError as exc:
        raise ConfigError(f"bad JSON: {exc}", file=file, key=f"line {n}") from None


def _check_snapshot(snap: Snapshot, n: int, file: str) -> Snapshot:
    bad = not math.isfinite(snap.time) or not 0 <= snap.time <= MAX_EPOCH_S
    bad = bad or any(not 0 <= ln.us <= MAX_EPOCH_S * 1e6 for ln in snap.journal.lines)
    if bad:
        raise ConfigError(f"time {snap.time!r} is not seconds since the epoch", file=file,
                          key=f"line {n}", fix="a trace has one snapshot JSON object per "
                          "line, as `verify` writes them")
    return snap


def _open_checked(p: Path) -> None:
    try:
        st = p.stat()
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=str(p)) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError("not a regular file (a device, FIFO or directory)", file=str(p),
                          fix="save the log to a file first, e.g. journalctl -u UNIT "
                          "-o short-iso > start.log")


def stream(path: str | Path) -> tuple[str, Iterable[Snapshot]]:
    """Detect the input kind and stream its snapshots: (kind, snapshots). Memory stays
    bounded whatever the file's size."""
    p = Path(path)
    _open_checked(p)
    file = str(p)
    first = ""
    try:
        for ln in _lines(p):
            if ln.strip():
                first = ln
                break
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=file) from None
    obj: object = None
    if first.lstrip().startswith("{"):
        try:
            obj = json.loads(first)
        except (ValueError, RecursionError):
            obj = None
    if isinstance(obj, dict) and "time" in obj:
        return "trace", Trace(p, file)
    if isinstance(obj, dict) and "MESSAGE" in obj:
        return "journal-json", snapshots_from_journal_json(_records(p, file), file=file)
    return "log", snapshots_from_log(_lines(p))


class Trace:
    """A trace's snapshots, streamed, in the order of their time: a snapshot whose time is
    before the one kept last (a clock stepped back, an edited or spliced file) would make
    phases of negative length and a "ready" out of them, so it is ignored, and
    ``ignored`` says so in one line naming the file, how many and the first of them."""

    def __init__(self, p: Path, file: str) -> None:
        self.p, self.file = p, file
        self.ignored: list[str] = []

    def __iter__(self) -> Iterator[Snapshot]:
        last: tuple[int, float] | None = None  # (line, time) of the snapshot kept last
        first: tuple[int, float, int] | None = None  # the first ignored: line, by, before
        skipped = 0
        for n, ln in enumerate(_lines(self.p), 1):
            if not ln.strip():
                continue
            try:
                snap = Snapshot.from_json(ln)
            except (ValueError, RecursionError) as exc:
                raise ConfigError(str(exc)[:300], file=self.file, key=f"line {n}",
                                  fix="a trace has one snapshot JSON object per line"
                                  ) from None
            _check_snapshot(snap, n, self.file)
            if last is not None and snap.time < last[1]:
                skipped += 1
                first = first or (n, last[1] - snap.time, last[0])
                self.ignored = [
                    f"{self.file}: {skipped} snapshot{'s' if skipped > 1 else ''} whose time "
                    f"runs backwards ignored (the first: line {first[0]}, {first[1]:.1f} s "
                    f"before line {first[2]})"]
                continue
            last = (n, snap.time)
            yield snap


def ignored(snapshots: Iterable[Snapshot]) -> list[str]:
    """What reading the input left out, one line each (a trace's backward snapshots)."""
    return list(snapshots.ignored) if isinstance(snapshots, Trace) else []


def _records(p: Path, file: str) -> Iterator[dict[str, Any]]:
    for n, ln in enumerate(_lines(p), 1):
        if not ln.strip():
            continue
        rec = _json_line(ln, n, file)
        if isinstance(rec, dict):
            yield rec


def load(path: str | Path) -> tuple[str, list[Snapshot]]:
    """Read a trace, a journal JSON export or a plain log: (kind, snapshots)."""
    kind, snaps = stream(path)
    out = list(snaps)
    if not out:
        raise ConfigError("no log lines in the file", file=str(path),
                          fix="pass a trace (JSONL) or a vLLM log / journal dump")
    return kind, out


def run(
    snapshots: Iterable[Snapshot], budgets: Budgets | None = None, *, log_only: bool = False
) -> reducer.WatchState:
    """Fold snapshots through the reducer. From a plain log, ready is decided when the
    serving evidence appears and later lines may revoke it; budgets only annotate."""
    b = budgets or Budgets()
    state = reducer.initial()
    for snap in snapshots:
        state = reducer.step(state, snap, b, log_only=log_only)
    return state


@dataclass
class Replayed:
    """One replay: its report (what --json prints), the final state, and the snapshots
    when asked to keep them (for the HTML picture)."""

    kind: str
    state: reducer.WatchState
    report: dict[str, Any]
    snapshots: list[Snapshot] = field(default_factory=list)


def replay_run(
    snapshots: Iterable[Snapshot] | str | Path, budgets: Budgets | None = None, *,
    kind: str = "trace", file: str | None = None, keep: bool = False,
    prefilter: bool = True,
) -> Replayed:
    """Replay snapshots, or the file a path names (its kind detected); ``keep`` also
    keeps the snapshots (memory then grows with the input). ``prefilter``: lines that no
    rule can match skip the reducer once the start is settled (vigil/verify/prefilter.py;
    the same report either way, tests/unit/test_prefilter.py)."""
    if isinstance(snapshots, (str, Path)):
        file = str(snapshots)
        kind, snapshots = stream(snapshots)
    log_only = kind != "trace"
    kept: list[Snapshot] = []
    counted = _Counted(snapshots, kept if keep else None)
    got = run_attempts(counted, budgets, log_only=log_only, prefilter=prefilter)
    state = got.state
    if counted.n == 0:
        raise ConfigError("no log lines in the file", file=file,
                          fix="pass a trace (JSONL) or a vLLM log / journal dump")
    out: dict[str, Any] = dict(reducer.report(state))
    out["source"] = kind
    out["snapshots"] = counted.n
    out.update(got.report())  # the earlier starts, each with its own verdict
    out["ignored"] = ignored(snapshots)
    # the exit code verify would end with (a verdict not final yet, or none: 0)
    out["exit_code"] = int(reducer.exit_of(state.verdict, ExitCode.OK))
    if log_only and state.verdict == Verdict.READY:
        out["note"] = ("replayed from a plain log: ready means serving evidence (requests "
                       "answered, throughput lines, `Application startup complete.`) with "
                       "no fatal error after it; /health and a real completion were not "
                       "observed" + ("; then stopped in order" if state.stop_at else ""))
    elif state.verdict not in reducer.TERMINAL:
        out["note"] = (f"the input ends in phase {state.phase} without a final verdict"
                       + ("; /health was 200 but no completion was recorded"
                          if state.health_ok else ""))
    if got.total > 1:
        out["note"] = (f"the log holds {got.total} starts: the verdict is the last one's, "
                       "the earlier ones are in attempts" + (
                           f"; {out['note']}" if out.get("note") else ""))
    return Replayed(kind, state, out, kept)


def replay(
    snapshots: Iterable[Snapshot], budgets: Budgets | None = None, *, kind: str = "trace",
    file: str | None = None,
) -> dict[str, Any]:
    return replay_run(snapshots, budgets, kind=kind, file=file).report


class _Counted:
    """Counts the snapshots that stream through, keeping them only into ``kept``."""

    def __init__(self, items: Iterable[Snapshot], kept: list[Snapshot] | None = None) -> None:
        self.items = items
        self.kept = kept
        self.n = 0

    def __iter__(self) -> Iterator[Snapshot]:
        for item in self.items:
            self.n += 1
            if self.kept is not None:
                self.kept.append(item)
            yield item


def replay_file(path: str | Path, budgets: Budgets | None = None) -> dict[str, Any]:
    """`invoke replay FILE --json` prints this. Streams: memory does not grow with the file."""
    return replay_run(path, budgets).report


def write_trace(path: str | Path, snapshots: Iterable[Snapshot]) -> None:
    """Write snapshots as JSONL (one per line), the format `load` reads back."""
    with open_new(Path(path)) as fh:
        for snap in snapshots:
            fh.write(snap.to_json() + "\n")
