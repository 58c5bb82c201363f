"""What the reducer holds: the watch state (phase spans, fatal lines, waits, the baseline
of the last evidence, the verdict) and its records, one per concept; the verdict set.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from vigil.exitcodes import ExitCode
from vigil.verify import catalog
from vigil.verify.compile_cache import CacheEvidence, judge
from vigil.verify.snapshot import CpuLoad

PHASES = catalog.PHASES


class Verdict(StrEnum):
    """A watch's verdict: the one set the reducer, the group watch, the reports and the
    history share. A member is its string (JSON, history and trace files hold the plain
    value); SLOW is the only one that is not an end."""

    READY = "ready"
    SLOW = "slow"  # past its budget and still progressing: the watch goes on
    STALLED = "stalled"
    CRASHED = "crashed"
    TIMED_OUT = "timed_out"
    STOPPED = "stopped"


TERMINAL = frozenset(v for v in Verdict if v is not Verdict.SLOW)
VERDICTS = tuple(Verdict)
# A watch's verdict as the task's exit code (verify, replay, deploy's watch, a group's
# watch); SLOW, or no verdict yet, is not an end of its own.
EXIT: Mapping[Verdict, ExitCode] = {
    Verdict.READY: ExitCode.OK, Verdict.CRASHED: ExitCode.CRASHED,
    Verdict.STALLED: ExitCode.STALLED, Verdict.TIMED_OUT: ExitCode.TIMED_OUT,
    Verdict.STOPPED: ExitCode.STOPPED}


def exit_of(verdict: str | None, unended: ExitCode) -> ExitCode:
    """The task's exit code for a watch's verdict; ``unended`` where it has none that ends."""
    if verdict is None or verdict not in TERMINAL:
        return unended
    return EXIT[Verdict(verdict)]


MOVE_MIB = 64.0
RSS_MOVE = 64 * 1024 * 1024
CPU_BUSY = 0.3  # tree CPU seconds per wall second that count as "working"
# A quiet tree the host starves (its quota's periods throttled, its tasks waiting for a
# CPU, the hypervisor's steal) for at least this share of the quiet time gets a stall
# window stretched in proportion, W / (1 - share), at most MAX_STRETCH x.
STARVED = 0.2
MAX_STRETCH = 4.0
MAX_FATAL = 64
MAX_HINTS = 8
MAX_WARNINGS = 32  # a log of a thousand waits keeps the first few
# "traceback": an uncaught traceback's header at the top (the process is dying) proves a
# crash but names nothing: any other line of the failure is its proof before it.
_RANK = {"root": 0, "exception": 1, "symptom": 2, "chain": 3, "traceback": 4}
WEAK = ("chain", "traceback")  # ranks that prove a crash without naming its cause
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
    rank: str  # root | exception | symptom | chain | traceback
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
    count: int = 1  # how many of its lines (a notice that repeats: how many repeats)
    who: str = ""  # the process that waits (its vLLM prefix), if the line names it

    def describe(self) -> str:
        rec = catalog.WAIT[self.wait]
        told = [p for p in (f"{self.who} says so" if self.who else "",
                            f"{self.count} times" if self.count > 1 else "") if p]
        said = f" ({', '.join(told)})" if told else ""
        return f"waiting {_mmss(self.waited_s)} for {rec.what}{said}"


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
    cpu_load: CpuLoad | None = None  # the host's CPU counters (throttling, pressure, steal)
    # a task of the tree runnable at this poll (state R): only such a tree can be kept from
    # the CPU by the rest of the host; a stopped (T) or sleeping one is not starved
    runnable: bool | None = None


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
    # the baseline of the last poll that saw progress: starvation is measured over the
    # quiet time since (vigil.verify.reducer.evidence.starvation)
    progress_base: Baseline | None = None
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
    verdict: Verdict | None = None
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


def _mmss(seconds: float) -> str:
    s = max(round(seconds), 0)
    return f"{s // 60}:{s % 60:02d}"


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
