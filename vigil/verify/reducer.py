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

Which signals count in which phase, each phase's stall window and hint: the `Phase`
records in the catalog (vigil/verify/catalog/).

Stalled needs a live process tree observed (state R/S/D/T, not all zombies): a plain
log without process data can never prove a stall. After a phase's end marker and
before the next phase's first marker, the time counts against the next phase.

Verdicts: ready, crashed, stalled, timed_out, stopped (terminal); slow (past its budget,
still progressing; watching goes on). The root of a crash is the earliest known root
cause, else the earliest exception line (`Type: message`), else a symptom (the engine
died), else a chain line (`… failed to start`); fatal lines after an orderly stop are
teardown and never a cause. Budgets never overrule evidence: a start past its budget
that keeps progressing is `slow`; `timed_out` needs the hard cap, or a phase past
TIMEOUT_FACTOR x a budget learned from history. Replay of a plain log decides ready when
the serving evidence appears; a later fatal line revokes it (crashed), a later orderly
stop is noted (ready, then stopped); budgets only annotate.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from vigil.verify import catalog
from vigil.verify.budgets import Budgets
from vigil.verify.compile_cache import CacheEvidence, judge
from vigil.verify.compile_cache import fold as fold_cache
from vigil.verify.snapshot import Smoke, Snapshot, Unit

PHASES = catalog.PHASES
TERMINAL = frozenset({"ready", "stalled", "crashed", "timed_out", "stopped"})
VERDICTS = ("ready", "slow", "stalled", "crashed", "timed_out", "stopped")
MOVE_MIB = 64.0
RSS_MOVE = 64 * 1024 * 1024
CPU_BUSY = 0.3  # tree CPU seconds per wall second that count as "working"
MAX_FATAL = 64
MAX_HINTS = 8
MAX_WARNINGS = 32  # a log of a thousand waits keeps the first few
_RANK = {"root": 0, "exception": 1, "symptom": 2, "chain": 3}
# systemd sub-states of a stop job: someone asked the unit to stop.
_STOP_SUBSTATES = frozenset({"stop", "stop-pre", "stop-sigterm", "stop-sigkill",
                             "stop-watchdog"})
# Exit statuses of a clean stop: 0, or killed by SIGTERM/SIGINT/SIGHUP (systemd's clean
# signals), as a signal number or 128+n.
_CLEAN_EXIT = frozenset({0, 2, 15, 130, 143})
# A crash proven only weakly (the unit died, or a chain line such as systemd's "Main
# process exited, code=exited") waits for the journal before naming the cause: journald
# may deliver the engine's last lines after the unit's state or systemd's own line
# (the kill -9 race: `crashed (unknown)` instead of `engine_killed`). A better-ranked
# line ends the wait at once; else the cause is named SETTLE_S after the unit is seen
# dead with systemd's exit line in the journal, and at most EVIDENCE_WAIT_S after the
# weak evidence first came (host time: a replay waits the same).
SETTLE_S = 1.0
EVIDENCE_WAIT_S = 5.0
_SYSTEMD_EXIT = re.compile(r"\.service: (Main process exited|Failed with result)")


# What vLLM's own teardown produces (the engine client finding the engine gone): after
# its teardown lines these are the stop's consequence; any other failure after them is
# what made vLLM tear down (a killed engine core, an OOM).
_TEARDOWN_CAUSES = frozenset({"engine_dead"})


@dataclass(frozen=True)
class Fatal:
    """A fatal line: its cause, the line, the remedy, its rank and when it came."""

    cause: str
    proof: str
    remedy: str
    rank: str  # root | exception | symptom | chain
    at: float
    after_stop: bool = False  # after a stop someone asked for: its teardown, not a cause


@dataclass(frozen=True)
class Waiting:
    """A wait the log reports (catalog.WAITS), from its first line to its last: how long
    the start has waited, by the lines' clock or by what the line itself says."""

    wait: str  # the Wait id
    since: float
    last: float
    waited_s: float
    line: str

    def describe(self) -> str:
        rec = catalog.WAIT[self.wait]
        return f"waiting {_mmss(self.waited_s)} for {rec.what}"


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
    # NVML's "used" counts the driver's reservation (615 MiB per H200, measured) and
    # nvidia-smi's does not: readings from different sources are never compared
    gpu_source: str
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
    serving_at: float | None = None  # requests answered, throughput stats, uvicorn bound
    serving_line: str = ""
    # an offline harness's last batch finished (its progress bar at N/N), nothing asked
    # since: the engine is idle and the harness may be exiting
    offline_idle_at: float | None = None
    stop_at: float | None = None  # an orderly stop began (systemd stop job, SIGTERM, …)
    stop_line: str = ""
    stop_asked: bool = False  # a stop's trigger seen (not only vLLM's own teardown lines)
    # the wait the log reports now (Ray placement group, rendezvous…): what a stall or a
    # stop during it is about; ended by the start's next real evidence
    waiting: Waiting | None = None
    begun: bool = False  # a vLLM line of this start was seen (a stop before it is the last run's)
    ready_at: float | None = None
    health_ok: bool = False
    shards: tuple[int, int] | None = None
    extended: frozenset[str] = frozenset()  # phases already reported slow
    warnings: tuple[str, ...] = ()
    fatal: tuple[Fatal, ...] = ()  # in the order seen
    # Lines that name a cause without proving a crash (catalog hints), first few seen:
    # they name a crash nothing better explains.
    hints: tuple[Fatal, ...] = ()
    last_line: str = ""
    # The last ERROR line that classified as nothing, with its source and process: if a
    # traceback follows it from the same logger, it was logger.exception()'s message.
    error_line: tuple[str | None, str | None, str] | None = None
    # multiprocessing's "Process NAME:" header of a dying child, while its traceback may
    # still follow (lines left: other processes' lines can come in between).
    child_died: tuple[str, int] | None = None
    evidence: Evidence = Evidence()
    weak_crash_at: float | None = None  # a crash proven only weakly, first seen (waiting)
    exit_line_at: float | None = None  # systemd's "Main process exited" line of this start
    verdict: str | None = None
    cause: str | None = None
    proof: str | None = None
    remedy: str | None = None
    summary: str = ""
    polls: int = 0
    # vLLM's compile-cache lines and the cache's size, for compile_cache.assess
    compile_cache: CacheEvidence = field(default_factory=CacheEvidence)

    @property
    def phase(self) -> str:
        return self.spans[-1].name if self.spans else "bootstrap"


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
        gpu_source=gpus.source if gpus is not None else "",
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
    if a.gpu_mib is None or b.gpu_mib is None or a.gpu_source != b.gpu_source:
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
    seen: list[str] = []
    if ev.new_lines:
        seen.append("log")
    if ev.shard_moved:
        seen.append("shards")
    if ev.gpu_delta_mib is not None and ev.gpu_delta_mib >= MOVE_MIB:
        seen.append("gpu memory")
    cache_grew = bool(
        (ev.cache_delta_files or 0) > 0 or (ev.cache_delta_bytes or 0) > 0 or ev.cache_newer
    )
    if cache_grew:
        seen.append("compile cache")
    if ev.rss_delta_bytes is not None and abs(ev.rss_delta_bytes) >= RSS_MOVE:
        seen.append("rss")
    rec = catalog.PHASE[phase]
    busy = ev.cpu_ratio is not None and ev.cpu_ratio >= CPU_BUSY
    if busy:
        # CPU counts where it is the work, or where none of the phase's own signals can
        # be observed (no GPUs, no readable cache): then it is the best evidence left.
        observable = {"gpu memory": base.gpu_mib is not None,
                      "rss": base.rss_bytes is not None,
                      "compile cache": base.cache_files is not None}
        own_missing = bool(rec.own_signals) and not any(
            observable.get(sig, True) for sig in rec.own_signals)
        if "cpu" in rec.progress or own_missing:
            seen.append("cpu")
    return tuple(sig for sig in seen if sig in rec.progress or sig == "cpu")


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


def _finish(state: WatchState, verdict: str, cause: str | None, proof: str | None,
            remedy: str | None, now: float, budgets: Budgets) -> WatchState:
    spans = state.spans
    if verdict != "ready" and spans and spans[-1].end is not None \
            and spans[-1].name not in ("api_starting", "ready"):
        # Past a phase's end marker the start is in the next phase (the clock says so
        # too): a failure there is that phase's.
        nxt = PHASES[PHASES.index(spans[-1].name) + 1]
        spans = (*spans, PhaseSpan(nxt, spans[-1].end, now))
    if spans and spans[-1].end is None:
        spans = (*spans[:-1], replace(spans[-1], end=now))
    if verdict == "ready":
        if spans and spans[-1].name == "ready":
            spans = (*spans[:-1], PhaseSpan("ready", spans[-1].start, now))
        else:
            spans = (*spans, PhaseSpan("ready", now, now))
    done = replace(state, verdict=verdict, cause=cause, proof=proof, remedy=remedy,
                   ready_at=now if verdict == "ready" else state.ready_at)
    return replace(done, spans=spans, summary=_describe(state, now, budgets, _label(state)))


def _advance(spans: list[PhaseSpan], phase: str, t: float) -> bool:
    """Move to `phase` if it is later than the current one (forward only: interleaved
    ranks and the V2 runner's early graph capture would otherwise bounce it)."""
    cur = spans[-1]
    if catalog.phase_index(phase) <= catalog.phase_index(cur.name):
        return False
    start = cur.end if cur.end is not None else t
    if cur.end is None:
        spans[-1] = replace(cur, end=t)
    spans.append(PhaseSpan(phase, start))
    return True


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
    if cur is None or cur.wait != m.wait:
        since = min(t, t - said) if said else t
        new = Waiting(m.wait, since, t, max(said, 0.0), text.strip()[:300])
        rec = catalog.WAIT[m.wait]
        note = f"{new.describe()}: {new.line[:160]}"
        if rec.cause is not None:
            note += f" (if it never comes: {rec.cause})"
        warnings = st.warnings if len(st.warnings) >= MAX_WARNINGS else (*st.warnings, note)
        return replace(st, waiting=new, warnings=warnings)
    return replace(st, waiting=replace(cur, last=t, waited_s=max(t - cur.since, said),
                                       line=text.strip()[:300]))


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


def _fold_lines(st: WatchState, snap: Snapshot, now: float) -> tuple[_Fold, WatchState]:
    f = _Fold(spans=list(st.spans), fatal=list(st.fatal), shards=st.shards, st=st)
    for entry in snap.journal.lines:
        t = min(entry.us / 1e6, now) if entry.us > 0 else now
        if f.st.exit_line_at is None and _SYSTEMD_EXIT.search(entry.text) and (
                f.st.started_at is None or t >= f.st.started_at):
            f.st = replace(f.st, exit_line_at=now)
        m = catalog.classify(entry.text)
        if m.kind == "noise":
            f.noise += 1
            if m.wait is not None and not (f.st.started_at is not None
                                           and t < f.st.started_at):
                # a wait line is this start's own (a stop after it is this start's stop)
                f.st = replace(_waited(f.st, m, entry.text, t), begun=True)
                if m.reached is not None and f.st.verdict != "ready":
                    f.phase_changed |= _advance(f.spans, m.reached, t)
            continue
        if m.kind == "other" and not m.line.message:
            continue
        f.new_lines += 1
        logged = _logged_exception(f.st.error_line, m)
        died = _child_traceback(f.st.child_died, m)
        f.st = replace(f.st, last_line=m.line.message, error_line=_error_line(m, entry.text),
                       child_died=_child_header(f.st.child_died, m, entry.text))
        if died is not None and len(f.fatal) < MAX_FATAL and not (
                f.st.started_at is not None and t < f.st.started_at):
            f.fatal.append(Fatal("unknown", died[:2000], catalog.remedy_for("unknown"),
                                 "chain", t, after_stop=f.st.stop_asked))
        # Ctrl-C reaches the children too: the chain links of a traceback that a
        # KeyboardInterrupt closes are the stop's, not a failure.
        if m.kind == "stop" and m.stop == "trigger":
            i = len(f.fatal)
            while i > 0 and f.fatal[i - 1].rank == "chain" and \
                    catalog.is_traceback_link(f.fatal[i - 1].proof):
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
        if m.reached is not None and f.st.verdict != "ready":
            f.phase_changed |= _advance(f.spans, m.reached, t)
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
                m.cause, entry.text.strip()[:2000], m.remedy or "", "hint", t,
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
                           stop_line=f.st.stop_line or entry.text.strip()[:200])
        if m.kind == "fatal" and m.cause is not None:
            rank = "exception" if (m.role == "root" and m.cause == "unknown") else (
                m.role or "chain")
            item = Fatal(m.cause, entry.text.strip()[:2000], m.remedy or "", rank, t,
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
                f.st = replace(f.st, stop_at=t, stop_line=entry.text.strip()[:200])
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
    if state.verdict == "ready":
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
            return _finish(st, "stopped", cause, proof,
                           catalog.remedy_for(cause) if cause else None, now, budgets)
        return _finish(st, "stopped", None, stop, None, now, budgets)

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
        return _finish(st, "crashed", cause, proof, remedy, now, budgets)

    # 4. Ready: /health 200 and a real completion with tokens; from a plain log, the
    # serving evidence, when it appears.
    http = snap.http
    health_ok = st.health_ok or (http is not None and http.health_status == 200)
    st = replace(st, health_ok=health_ok)
    if health_ok and smoke is not None and smoke.ok and smoke.tokens > 0:
        proof = f"/health 200 and a completion returned {smoke.tokens} tokens"
        return _finish(st, "ready", None, proof, None, now, budgets)
    if log_only and (st.serving_at is not None or st.startup_complete):
        return _ready_from_log(st, budgets)

    # 5. Stalled: alive, no progress for the phase's stall window.
    elapsed, budget, clock_phase = _clock(st, now, budgets)
    quiet_for = now - (now if st.last_progress_at is None else st.last_progress_at)
    window = max(budgets.stall(phase), budgets.stall(clock_phase))
    if not log_only and base.alive and quiet_for >= window:
        label = _label(st)
        line = _describe(st, now, budgets, label)
        proof = f"{line}; no progress evidence for {_mmss(quiet_for)} (stall window " \
            f"{_mmss(window)}); last log line: {st.last_line[:200]!r}"
        hint = catalog.PHASE[clock_phase].stall_hint or catalog.VERDICT_REMEDIES["stalled"]
        waiting = st.waiting
        cause = catalog.WAIT[waiting.wait].cause if waiting is not None else None
        if waiting is not None and cause is not None:
            # a wait that can never end on its own: stalled, and what it waits for
            proof = f"{waiting.describe()} ({waiting.line[:200]}); {proof}"
            return _finish(st, "stalled", cause, proof, catalog.remedy_for(cause), now,
                           budgets)
        return _finish(st, "stalled", f"stalled_{clock_phase}", proof, hint, now, budgets)

    # 6. Timed out: the hard cap, or a phase past a stated multiple of a budget learned
    # from history. A guessed budget never ends a start that keeps progressing.
    since_start = now - started
    if not log_only and since_start >= budgets.hard_cap_s:
        proof = f"{_mmss(since_start)} since start, hard cap {_mmss(budgets.hard_cap_s)}"
        return _finish(st, "timed_out", "timed_out", proof,
                       catalog.VERDICT_REMEDIES["timed_out"], now, budgets)
    limit = budgets.timeout_factor * budget
    if not log_only and clock_phase in budgets.learned and elapsed > limit:
        proof = f"{clock_phase} took {_mmss(elapsed)}, past {budgets.timeout_factor:g}x " \
            f"its learned budget {_mmss(budget)} ({_mmss(limit)})"
        return _finish(st, "timed_out", "timed_out", proof,
                       catalog.VERDICT_REMEDIES["timed_out"], now, budgets)

    # 7. Slow: past the budget and still progressing: say how far over, keep watching.
    verdict = st.verdict
    if clock_phase != "ready" and elapsed > budget and quiet_for < window / 2:
        verdict = "slow"
        if clock_phase not in st.extended:
            source = "learned" if clock_phase in budgets.learned else "default"
            st = replace(
                st, extended=st.extended | {clock_phase},
                warnings=(*st.warnings, f"{clock_phase} past its budget {_mmss(budget)} "
                          f"({source}) and still progressing"),
            )
    summary = _describe(st, now, budgets, _label(st))
    if verdict == "slow" and budget > 0:
        summary += f" (slow: {elapsed / budget:.1f}x its budget)"
    return replace(st, verdict=verdict, summary=summary)


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


def _wait_hint(st: WatchState, waiting: Waiting, what: str, t: float) -> tuple[Fatal, ...]:
    """The hints with the wait the start was in when `what` (a chain line, the unit's end)
    came: a wait that can never end names what an exit nothing else explains died of."""
    cause = catalog.WAIT[waiting.wait].cause
    if cause is None or len(st.hints) >= MAX_HINTS:
        return st.hints
    proof = f"{what[:200]}, after {waiting.describe()} ({waiting.line[:200]})"
    return (*st.hints, Fatal(cause, proof, catalog.remedy_for(cause), "hint", t,
                             after_stop=st.stop_asked))


def _hinted(st: WatchState, crash: tuple[str, str, str]) -> tuple[str, str, str]:
    """A crash of unknown cause, proven only by a chain line or the unit's state, takes its
    cause from the first hint of this start (NCCL's WARN naming the CUDA call that failed
    before "WorkerProc failed to start."; the wait it died in, e.g. TCPStore's retries).
    A root cause, an exception line or a symptom keeps its own; a hint alone is never a
    crash."""
    best = _best_fatal(st.fatal)
    if crash[0] != "unknown" or (best is not None and best.rank != "chain"):
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
    return best.rank == "chain" and crash[1] == best.proof


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
    if state.verdict != "crashed" or not state.fatal:
        return state
    fatal = list(state.fatal)
    hints = list(state.hints)
    for entry in snap.journal.lines:
        m = catalog.classify(entry.text)
        if m.role == "hint" and m.cause is not None and len(hints) < MAX_HINTS:
            hints.append(Fatal(m.cause, entry.text.strip()[:2000], m.remedy or "", "hint",
                               snap.time))
        if m.kind == "fatal" and m.cause is not None:
            rank = "exception" if (m.role == "root" and m.cause == "unknown") else (
                m.role or "chain")
            fatal.append(Fatal(m.cause, entry.text.strip(), m.remedy or "", rank,
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
    return _finish(st, "ready", None, proof, None, at, budgets)


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
        return replace(st, spans=spans, verdict="crashed", cause=best.cause, proof=proof,
                       remedy=best.remedy)
    if st.stop_at is not None and state.stop_at is None:
        st = replace(st, warnings=(*st.warnings, f"ready, then stopped at "
                                   f"{_mmss(st.stop_at - (st.started_at or st.stop_at))}: "
                                   f"{st.stop_line}"))
    return st


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
        "ready_at": state.ready_at,
        "stopped_at": state.stop_at,
        "warnings": list(state.warnings),
        "quiet_s": dict(state.quiet_s),
        "compile_cache": judge(
            state.compile_cache, phase_durations(state).get("compiling")).to_json(),
    }
