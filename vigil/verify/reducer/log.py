"""Reading the log: each new line folded into the state (markers advance phases, fatal
lines are collected with their cause and role, waits and warnings noted, tracebacks and
a child's exception joined to their first line), before-start and after-stop lines left out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vigil.verify import catalog
from vigil.verify.reducer.state import (
    _RANK,
    _SYSTEMD_EXIT,
    _TEARDOWN_CAUSES,
    MAX_FATAL,
    MAX_HINTS,
    MAX_WARNINGS,
    WEAK,
    Fatal,
    PhaseSpan,
    Verdict,
    Waiting,
    WatchState,
    _advance,
)
from vigil.verify.snapshot import Snapshot


@dataclass
class _Fold:
    """Per-poll scratch of the line fold."""

    spans: list[PhaseSpan]
    fatal: list[Fatal]
    shards: tuple[int, int] | None
    st: WatchState
    new_lines: int = 0
    noise: int = 0
    shard_moved: bool = False
    phase_changed: bool = False


_TRACEBACK = "Traceback (most recent call last):"


def _waited(st: WatchState, m: catalog.Match, text: str, t: float) -> WatchState:
    """Fold a wait line in: a new wait starts its clock; the same one extends it (by the
    log's clock, or the seconds the line says it has waited, whichever is longer)."""
    assert m.wait is not None
    said = m.values.get("waited", 0.0)
    cur = st.waiting
    same = cur is not None and cur.wait == m.wait
    count = cur.count + 1 if cur is not None and same else 1
    if "seconds" in m.values:  # a notice per interval of one wait: k notices, k intervals
        said = count * m.values["seconds"]
    if cur is None or not same:
        since = min(t, t - said) if said else t
        new = Waiting(m.wait, since, t, max(said, 0.0), text.strip()[:300],
                      who=m.line.proc or "")
        rec = catalog.WAIT[m.wait]
        note = f"{new.describe()}: {new.line[:160]}"
        if rec.cause is not None:
            note += f" (if it never comes: {rec.cause})"
        warnings = st.warnings if len(st.warnings) >= MAX_WARNINGS else (*st.warnings, note)
        return replace(st, waiting=new, warnings=warnings)
    return replace(st, waiting=replace(cur, last=t, waited_s=max(t - cur.since, said),
                                       line=text.strip()[:300], count=count))


def _error_line(m: catalog.Match, text: str) -> tuple[str | None, str | None, str] | None:
    line = m.line
    if m.kind == "other" and line.level in ("ERROR", "CRITICAL") and line.source \
            and line.message != _TRACEBACK:
        return line.source, line.proc, text.strip()
    return None


def _logged_exception(prev: tuple[str | None, str | None, str] | None,
                      m: catalog.Match) -> str | None:
    """The previous line, if this line opens a traceback under the same logger prefix."""
    line = m.line
    if prev is None or line.message != _TRACEBACK or line.level not in ("ERROR", "CRITICAL"):
        return None
    return prev[2] if (line.source, line.proc) == prev[:2] else None


def _child_header(prev: tuple[str, int] | None, m: catalog.Match,
                  text: str) -> tuple[str, int] | None:
    """The pending "Process NAME:" header after this line: a new one, or the previous one
    with one line fewer left (3: the parent may log in between), none once used."""
    if catalog.CHILD_DIED.match(m.line.message):
        return text.strip(), 3
    if prev is None or m.line.message == _TRACEBACK or prev[1] <= 1:
        return None
    return prev[0], prev[1] - 1


def _child_traceback(prev: tuple[str, int] | None, m: catalog.Match) -> str | None:
    """The header, if this line opens the dying child's traceback."""
    return prev[0] if prev is not None and m.line.message == _TRACEBACK else None


def _uncaught(m: catalog.Match) -> bool:
    """A traceback's header outside any logger: Python printing an uncaught exception
    (a logger's traceback is `_logged_exception`'s, tied to its message)."""
    msg = m.line.message
    return m.line.level is None and (msg == "Traceback (most recent call last):" or (
        msg.startswith('File "') and catalog.is_traceback_link(msg)))


def _fold_lines(st: WatchState, snap: Snapshot, now: float) -> tuple[_Fold, WatchState]:
    f = _Fold(spans=list(st.spans), fatal=list(st.fatal), shards=st.shards, st=st)
    for entry in snap.journal.lines:
        t = min(entry.us / 1e6, now) if entry.us > 0 else now
        # one normaliser for every reader: proofs and matches see the line vLLM wrote
        text = catalog.normalise(entry.text)
        if f.st.exit_line_at is None and _SYSTEMD_EXIT.search(text) and (
                f.st.started_at is None or t >= f.st.started_at):
            f.st = replace(f.st, exit_line_at=now)
        m = catalog.classify(text)
        if m.kind == "noise":
            f.noise += 1
            if m.wait is not None and not (f.st.started_at is not None
                                           and t < f.st.started_at):
                # a wait line is this start's own (a stop after it is this start's stop)
                f.st = replace(_waited(f.st, m, text, t), begun=True)
                if m.reached is not None and f.st.verdict != Verdict.READY:
                    f.phase_changed |= _advance(f.spans, m.reached, t)
            continue
        if m.kind == "other" and not m.line.message:
            continue
        f.new_lines += 1
        logged = _logged_exception(f.st.error_line, m)
        died = _child_traceback(f.st.child_died, m)
        f.st = replace(f.st, last_line=m.line.message, error_line=_error_line(m, text),
                       child_died=_child_header(f.st.child_died, m, text))
        if died is not None and len(f.fatal) < MAX_FATAL and not (
                f.st.started_at is not None and t < f.st.started_at):
            f.fatal.append(Fatal("unknown", died[:2000], catalog.remedy_for("unknown"),
                                 "chain", t, after_stop=f.st.stop_asked))
        # Ctrl-C reaches the children too: the chain links of a traceback that a
        # KeyboardInterrupt closes are the stop's, not a failure.
        if m.kind == "stop" and m.stop == "trigger":
            i = len(f.fatal)
            while i > 0 and f.fatal[i - 1].rank in WEAK and (
                    catalog.is_traceback_link(f.fatal[i - 1].proof)
                    or f.fatal[i - 1].rank == "traceback"):
                i -= 1
                f.fatal[i] = replace(f.fatal[i], after_stop=True)
        # Python's logger.exception(msg): msg, then the traceback, each line under the
        # logger's prefix (V0 run_mp_engine logs the exception's text this way, e.g.
        # Gaudi's "0 active drivers"). The failure's own line ends the traceback, if the
        # log has it; until then this is a chain link.
        if logged is not None and len(f.fatal) < MAX_FATAL and not (
                f.st.started_at is not None and t < f.st.started_at):
            f.fatal.append(Fatal("unknown", logged[:2000], catalog.remedy_for("unknown"),
                                 "chain", t, after_stop=f.st.stop_asked))
        if died is None and logged is None and _uncaught(m) and not f.st.startup_complete \
                and not (f.fatal and f.fatal[-1].rank in WEAK) and f.st.serving_at is None \
                and len(f.fatal) < MAX_FATAL and not (
                    f.st.started_at is not None and t < f.st.started_at):
            # Python prints an uncaught exception's traceback at the top, outside the
            # logger: the process is on its way out. Evidence of death, the weakest: the
            # root error below it (or a hint before it) names the cause.
            f.fatal.append(Fatal("unknown", text.strip()[:2000], catalog.remedy_for("unknown"),
                                 "traceback", t, after_stop=f.st.stop_asked))
        if m.reached is not None and f.st.verdict != Verdict.READY:
            f.phase_changed |= _advance(f.spans, m.reached, t)
            cur = f.spans[-1]
            if cur.end is not None and m.reached == cur.name \
                    and catalog.runs_in(m.line.message):
                # Code of the phase its end marker closed was still running (a frame, a
                # worker's failed method): the error was raised inside it (V0 logs "# GPU
                # blocks" before initialize_cache allocates them), not in the next phase.
                f.spans[-1] = replace(cur, end=None)
        if m.kind in ("fatal", "serving", "marker") or m.reached is not None:
            f.st = replace(f.st, begun=True)
        # A line stamped before this start is the previous run's (a restart's journal
        # begins with the last run's stop and exit status): never this start's failure.
        before_start = f.st.started_at is not None and t < f.st.started_at
        if m.kind in ("fatal", "serving", "marker") and f.st.waiting is not None:
            hints = f.st.hints
            if m.kind == "fatal" and m.role == "chain" and not before_start:
                hints = _wait_hint(f.st, f.st.waiting, m.line.message, t)
            f.st = replace(f.st, waiting=None, hints=hints)
        if m.kind == "fatal" and m.cause is not None and before_start:
            continue
        if m.role == "hint" and m.cause is not None and not before_start \
                and len(f.st.hints) < MAX_HINTS:
            f.st = replace(f.st, hints=(*f.st.hints, Fatal(
                m.cause, text.strip()[:2000], m.remedy or "", "hint", t,
                after_stop=f.st.stop_asked)))
        if m.marker == "offline_batch":
            idle = t if m.values.get("done", 0) >= m.values.get("total", 1) else None
            f.st = replace(f.st, offline_idle_at=idle)
        if m.kind == "fatal" and m.cause is not None and m.role == "symptom" \
                and m.cause in _TEARDOWN_CAUSES and f.st.offline_idle_at is not None:
            # An offline harness exiting with its work done: its engine core goes with
            # the interpreter, and V1's engine monitor logs it as "died unexpectedly"
            # (vLLM 0.10 → 0.17; #36270 and #41507 silence it). The harness's stop.
            f.st = replace(f.st, stop_at=f.st.stop_at if f.st.stop_at is not None else t,
                           stop_line=f.st.stop_line or text.strip()[:200])
        if m.kind == "fatal" and m.cause is not None:
            rank = "exception" if (m.role == "root" and m.cause == "unknown") else (
                m.role or "chain")
            item = Fatal(m.cause, text.strip()[:2000], m.remedy or "", rank, t,
                         after_stop=f.st.stop_asked or (
                             f.st.stop_at is not None and m.cause in _TEARDOWN_CAUSES))
            # Bounded (a log of a million errors): past MAX_FATAL only a better rank joins.
            if len(f.fatal) < MAX_FATAL or _RANK[rank] < min(_RANK[x.rank] for x in f.fatal):
                f.fatal.append(item)
            continue
        if m.kind == "serving":
            if f.st.serving_at is None:
                f.st = replace(f.st, serving_at=t, serving_line=m.line.message[:200])
            if m.marker is None and f.st.offline_idle_at is not None:
                f.st = replace(f.st, offline_idle_at=None)  # a server, not a harness
            continue
        if m.kind == "stop":
            # The previous run's stop (a restart's "Stopping …" before this start) is not
            # this start's.
            this_run = f.st.begun and not before_start
            if f.st.stop_at is None and this_run:
                f.st = replace(f.st, stop_at=t, stop_line=text.strip()[:200])
            if this_run and m.stop == "trigger" and not f.st.stop_asked:
                f.st = replace(f.st, stop_asked=True)
            continue
        if m.kind != "marker" or m.phase is None:
            continue
        cur = f.spans[-1]
        if m.phase == cur.name and m.edge == "end":
            f.spans[-1] = replace(cur, end=t)
        if m.marker == "shards":
            done, total = int(m.values.get("done", 0)), int(m.values.get("total", 0))
            if f.shards is None or (done, total) != f.shards:
                f.shard_moved = True
            f.shards = (done, total)
        if m.marker == "app_startup_complete" and not f.st.startup_complete:
            f.st = replace(f.st, startup_complete=True, startup_complete_at=t)
    st = replace(f.st, spans=tuple(f.spans), fatal=tuple(f.fatal), shards=f.shards)
    return f, st


def _wait_hint(st: WatchState, waiting: Waiting, what: str, t: float) -> tuple[Fatal, ...]:
    """The hints with the wait the start was in when `what` (a chain line, the unit's end)
    came: a wait that can never end names what an exit nothing else explains died of."""
    cause = catalog.WAIT[waiting.wait].cause
    if cause is None or len(st.hints) >= MAX_HINTS:
        return st.hints
    proof = f"{what[:200]}, after {waiting.describe()} ({waiting.line[:200]})"
    return (*st.hints, Fatal(cause, proof, catalog.remedy_for(cause), "hint", t,
                             after_stop=st.stop_asked))
