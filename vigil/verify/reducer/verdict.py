"""The verdict rules: ``step`` folds one snapshot into the state (the log, then the
evidence, the unit, health and the smoke) and decides ready / slow / stalled / crashed /
timed_out / stopped.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from vigil.verify import catalog
from vigil.verify.compile_cache import fold as fold_cache
from vigil.verify.reducer.evidence import (
    _baseline,
    _diff,
    _progress,
    starvation,
    starved_line,
    stretched,
)
from vigil.verify.reducer.log import _fold_lines, _wait_hint
from vigil.verify.reducer.state import (
    _CLEAN_EXIT,
    _RANK,
    _STOP_SUBSTATES,
    EVIDENCE_WAIT_S,
    MAX_HINTS,
    MOVE_MIB,
    PHASES,
    SETTLE_S,
    TERMINAL,
    WEAK,
    Evidence,
    Fatal,
    PhaseSpan,
    Verdict,
    WatchState,
    _mmss,
)
from vigil.verify.snapshot import Smoke, Snapshot, Unit

if TYPE_CHECKING:  # budgets reads the Verdict set: an import here would be a circle
    from vigil.verify.budgets import Budgets


def _describe(state: WatchState, now: float, budgets: Budgets, label: str) -> str:
    """The human evidence line: "compiling — CPU 9.2x wall, cache +312 files, 4:10 of 11:00"."""
    base, cur = state.phase_base, state.prev
    parts: list[str] = []
    if base is not None and cur is not None and cur.time > base.time:
        ev = _diff(base, cur)
        if ev.cpu_ratio is not None:
            parts.append(f"CPU {ev.cpu_ratio:.1f}\u00d7 wall")
        if ev.cache_delta_files is not None:
            parts.append(f"cache {ev.cache_delta_files:+d} files")
        if ev.gpu_delta_mib is not None and cur.gpu_mib:
            total = sum(cur.gpu_mib.values())
            per = total / len(cur.gpu_mib)
            moving = "moving" if ev.gpu_delta_mib >= MOVE_MIB else "flat"
            parts.append(f"GPU {per:.0f} MiB/GPU ({moving})")
    if state.shards is not None:
        parts.append(f"shards {state.shards[0]}/{state.shards[1]}")
    if state.last_progress_at is not None and now - state.last_progress_at >= 60:
        parts.append(f"no progress for {_mmss(now - state.last_progress_at)}")
    elapsed, budget, _ = _clock(state, now, budgets)
    parts.append(f"{_mmss(elapsed)} of {_mmss(budget)}")
    return f"{label} — " + ", ".join(parts)


def _clock(state: WatchState, now: float, budgets: Budgets) -> tuple[float, float, str]:
    """(elapsed, budget, phase the clock runs for). After a phase's end marker the clock
    runs for the next phase, from that end."""
    if not state.spans:
        return 0.0, budgets.budget("bootstrap"), "bootstrap"
    span = state.spans[-1]
    if span.end is not None and span.name != "ready":
        nxt = PHASES[min(PHASES.index(span.name) + 1, len(PHASES) - 2)]
        return now - span.end, budgets.budget(nxt), nxt
    return now - span.start, budgets.budget(span.name), span.name


def _label(state: WatchState) -> str:
    span = state.spans[-1] if state.spans else None
    if span is None:
        return "bootstrap"
    return f"after {span.name}" if span.end is not None else span.name


# How close (s) another root must come to a wrapping one (torch.compile's) to be the
# exception it wraps: the lines of one traceback carry the same second.
WRAP_S = 2.0


def _best_fatal(fatal: tuple[Fatal, ...]) -> Fatal | None:
    """The root: the best-ranked fatal line, the earliest of that rank; lines after an
    orderly stop are teardown. A root that wraps another exception (torch.compile's
    BackendCompilerFailed) yields to another root of the same traceback: an OOM while
    inductor autotunes is the OOM, in the compiling phase."""
    live = [f for f in fatal if not f.after_stop]
    if not live:
        return None
    best = min(live, key=lambda f: _RANK[f.rank])
    if best.rank == "root" and catalog.wraps_another(best.cause):
        for f in live:
            if f.rank == "root" and not catalog.wraps_another(f.cause) \
                    and abs(f.at - best.at) <= WRAP_S:
                return f
    return best


def _finish(state: WatchState, verdict: Verdict, cause: str | None, proof: str | None,
            remedy: str | None, now: float, budgets: Budgets) -> WatchState:
    spans = state.spans
    if verdict != Verdict.READY and spans and spans[-1].end is not None \
            and spans[-1].name not in ("api_starting", "ready"):
        # Past a phase's end marker the start is in the next phase (the clock says so
        # too): a failure there is that phase's.
        nxt = PHASES[PHASES.index(spans[-1].name) + 1]
        spans = (*spans, PhaseSpan(nxt, spans[-1].end, now))
    if spans and spans[-1].end is None:
        spans = (*spans[:-1], replace(spans[-1], end=now))
    if verdict == Verdict.READY:
        if spans and spans[-1].name == "ready":
            spans = (*spans[:-1], PhaseSpan("ready", spans[-1].start, now))
        else:
            spans = (*spans, PhaseSpan("ready", now, now))
    done = replace(state, verdict=verdict, cause=cause, proof=proof, remedy=remedy,
                   ready_at=now if verdict == Verdict.READY else state.ready_at)
    return replace(done, spans=spans, summary=_describe(state, now, budgets, _label(state)))


def step(
    state: WatchState,
    snap: Snapshot,
    budgets: Budgets,
    smoke: Smoke | None = None,
    *,
    log_only: bool = False,
) -> WatchState:
    """Fold one snapshot in. `smoke` (or `snap.smoke`) is the completion's outcome once
    the watcher ran it. `log_only`: the input is a plain log (replay), so serving
    evidence in the log stands in for /health + a completion, no stall can be proven and
    budgets only annotate."""
    smoke = smoke if smoke is not None else snap.smoke
    now = snap.time
    if state.verdict == Verdict.READY:
        return _after_ready(state, snap, budgets)
    if state.verdict in TERMINAL:
        return _refine_cause(state, snap)

    started = state.started_at
    if started is None:
        started = now
        unit_start = snap.unit.exec_main_start_epoch if snap.unit is not None else None
        if unit_start is not None and 0 < now - unit_start < 86400:
            started = unit_start
    st = replace(state, started_at=started, now=now, polls=state.polls + 1)
    st = replace(st, compile_cache=fold_cache(st.compile_cache, snap, started))
    if not st.spans:
        st = replace(st, spans=(PhaseSpan("bootstrap", started),), last_progress_at=now)

    # 1. Log lines: phases (markers, traceback frames, process names), fatal errors,
    # serving evidence, an orderly stop, noise.
    f, st = _fold_lines(st, snap, now)

    base = _baseline(snap)
    ev = _diff(st.prev, base) if st.prev is not None else Evidence()
    ev = replace(ev, new_lines=f.new_lines, noise_lines=f.noise, shard_moved=f.shard_moved)
    phase = st.spans[-1].name
    why = _progress(phase, ev, base)
    if f.phase_changed:
        why = ("phase", *why)
    ev = replace(ev, progress=why)

    quiet = dict(st.quiet_s)
    if st.last_progress_at is not None:
        q = now - st.last_progress_at
        quiet[phase] = max(quiet.get(phase, 0.0), q)
    last_progress_at = now if why else st.last_progress_at
    st = replace(
        st, evidence=ev, prev=base,
        phase_base=base if (f.phase_changed or st.phase_base is None) else st.phase_base,
        progress_base=base if (why or st.progress_base is None) else st.progress_base,
        last_progress_at=last_progress_at, last_progress=", ".join(why) or st.last_progress,
        quiet_s=quiet,
    )

    # 2. Stopped: an orderly stop by someone else, before any failure.
    dead = _dead(st, snap)
    stop = _stop(st, snap, now, dead=dead, log_only=log_only)
    if stop is not None:
        st = _track_unit(st, snap)
        waiting = st.waiting
        if waiting is not None:
            # stopped while it waited for what never came: the stop, and what it waited for
            cause = catalog.WAIT[waiting.wait].cause
            proof = f"{stop}, after {waiting.describe()} ({waiting.line[:200]})"
            return _finish(st, Verdict.STOPPED, cause, proof,
                           catalog.remedy_for(cause) if cause else None, now, budgets)
        return _finish(st, Verdict.STOPPED, None, stop, None, now, budgets)

    # 3. Crashed: a fatal line, the unit failing or restarting on its own, /health
    # turning 503, or the first completion failing.
    crash = _crash(st, snap, smoke)
    st = _track_unit(st, snap)
    if crash is not None and not log_only and _weak(st, crash):
        weak_at = st.weak_crash_at if st.weak_crash_at is not None else now
        st = replace(st, weak_crash_at=weak_at)
        settled = dead and st.exit_line_at is not None \
            and now - max(weak_at, st.exit_line_at) >= SETTLE_S
        if not settled and now - weak_at < EVIDENCE_WAIT_S:
            return replace(st, summary=f"{_describe(st, now, budgets, _label(st))}; "
                           f"crash evidence ({crash[1][:120]}): waiting for the journal")
    if crash is not None:
        cause, proof, remedy = _hinted(st, crash)
        return _finish(st, Verdict.CRASHED, cause, proof, remedy, now, budgets)

    # 4. Ready: /health 200 and a real completion with tokens; from a plain log, the
    # serving evidence, when it appears.
    http = snap.http
    health_ok = st.health_ok or (http is not None and http.health_status == 200)
    st = replace(st, health_ok=health_ok)
    if health_ok and smoke is not None and smoke.ok and smoke.tokens > 0:
        proof = f"/health 200 and a completion returned {smoke.tokens} tokens"
        return _finish(st, Verdict.READY, None, proof, None, now, budgets)
    if log_only and (st.serving_at is not None or st.startup_complete):
        return _ready_from_log(st, budgets)

    # 5. Stalled: alive, no progress for the phase's stall window.
    elapsed, budget, clock_phase = _clock(st, now, budgets)
    quiet_for = now - (now if st.last_progress_at is None else st.last_progress_at)
    window = max(budgets.stall(phase), budgets.stall(clock_phase))
    # A quiet tree the host starves (a CPU quota, a loaded host, the hypervisor) is held
    # back, not stuck: its window stretches in proportion to the CPU it was kept from,
    # measured over the quiet time (the counters of the last poll with progress, now).
    starved = starvation(st.progress_base, base) if not log_only and quiet_for > 0 else None
    starved_note = ""
    unstretched = window
    if starved is not None:
        share, what, span = starved
        window = stretched(window, share)
        starved_note = f"{starved_line(share, what, span)}; stall window " \
            f"{_mmss(unstretched)} stretched to {_mmss(window)}"
    if not log_only and base.alive and quiet_for >= window:
        label = _label(st)
        line = _describe(st, now, budgets, label)
        proof = f"{line}; no progress evidence for {_mmss(quiet_for)} (stall window " \
            f"{_mmss(window)}); last log line: {st.last_line[:200]!r}"
        if starved_note:
            proof = f"{proof}; {starved_note}"
        hint = catalog.PHASE[clock_phase].stall_hint or catalog.VERDICT_REMEDIES[Verdict.STALLED]
        waiting = st.waiting
        cause = catalog.WAIT[waiting.wait].cause if waiting is not None else None
        if waiting is not None and cause is not None:
            # a wait that can never end on its own: stalled, and what it waits for
            proof = f"{waiting.describe()} ({waiting.line[:200]}); {proof}"
            return _finish(st, Verdict.STALLED, cause, proof, catalog.remedy_for(cause), now,
                           budgets)
        if waiting is not None:  # what vLLM itself says it waits for (shm_broadcast's notices)
            proof = f"{waiting.describe()} ({waiting.line[:200]}); {proof}"
        return _finish(st, Verdict.STALLED, f"stalled_{clock_phase}", proof, hint, now, budgets)

    # 6. Timed out: the hard cap, or a phase past a stated multiple of a budget learned
    # from history. A guessed budget never ends a start that keeps progressing.
    since_start = now - started
    if not log_only and since_start >= budgets.hard_cap_s:
        proof = f"{_mmss(since_start)} since start, hard cap {_mmss(budgets.hard_cap_s)}"
        return _finish(st, Verdict.TIMED_OUT, "timed_out", proof,
                       catalog.VERDICT_REMEDIES[Verdict.TIMED_OUT], now, budgets)
    limit = budgets.timeout_factor * budget
    if not log_only and clock_phase in budgets.learned and elapsed > limit:
        proof = f"{clock_phase} took {_mmss(elapsed)}, past {budgets.timeout_factor:g}x " \
            f"its learned budget {_mmss(budget)} ({_mmss(limit)})"
        return _finish(st, Verdict.TIMED_OUT, "timed_out", proof,
                       catalog.VERDICT_REMEDIES[Verdict.TIMED_OUT], now, budgets)

    # 7. Slow: past the budget and still progressing: say how far over, keep watching.
    verdict = st.verdict
    notices = _noticed(st, log_only)
    if notices is not None:
        # vLLM says a process waits on another (shm_broadcast's notice, repeating) and
        # nothing has moved since the wait began: slow, not yet stalled (the window decides)
        verdict = Verdict.SLOW
        if "waiting" not in st.extended:
            st = replace(st, extended=st.extended | {"waiting"}, warnings=(
                *st.warnings, f"{clock_phase}: {notices} and no other progress since; "
                f"stalled at {_mmss(window)} without progress"))
    if clock_phase != "ready" and elapsed > budget and quiet_for < window / 2:
        verdict = Verdict.SLOW
        if clock_phase not in st.extended:
            source = "learned" if clock_phase in budgets.learned else "default"
            st = replace(
                st, extended=st.extended | {clock_phase},
                warnings=(*st.warnings, f"{clock_phase} past its budget {_mmss(budget)} "
                          f"({source}) and still progressing"),
            )
    held = bool(starved_note) and bool(base.alive) and quiet_for >= unstretched
    if held:
        # quiet past the window it had unstarved, and starved: slow, held back by the
        # host (not stuck), and the verdict line says by what
        verdict = Verdict.SLOW
        if "starved" not in st.extended:
            st = replace(st, extended=st.extended | {"starved"},
                         warnings=(*st.warnings, f"{clock_phase}: {starved_note}"))
    summary = _describe(st, now, budgets, _label(st))
    if verdict == Verdict.SLOW and budget > 0:
        summary += f" (slow: {elapsed / budget:.1f}x its budget)"
    if held:
        summary += f" ({starved_note})"
    return replace(st, verdict=verdict, summary=summary)


def _noticed(st: WatchState, log_only: bool) -> str | None:
    """The repeating wait notice vLLM prints (shm_broadcast), when nothing else has moved
    since it began: what a start that is slow, not yet stalled, is waiting on. Live (or a
    trace) only: a plain log cannot tell a silent compile from a hang."""
    waiting = st.waiting
    if log_only or waiting is None or waiting.wait != "shm_broadcast" or waiting.count < 2:
        return None
    if st.last_progress_at is not None and st.last_progress_at > waiting.since:
        return None
    return waiting.describe()


def _stop(st: WatchState, snap: Snapshot, now: float, *, dead: bool,
          log_only: bool) -> str | None:
    """The proof of an orderly stop by someone else, or None. A failure that came first
    wins: vLLM stops itself after a fatal error (SIGTERM to its own PID). vLLM's teardown
    lines with no trigger seen are a stop only if no failure follows: from a log, none in
    the rest of it; live, none by SETTLE_S after the unit is seen dead."""
    if log_only and st.serving_at is not None and st.stop_at is not None \
            and st.serving_at <= st.stop_at:
        return None  # it served, then stopped (one second of a log): ready, then stopped
    if st.stop_at is not None and all(f.after_stop for f in st.fatal) and (
            st.stop_asked or log_only or (dead and now - st.stop_at >= SETTLE_S)):
        return f"stopped: {st.stop_line}"
    if st.fatal:
        return None
    unit = snap.unit
    if unit is None or unit.error is not None or not unit.active_state:
        return None
    if unit.active_state == "deactivating" and unit.sub_state in _STOP_SUBSTATES:
        return f"stopped: unit {unit.active_state}/{unit.sub_state} (a stop job)"
    if (st.unit_was_up and unit.active_state == "inactive"
            and unit.exec_main_status in _CLEAN_EXIT):
        return f"stopped: unit went inactive with a clean exit " \
            f"(status {unit.exec_main_status})"
    restarts0 = st.restarts0 if st.restarts0 is not None else unit.n_restarts
    if (st.main_pid and unit.main_pid and unit.main_pid != st.main_pid
            and unit.n_restarts == restarts0 and unit.active_state != "failed"):
        # systemd counts its own restarts in NRestarts; a new main PID without one is a
        # restart someone asked for.
        return f"stopped: restarted by someone else (main PID {st.main_pid} → " \
            f"{unit.main_pid}, NRestarts unchanged)"
    return None


def _crash(st: WatchState, snap: Snapshot, smoke: Smoke | None) -> tuple[str, str, str] | None:
    best = _best_fatal(st.fatal)
    unit = snap.unit
    reason: str | None = None
    if unit is not None and unit.error is None and unit.active_state:
        reason = _unit_failure(st, unit)
    http = snap.http
    if reason is None and st.health_ok and http is not None and http.health_status == 503:
        reason = "/health turned 503: the engine died"
        if best is None:
            return "engine_dead", reason, catalog.remedy_for("engine_dead")
    if best is not None:
        return best.cause, best.proof, best.remedy
    if reason is not None:
        return "unknown", reason, catalog.remedy_for("unknown")
    if smoke is not None and not smoke.ok and (st.health_ok or _health(snap)):
        proof = f"/health 200 but the first completion failed: {smoke.error or 'no tokens'}"
        return "engine_dead", proof, catalog.remedy_for("engine_dead")
    return None


def _hinted(st: WatchState, crash: tuple[str, str, str]) -> tuple[str, str, str]:
    """A crash of unknown cause, proven only by a chain line or the unit's state, takes its
    cause from the first hint of this start (NCCL's WARN naming the CUDA call that failed
    before "WorkerProc failed to start."; the wait it died in, e.g. TCPStore's retries).
    A root cause, an exception line or a symptom keeps its own; a hint alone is never a
    crash."""
    best = _best_fatal(st.fatal)
    if crash[0] != "unknown" or (best is not None and best.rank not in WEAK):
        return crash
    hints = st.hints
    if st.waiting is not None:  # the unit died while the log still waited
        hints = _wait_hint(st, st.waiting, crash[1], st.waiting.last)
    hint = next((h for h in hints if not h.after_stop), None)
    return crash if hint is None else (hint.cause, hint.proof, hint.remedy)


def _weak(st: WatchState, crash: tuple[str, str, str]) -> bool:
    """Whether the crash stands only on the unit's state or a chain line (so a better
    line may still be on its way through journald)."""
    best = _best_fatal(st.fatal)
    if best is None:
        return crash[0] == "unknown" and crash[1] == _unit_reason(st, crash[1])
    return best.rank in WEAK and crash[1] == best.proof


def _unit_reason(st: WatchState, proof: str) -> str:
    return proof if proof.startswith(("unit ", "main PID changed")) else ""


def _dead(st: WatchState, snap: Snapshot) -> bool:
    """The unit's main process is gone (failed, inactive, waiting to restart)."""
    unit = snap.unit
    return bool(unit is not None and unit.error is None and unit.active_state and (
        unit.active_state in ("failed", "inactive") or unit.sub_state == "auto-restart"))


def _unit_failure(st: WatchState, unit: Unit) -> str | None:
    restarts0 = st.restarts0 if st.restarts0 is not None else unit.n_restarts
    if unit.active_state == "failed" or unit.sub_state == "auto-restart":
        return f"unit {unit.active_state}/{unit.sub_state}, exit status " \
            f"{unit.exec_main_status}"
    if st.unit_was_up and unit.active_state in ("inactive", "deactivating"):
        return f"unit went {unit.active_state} (exit status {unit.exec_main_status})"
    if unit.n_restarts > restarts0:
        return f"unit restarted: NRestarts {restarts0} → {unit.n_restarts}"
    if st.main_pid and unit.main_pid and unit.main_pid != st.main_pid:
        return f"main PID changed {st.main_pid} → {unit.main_pid}"
    return None


def _track_unit(st: WatchState, snap: Snapshot) -> WatchState:
    """Remember the first NRestarts, the main PID and whether the unit was ever up."""
    unit = snap.unit
    if unit is None or unit.error is not None or not unit.active_state:
        return st
    return replace(
        st,
        restarts0=st.restarts0 if st.restarts0 is not None else unit.n_restarts,
        unit_was_up=st.unit_was_up or unit.active_state in ("active", "activating", "reloading"),
        main_pid=unit.main_pid or st.main_pid,
    )


def _health(snap: Snapshot) -> bool:
    return snap.http is not None and snap.http.health_status == 200


def _refine_cause(state: WatchState, snap: Snapshot) -> WatchState:
    """After a crash, a later poll may still show a better-ranked root cause (a chain
    line is logged by the API server, the root by the engine core, in any order)."""
    if state.verdict != Verdict.CRASHED or not state.fatal:
        return state
    fatal = list(state.fatal)
    hints = list(state.hints)
    for entry in snap.journal.lines:
        text = catalog.normalise(entry.text)
        m = catalog.classify(text)
        if m.role == "hint" and m.cause is not None and len(hints) < MAX_HINTS:
            hints.append(Fatal(m.cause, text.strip()[:2000], m.remedy or "", "hint",
                               snap.time))
        if m.kind == "fatal" and m.cause is not None:
            rank = "exception" if (m.role == "root" and m.cause == "unknown") else (
                m.role or "chain")
            fatal.append(Fatal(m.cause, text.strip(), m.remedy or "", rank,
                               snap.time))
    best = _best_fatal(tuple(fatal))
    st = replace(state, fatal=tuple(fatal), hints=tuple(hints))
    if best is None:
        return st
    cause, proof, remedy = _hinted(st, (best.cause, best.proof, best.remedy))
    if proof == state.proof:
        return st
    return replace(st, cause=cause, proof=proof, remedy=remedy)


def _ready_from_log(st: WatchState, budgets: Budgets) -> WatchState:
    """Replay of a plain log only: serving evidence (requests answered, throughput, the
    server bound) or `Application startup complete.` with no fatal line stands in for
    /health 200 + a completion (a log shows neither; the smoke is unknown, not failed)."""
    if st.serving_at is not None:
        at = st.serving_at
        if st.startup_complete_at is not None:
            at = min(at, st.startup_complete_at)
        proof = f"serving evidence in the log: {st.serving_line!r} (from the log only: " \
            "/health and a completion were not observed)"
    else:
        at = st.startup_complete_at if st.startup_complete_at is not None else st.now or 0.0
        proof = "Application startup complete. (from the log only: /health and a " \
            "completion were not observed)"
    if st.stop_at is not None:  # it stopped in the same second it served (a harness exits)
        st = replace(st, warnings=(*st.warnings, f"ready, then stopped at "
                                   f"{_mmss(st.stop_at - (st.started_at or st.stop_at))}: "
                                   f"{st.stop_line}"))
    return _finish(st, Verdict.READY, None, proof, None, at, budgets)


def _after_ready(state: WatchState, snap: Snapshot, budgets: Budgets) -> WatchState:
    """Replay goes on after ready: a fatal error revokes it (crashed, with when); an
    orderly stop is noted (ready, then stopped). An unknown exception alone does not
    revoke (a rejected request logs one); a known cause or the engine dying does."""
    now = snap.time
    _, st = _fold_lines(replace(state, now=now, polls=state.polls + 1), snap, now)
    served = st.serving_at is not None
    if served and st.spans and st.spans[-1].name != "ready":
        st = replace(st, spans=(*st.spans, PhaseSpan("ready", st.serving_at or now, now)))
    new = [x for x in st.fatal[len(state.fatal):] if not x.after_stop]
    if any(x.rank in ("root", "symptom") and x.cause != "unknown" for x in new):
        best = _best_fatal(tuple(new))
        assert best is not None
        spans = st.spans
        if not served and spans and spans[-1].name == "ready":
            # ready stood on `Application startup complete.` alone, and the server never
            # answered: it never served (e.g. the bind after startup failed).
            spans = spans[:-1]
        at = _mmss(best.at - (st.started_at or best.at))
        proof = f"{best.proof} (at {at}, after ready at " \
            f"{_mmss((st.ready_at or 0) - (st.started_at or 0))}: ready revoked)"
        return replace(st, spans=spans, verdict=Verdict.CRASHED, cause=best.cause, proof=proof,
                       remedy=best.remedy)
    if st.stop_at is not None and state.stop_at is None:
        st = replace(st, warnings=(*st.warnings, f"ready, then stopped at "
                                   f"{_mmss(st.stop_at - (st.started_at or st.stop_at))}: "
                                   f"{st.stop_line}"))
    return st
