"""The pure reducer: fold probe snapshots into phase, progress evidence and a verdict.

`step(state, snapshot, budgets, smoke)` is clock-free (time comes from the snapshot)
and does no I/O, so a recorded trace replays through it at any speed.

What counts as progress (resets the phase's stall clock), per phase:

- everywhere: a new non-noise log line, a new phase, checkpoint-shard progress,
  GPU memory moving (>= 64 MiB), the compile cache growing (bytes, files or a newer
  write), the process tree's RSS moving (>= 64 MiB). These are work that a hung
  process cannot fake.
- CPU time (tree CPU >= 0.3x wall) counts only where CPU work *is* the work and
  nothing else has to move: bootstrap, engine_init, kv_cache (profile run),
  capturing_graphs, api_starting. It does NOT count in distributed_init (NCCL
  busy-polls at 100 % while hung), loading_weights (I/O bound: GPU memory or RSS must
  move) or compiling (inductor writes its cache as it goes: busy CPUs with a flat cache
  are spinning, not compiling) — unless that phase's own signal cannot be observed
  (no GPUs/cache readable), where CPU is the best evidence left.
- the 60-s "No available shared memory broadcast block" line proves the process is
  alive, never progress by itself.

Stalled needs a live process tree observed (state R/S/D/T, not all zombies): a plain
log without process data can never prove a stall. After a phase's end marker and
before the next phase's first marker, the time counts against the next phase.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from vigil.verify import catalog
from vigil.verify.budgets import Budgets
from vigil.verify.snapshot import Smoke, Snapshot

PHASES = catalog.PHASES
TERMINAL = frozenset({"ready", "stalled", "crashed", "timed_out"})
MOVE_MIB = 64.0
RSS_MOVE = 64 * 1024 * 1024
CPU_BUSY = 0.3  # tree CPU seconds per wall second that count as "working"

# Phases where tree CPU time is progress (see the module docstring).
CPU_IS_PROGRESS = frozenset({"bootstrap", "engine_init", "kv_cache", "capturing_graphs",
                             "api_starting"})

STALL_HINTS: dict[str, str] = {
    "distributed_init": "workers stuck in NCCL/distributed init: run with NCCL_DEBUG=INFO, "
    "check GPU visibility and P2P (try NCCL_P2P_DISABLE=1), then restart the unit",
    "loading_weights": "weight loading stopped moving: check the model path's disk or "
    "network filesystem (iostat, dmesg), then restart the unit",
    "compiling": "busy CPUs but the compile cache does not grow: the compile is spinning; "
    "py-spy dump the workers, clear the compile cache or try -O0/--enforce-eager",
}


@dataclass(frozen=True)
class PhaseSpan:
    name: str
    start: float
    end: float | None = None

    def duration(self, now: float) -> float:
        return (self.end if self.end is not None else now) - self.start


@dataclass(frozen=True)
class Baseline:
    """The numbers of one snapshot that evidence is computed from (None: not observed)."""

    time: float
    cpu_by_pid: Mapping[int, float] | None
    alive: bool | None
    rss_bytes: int | None
    gpu_mib: Mapping[int, float] | None
    cache_bytes: int | None
    cache_files: int | None
    cache_newest: float | None


@dataclass(frozen=True)
class Evidence:
    """What moved between two polls (None: the signal was not observed in both)."""

    wall_s: float = 0.0
    new_lines: int = 0
    noise_lines: int = 0
    cpu_ratio: float | None = None
    gpu_delta_mib: float | None = None
    cache_delta_files: int | None = None
    cache_delta_bytes: int | None = None
    cache_newer: bool = False
    rss_delta_bytes: int | None = None
    shard_moved: bool = False
    progress: tuple[str, ...] = ()  # the signals that counted as progress this poll


@dataclass(frozen=True)
class WatchState:
    started_at: float | None = None
    now: float | None = None
    spans: tuple[PhaseSpan, ...] = ()
    prev: Baseline | None = None
    phase_base: Baseline | None = None
    last_progress_at: float | None = None
    last_progress: str = ""
    quiet_s: Mapping[str, float] = field(default_factory=dict)  # longest quiet per phase
    restarts0: int | None = None
    main_pid: int | None = None
    unit_was_up: bool = False
    startup_complete: bool = False  # "Application startup complete." seen
    startup_complete_at: float | None = None
    health_ok: bool = False
    shards: tuple[int, int] | None = None
    extended: frozenset[str] = frozenset()
    warnings: tuple[str, ...] = ()
    fatal: tuple[tuple[str, str, str], ...] = ()  # (cause, line, remedy) in order seen
    last_line: str = ""
    evidence: Evidence = Evidence()
    verdict: str | None = None
    cause: str | None = None
    proof: str | None = None
    remedy: str | None = None
    summary: str = ""
    polls: int = 0

    @property
    def phase(self) -> str:
        return self.spans[-1].name if self.spans else "bootstrap"

    @property
    def needs_smoke(self) -> bool:
        """The watcher should now send a real completion and pass its result in."""
        return self.verdict not in TERMINAL and self.health_ok


def initial() -> WatchState:
    return WatchState()


def _baseline(snap: Snapshot) -> Baseline:
    procs = snap.processes
    cpu: dict[int, float] | None = None
    alive: bool | None = None
    rss: int | None = None
    if procs is not None and procs.error is None:
        cpu = {p.pid: p.cpu_s for p in procs.items}
        alive = any(p.state not in ("Z", "X", "x") for p in procs.items)
        rss = procs.rss_bytes
    gpus = snap.gpus
    gpu = None
    if gpus is not None and gpus.error is None and gpus.devices:
        gpu = {g.index: g.memory_used_mib for g in gpus.devices}
    cache = snap.cache
    readable = cache is not None and cache.readable
    return Baseline(
        time=snap.time,
        cpu_by_pid=cpu,
        alive=alive,
        rss_bytes=rss,
        gpu_mib=gpu,
        cache_bytes=cache.bytes if cache is not None and readable else None,
        cache_files=cache.files if cache is not None and readable else None,
        cache_newest=cache.newest_mtime if cache is not None and readable else None,
    )


def _cpu_delta(a: Baseline, b: Baseline) -> float | None:
    if a.cpu_by_pid is None or b.cpu_by_pid is None:
        return None
    # Processes that appeared since count with all their CPU; the ones that left count 0.
    return sum(max(cpu - a.cpu_by_pid.get(pid, 0.0), 0.0) for pid, cpu in b.cpu_by_pid.items())


def _gpu_delta(a: Baseline, b: Baseline) -> float | None:
    if a.gpu_mib is None or b.gpu_mib is None:
        return None
    keys = set(a.gpu_mib) | set(b.gpu_mib)
    return sum(abs(b.gpu_mib.get(k, 0.0) - a.gpu_mib.get(k, 0.0)) for k in keys)


def _diff(a: Baseline, b: Baseline) -> Evidence:
    wall = max(b.time - a.time, 0.0)
    cpu = _cpu_delta(a, b)
    newer = (
        b.cache_newest is not None
        and (a.cache_newest is None or b.cache_newest > a.cache_newest)
    )
    return Evidence(
        wall_s=wall,
        cpu_ratio=(cpu / wall) if cpu is not None and wall > 0 else None,
        gpu_delta_mib=_gpu_delta(a, b),
        cache_delta_files=(
            b.cache_files - a.cache_files
            if a.cache_files is not None and b.cache_files is not None else None
        ),
        cache_delta_bytes=(
            b.cache_bytes - a.cache_bytes
            if a.cache_bytes is not None and b.cache_bytes is not None else None
        ),
        cache_newer=newer,
        rss_delta_bytes=(
            b.rss_bytes - a.rss_bytes
            if a.rss_bytes is not None and b.rss_bytes is not None else None
        ),
    )


def _progress(phase: str, ev: Evidence, base: Baseline) -> tuple[str, ...]:
    why: list[str] = []
    if ev.new_lines:
        why.append("log")
    if ev.shard_moved:
        why.append("shards")
    if ev.gpu_delta_mib is not None and ev.gpu_delta_mib >= MOVE_MIB:
        why.append("gpu memory")
    cache_grew = bool(
        (ev.cache_delta_files or 0) > 0 or (ev.cache_delta_bytes or 0) > 0 or ev.cache_newer
    )
    if cache_grew:
        why.append("compile cache")
    if ev.rss_delta_bytes is not None and abs(ev.rss_delta_bytes) >= RSS_MOVE:
        why.append("rss")
    busy = ev.cpu_ratio is not None and ev.cpu_ratio >= CPU_BUSY
    if busy:
        # CPU counts where it is the work, or where the phase's own signal is unobservable.
        own_signal_missing = (
            (phase == "compiling" and base.cache_files is None)
            or (phase in ("loading_weights", "distributed_init") and base.gpu_mib is None
                and base.rss_bytes is None)
        )
        if phase in CPU_IS_PROGRESS or own_signal_missing:
            why.append("cpu")
    return tuple(why)


def _mmss(seconds: float) -> str:
    s = max(round(seconds), 0)
    return f"{s // 60}:{s % 60:02d}"


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
        budget = budgets.budget(nxt) * (2 if nxt in state.extended else 1)
        return now - span.end, budget, nxt
    budget = budgets.budget(span.name) * (2 if span.name in state.extended else 1)
    return now - span.start, budget, span.name


def _label(state: WatchState) -> str:
    span = state.spans[-1] if state.spans else None
    if span is None:
        return "bootstrap"
    return f"after {span.name}" if span.end is not None else span.name


def _best_fatal(fatal: tuple[tuple[str, str, str], ...]) -> tuple[str, str, str] | None:
    # The first specific root cause wins over the generic chain lines that follow it.
    for item in fatal:
        if catalog.is_specific(item[0]):
            return item
    return fatal[0] if fatal else None


def _finish(state: WatchState, verdict: str, cause: str | None, proof: str | None,
            remedy: str | None, now: float, budgets: Budgets) -> WatchState:
    spans = state.spans
    if spans and spans[-1].end is None:
        spans = (*spans[:-1], replace(spans[-1], end=now))
    if verdict == "ready":
        spans = (*spans, PhaseSpan("ready", now, now))
    done = replace(state, verdict=verdict, cause=cause, proof=proof, remedy=remedy)
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
    the watcher ran it. `log_only`: the input is a plain log (replay), so
    `Application startup complete.` stands in for /health and no stall can be proven."""
    smoke = smoke if smoke is not None else snap.smoke
    now = snap.time
    if state.verdict in TERMINAL:
        return _refine_cause(state, snap)

    started = state.started_at
    if started is None:
        started = now
        unit_start = snap.unit.exec_main_start_epoch if snap.unit is not None else None
        if unit_start is not None and 0 < now - unit_start < 86400:
            started = unit_start
    st = replace(state, started_at=started, now=now, polls=state.polls + 1)
    if not st.spans:
        st = replace(st, spans=(PhaseSpan("bootstrap", started),), last_progress_at=now)

    # 1. Log lines: phases, fatal errors, noise.
    new_lines = noise = 0
    shard_moved = False
    spans = list(st.spans)
    fatal = list(st.fatal)
    shards = st.shards
    startup_complete = st.startup_complete
    startup_complete_at = st.startup_complete_at
    last_line = st.last_line
    phase_changed = False
    for entry in snap.journal.lines:
        t = min(entry.us / 1e6, now) if entry.us > 0 else now
        m = catalog.classify(entry.text)
        if m.kind == "noise":
            noise += 1
            continue
        if m.kind == "other" and not m.line.message:
            continue
        new_lines += 1
        last_line = m.line.message
        if m.kind == "fatal" and m.cause is not None:
            fatal.append((m.cause, entry.text.strip(), m.remedy or ""))
            continue
        if m.kind != "marker" or m.phase is None:
            continue
        cur = spans[-1]
        if catalog.phase_index(m.phase) > catalog.phase_index(cur.name):
            # Forward only: interleaved ranks and the V2 runner's early graph capture
            # would otherwise bounce the phase back and forth.
            start = cur.end if cur.end is not None else t
            if cur.end is None:
                spans[-1] = replace(cur, end=t)
            spans.append(PhaseSpan(m.phase, start))
            phase_changed = True
            cur = spans[-1]
        if m.phase == cur.name and m.edge == "end":
            spans[-1] = replace(cur, end=t)
        if m.marker == "shards":
            done, total = int(m.values.get("done", 0)), int(m.values.get("total", 0))
            if shards is None or (done, total) != shards:
                shard_moved = True
            shards = (done, total)
        if m.marker == "app_startup_complete" and not startup_complete:
            startup_complete = True
            startup_complete_at = t

    base = _baseline(snap)
    ev = _diff(st.prev, base) if st.prev is not None else Evidence()
    ev = replace(ev, new_lines=new_lines, noise_lines=noise, shard_moved=shard_moved)
    phase = spans[-1].name
    why = _progress(phase, ev, base)
    if phase_changed:
        why = ("phase", *why)
    ev = replace(ev, progress=why)

    quiet = dict(st.quiet_s)
    if st.last_progress_at is not None:
        q = now - st.last_progress_at
        quiet[phase] = max(quiet.get(phase, 0.0), q)
    last_progress_at = now if why else st.last_progress_at
    st = replace(
        st, spans=tuple(spans), fatal=tuple(fatal), shards=shards,
        startup_complete=startup_complete, startup_complete_at=startup_complete_at,
        last_line=last_line, evidence=ev,
        prev=base, phase_base=base if (phase_changed or st.phase_base is None) else st.phase_base,
        last_progress_at=last_progress_at, last_progress=", ".join(why) or st.last_progress,
        quiet_s=quiet,
    )

    # 2. Crashed: a fatal line, the unit failing or restarting, the main PID changing,
    # /health turning 503, or the first completion failing.
    crash = _crash(st, snap, smoke)
    st = _track_unit(st, snap)
    if crash is not None:
        cause, proof, remedy, _ = crash
        return _finish(st, "crashed", cause, proof, remedy, now, budgets)

    # 3. Ready: /health 200 and a real completion with tokens.
    http = snap.http
    health_ok = st.health_ok or (http is not None and http.health_status == 200)
    st = replace(st, health_ok=health_ok)
    if health_ok and smoke is not None and smoke.ok and smoke.tokens > 0:
        proof = f"/health 200 and a completion returned {smoke.tokens} tokens"
        return _finish(st, "ready", None, proof, None, now, budgets)

    # 4. Stalled: alive, no progress for the phase's stall window.
    elapsed, budget, clock_phase = _clock(st, now, budgets)
    quiet_for = now - (now if st.last_progress_at is None else st.last_progress_at)
    window = max(budgets.stall(phase), budgets.stall(clock_phase))
    if not log_only and base.alive and quiet_for >= window:
        label = _label(st)
        line = _describe(st, now, budgets, label)
        proof = f"{line}; no progress evidence for {_mmss(quiet_for)} (stall window " \
            f"{_mmss(window)}); last log line: {st.last_line[:200]!r}"
        hint = STALL_HINTS.get(clock_phase, catalog.REMEDIES["stalled"])
        return _finish(st, "stalled", f"stalled_{clock_phase}", proof, hint, now, budgets)

    # 5. Timed out: past the hard cap, or past a phase budget already extended once.
    since_start = now - started
    if since_start >= budgets.hard_cap_s:
        proof = f"{_mmss(since_start)} since start, hard cap {_mmss(budgets.hard_cap_s)}"
        return _finish(st, "timed_out", "timed_out", proof, catalog.REMEDIES["timed_out"],
                       now, budgets)
    if elapsed > budget and clock_phase in st.extended:
        proof = f"{clock_phase} took {_mmss(elapsed)}, past its budget extended once " \
            f"({_mmss(budget)})"
        return _finish(st, "timed_out", "timed_out", proof, catalog.REMEDIES["timed_out"],
                       now, budgets)

    # 6. Slow: past the budget but progressing: extend once, warn, keep watching.
    verdict = st.verdict
    # A phase past its budget with no recent progress is left to the stall rule.
    if elapsed > budget and clock_phase not in st.extended and quiet_for < window / 2:
        verdict = "slow"
        st = replace(
            st, extended=st.extended | {clock_phase},
            warnings=(*st.warnings, f"{clock_phase} past its budget {_mmss(budget)}: "
                      f"extended once to {_mmss(2 * budget)}"),
        )
    return replace(st, verdict=verdict, summary=_describe(st, now, budgets, _label(st)))


def _crash(
    st: WatchState, snap: Snapshot, smoke: Smoke | None
) -> tuple[str, str, str, WatchState] | None:
    best = _best_fatal(st.fatal)
    unit = snap.unit
    reason: str | None = None
    if unit is not None and unit.error is None and unit.active_state:
        restarts0 = st.restarts0 if st.restarts0 is not None else unit.n_restarts
        if unit.active_state == "failed" or unit.sub_state == "auto-restart":
            reason = f"unit {unit.active_state}/{unit.sub_state}, exit status " \
                f"{unit.exec_main_status}"
        elif st.unit_was_up and unit.active_state in ("inactive", "deactivating"):
            reason = f"unit went {unit.active_state} (exit status {unit.exec_main_status})"
        elif unit.n_restarts > restarts0:
            reason = f"unit restarted: NRestarts {restarts0} → {unit.n_restarts}"
        elif st.main_pid and unit.main_pid and unit.main_pid != st.main_pid:
            reason = f"main PID changed {st.main_pid} → {unit.main_pid}"
    http = snap.http
    if reason is None and st.health_ok and http is not None and http.health_status == 503:
        reason = "/health turned 503: the engine died"
        if best is None:
            return "engine_dead", reason, catalog.REMEDIES["engine_dead"], st
    if best is not None:
        return best[0], best[1], best[2], st
    if reason is not None:
        return "unknown", reason, catalog.REMEDIES["unknown"], st
    if smoke is not None and not smoke.ok and (st.health_ok or _health(snap)):
        proof = f"/health 200 but the first completion failed: {smoke.error or 'no tokens'}"
        return "engine_dead", proof, catalog.REMEDIES["engine_dead"], st
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
    """After a crash on a generic chain line, a later poll may still show the root cause."""
    if state.verdict != "crashed" or (state.cause and catalog.is_specific(state.cause)):
        return state
    for entry in snap.journal.lines:
        m = catalog.classify(entry.text)
        if m.kind == "fatal" and m.cause and catalog.is_specific(m.cause):
            return replace(state, cause=m.cause, proof=entry.text.strip(),
                           remedy=m.remedy or "")
    return state


def ready_from_log(state: WatchState, budgets: Budgets) -> WatchState:
    """Replay of a plain log only: `Application startup complete.` and no fatal error
    stand in for /health 200 + a completion (a log cannot show either; the smoke is
    unknown, not failed). Never used on live snapshots."""
    if state.verdict in TERMINAL or not state.startup_complete or state.fatal:
        return state
    proof = "Application startup complete. (from the log only: /health and a completion " \
        "were not observed)"
    at = state.startup_complete_at
    if at is None:
        at = state.now or 0.0
    return _finish(state, "ready", None, proof, None, at, budgets)


def phase_durations(state: WatchState) -> dict[str, float]:
    """Phase → seconds, for history records (the last open span runs to `now`)."""
    now = state.now or 0.0
    out: dict[str, float] = {}
    for span in state.spans:
        if span.name != "ready":
            out[span.name] = out.get(span.name, 0.0) + max(span.duration(now), 0.0)
    return out


def report(state: WatchState) -> dict[str, object]:
    """The JSON-able result: verdict, cause, proof, remedy, phases, evidence."""
    now = state.now or 0.0
    return {
        "verdict": state.verdict,
        "cause": state.cause,
        "proof": state.proof,
        "remedy": state.remedy,
        "phase": state.phase,
        "phases": [
            {
                "name": s.name,
                "start": s.start,
                "end": s.end,
                "duration_s": round(s.duration(now), 3),
            }
            for s in state.spans
        ],
        "evidence": state.summary,
        "warnings": list(state.warnings),
        "quiet_s": dict(state.quiet_s),
    }
