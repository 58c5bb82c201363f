"""Several starts in one log: where each begins, and the verdict of every one of them.

A plain log or a journal export often holds more than one start: systemd's `Restart=`,
a wrapper that retries, a container's restart policy, a second `vllm serve` appended to
the same file. The verdict is the last start's; the earlier ones are reported as
earlier attempts, each with its own verdict, cause and phase.

A start begins at one of the lines every start prints (catalog.start_line): systemd's
"Scheduled restart job" and "Starting"/"Started" of this service's unit (one whose name
says vllm, or whose main process this log saw exit: a journal of several units has other
units' lines), vLLM's version line (every release has one: "vLLM API server version",
the logo's "version X", "vLLM server version X") and its arguments line ("args:
Namespace(", "non-default args:"), or a line of an API server process other than this
start's (`(APIServer pid=N)`: one per start). Such a line opens a new attempt only when
the current one is past its own banners — it failed, served, stopped or got past
bootstrap —, or already printed this kind of banner (a version line after a version
line), or it is systemd's line after vLLM's own. So a start's own banners (systemd's
lines, then the version, then the arguments) stay one start.

The journal's `ident[pid]` prefix is not a boundary by itself: journald attributes a
line to the process that wrote it, so one start shows the API server's and the engine
core's PIDs (a journal saved with `journalctl -u`, j33bs/clawd's audit), and a fresh
container reuses the same PIDs (xbill9/gemma4-tips-aws: APIServer pid 13 in five
restarts).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from vigil.verify import catalog, reducer
from vigil.verify import prefilter as _prefilter
from vigil.verify.budgets import Budgets
from vigil.verify.snapshot import Journal, LogLine, Snapshot

# Earlier attempts kept in the report (the most recent ones); the count says how many.
MAX_ATTEMPTS = 20
_API_PID = re.compile(r"\(APIServer pid=(\d+)\)")
_SYSTEMD_UNIT = re.compile(r"^(?P<unit>[\w@.:\\-]{1,200}?)\.service: (?:Main process exited|"
                           r"Failed with result|Consumed|Scheduled restart job)")
_SYSTEMD_KINDS = frozenset({"scheduled", "starting", "started"})
_PROOF_CHARS = 300


@dataclass
class _Current:
    """What the attempt being folded has shown of its own start."""

    kinds: set[str]
    api_pid: int | None = None


@dataclass(frozen=True)
class Attempt:
    """An earlier start, as its own verdict."""

    started_at: float | None
    verdict: str
    cause: str | None
    phase: str
    proof: str | None
    ready_at: float | None
    stopped_at: float | None

    def to_json(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "verdict": self.verdict, "cause": self.cause,
                "phase": self.phase, "proof": self.proof, "ready_at": self.ready_at,
                "stopped_at": self.stopped_at}


def _attempt(state: reducer.WatchState) -> Attempt:
    proof = state.proof[:_PROOF_CHARS] if state.proof else None
    verdict = state.verdict if state.verdict in reducer.TERMINAL else "undecided"
    return Attempt(state.started_at, verdict, state.cause, state.phase, proof,
                   state.ready_at, state.stop_at)


def _past_banners(st: reducer.WatchState) -> bool:
    """The attempt has shown more than the banners of a start."""
    return bool(st.fatal or st.serving_at is not None or st.stop_at is not None
                or st.startup_complete or st.verdict in reducer.TERMINAL
                or (st.spans and catalog.phase_index(st.phase) > 0))


@dataclass(frozen=True)
class _Candidate:
    banner: catalog.StartLine | None
    api_pid: int | None


class Splitter:
    """Finds where starts begin, line by line. It remembers the units systemd said this
    log's main process belonged to and what the current attempt printed of its start."""

    def __init__(self) -> None:
        self.units: set[str] = set()
        self.cur = _Current(kinds=set())

    def candidate(self, text: str) -> _Candidate | None:
        """A line that may begin a start (a banner of this service, or an API server
        process other than this start's); None for every other line (cheap)."""
        if ".service: " in text:
            unit = _SYSTEMD_UNIT.match(text)
            if unit:
                self.units.add(unit.group("unit"))
        pid: int | None = None
        if "APIServer pid=" in text:
            m = _API_PID.search(text)
            if m:
                pid = int(m.group(1))
                if self.cur.api_pid is None:
                    self.cur.api_pid = pid
                if pid == self.cur.api_pid:
                    pid = None
        banner = catalog.start_line(text)
        if banner is not None and banner.kind in _SYSTEMD_KINDS and not (
                banner.unit is not None
                and ("vllm" in banner.unit.lower() or banner.unit in self.units)):
            banner = None  # another unit's line in a journal of several
        if banner is None and pid is None:
            return None
        return _Candidate(banner, pid)

    def begins(self, st: reducer.WatchState, cand: _Candidate) -> bool:
        """Whether this candidate begins a new attempt, given the current attempt's state
        (all lines before it folded in)."""
        banner = cand.banner
        vllm_seen = bool(self.cur.kinds & {"version", "args"})
        cut = cand.api_pid is not None or _past_banners(st) or (banner is not None and (
            banner.kind in self.cur.kinds
            or (banner.kind in _SYSTEMD_KINDS and vllm_seen)))
        if cut:
            self.cur = _Current(kinds=set(), api_pid=cand.api_pid)
        if banner is not None:
            self.cur.kinds.add(banner.kind)
        return cut


def _with_lines(snap: Snapshot, lines: tuple[LogLine, ...]) -> Snapshot:
    return Snapshot(time=snap.time, journal=Journal(lines=lines))


@dataclass
class Run:
    """The last attempt's state and the earlier attempts (the most recent MAX_ATTEMPTS)."""

    state: reducer.WatchState
    attempts: list[Attempt]
    total: int  # the starts seen, the last included

    def report(self) -> dict[str, Any]:
        return {"attempts": [a.to_json() for a in self.attempts],
                "attempts_total": self.total}


def run(snapshots: Iterable[Snapshot], budgets: Budgets | None = None, *,
        log_only: bool = False, prefilter: bool = False) -> Run:
    """Fold snapshots through the reducer, a fresh state for every start (a trace is one
    watch of one start: folded whole). ``prefilter``: a plain log's lines that no rule
    can match skip the reducer once a start is settled (vigil/verify/prefilter.py), and
    a run of polls left with no line is folded as its last one (a settled start's empty
    poll moves only its clock): the same report, fewer `polls`."""
    b = budgets or Budgets()
    state = reducer.initial()
    earlier: list[Attempt] = []
    total = 1
    splitter = Splitter()
    idle: Snapshot | None = None  # the last of a run of polls whose lines all skipped

    def fold(part: Snapshot) -> reducer.WatchState:
        nonlocal idle
        st = state
        if idle is not None:
            st, idle = reducer.step(st, idle, b, log_only=True), None
        return reducer.step(st, part, b, log_only=True)

    for snap in snapshots:
        if not log_only:
            state = reducer.step(state, snap, b)
            continue
        lines = snap.journal.lines
        part: list[LogLine] = []  # the lines of this part the reducer gets
        had = 0  # the lines of this part, skipped ones too
        skipping = prefilter and _prefilter.settled(state)
        for ln in lines:
            cand = splitter.candidate(ln.text)
            if cand is not None:
                if had:  # what came before it in this second is the attempt's
                    state = fold(_with_lines(snap, tuple(part)))
                    part, had = [], 0
                if idle is not None:
                    state, idle = reducer.step(state, idle, b, log_only=True), None
                if splitter.begins(state, cand) and state.polls:
                    earlier.append(_attempt(state))
                    if len(earlier) > MAX_ATTEMPTS:
                        del earlier[0]
                    total += 1
                    state = reducer.initial()
                skipping = prefilter and _prefilter.settled(state)
            had += 1
            if skipping and not _prefilter.passes(ln.text):
                continue
            skipping = False  # from a line a rule may match on, the reducer gets them all
            part.append(ln)
        if had and not part and skipping:
            idle = _with_lines(snap, ())
        elif had or not lines:
            whole = had == len(lines) and len(part) == had
            state = fold(snap if whole else _with_lines(snap, tuple(part)))
    if idle is not None:
        state = reducer.step(state, idle, b, log_only=True)
    return Run(state, earlier, total)


def _clock(at: float | None) -> str:
    if at is None:
        return "?"
    return time.strftime("%H:%M:%S", time.gmtime(at))


def summary_line(report: dict[str, Any]) -> str | None:
    """One line for the text report: the earlier attempts, runs of the same outcome
    folded ("crashed (gpu_memory_held) in engine_init x3 from 06:52:31"); None for a
    log of one start."""
    earlier = report.get("attempts") or []
    if not earlier:
        return None
    runs: list[list[Any]] = []  # [outcome, first start, count]
    for a in earlier:
        if a["verdict"] == reducer.Verdict.READY:
            outcome = "ready" + (", then stopped" if a.get("stopped_at") else "")
        else:
            outcome = a["verdict"] + (f" ({a['cause']})" if a.get("cause") else "") \
                + f" in {a['phase']}"
        if runs and runs[-1][0] == outcome:
            runs[-1][2] += 1
        else:
            runs.append([outcome, a.get("started_at"), 1])
    parts = [f"{o} x{n} from {_clock(t)}" if n > 1 else f"{o} at {_clock(t)}"
             for o, t, n in runs]
    total = int(report.get("attempts_total") or len(earlier) + 1) - 1
    shown = f"{total}" if total == len(earlier) else f"{total}, the last {len(earlier)}"
    line = f"earlier attempts ({shown}): " + "; ".join(parts[-6:])
    if len(parts) > 6:
        line = line.replace(": ", ": …; ", 1)
    return line
