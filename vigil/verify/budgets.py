"""Phase budgets from history: pure math over past starts.

A start's phase durations are right-skewed (a cold compile is 10x a warm one, a slow
disk doubles a load), so budgets are fitted on log-durations with robust statistics:
budget = exp(median + k * max(1.4826 * MAD, min_spread)), clamped to [floor, cap]. This is the
log-scale cousin of RFC 6298's SRTT + 4*RTTVAR, robust to the odd outlier.

With few samples the key relaxes step by step (exact → same GPU kind and model →
same model → a prior from the weight size and an assumed disk speed). Storage of the
records is elsewhere (SQLite on the host); here are the record type and the functions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from vigil.errors import ConfigError
from vigil.verify.catalog import PHASE, PHASE_RECORDS, PHASES
from vigil.verify.reducer.state import Verdict

WATCHED_PHASES: tuple[str, ...] = PHASES[:-1]  # `ready` has no budget

CacheState = Literal["cold", "warm"]

# Defaults come from the Phase records (catalog/phases.py): one record per phase.
# Quiet windows: how long a phase may show no progress evidence before it is stalled.
DEFAULT_STALL_S: Mapping[str, float] = {p.name: p.stall_s for p in PHASE_RECORDS}
# Budgets with no history and no size information: generous, like a fixed probe.
DEFAULT_PHASE_S: Mapping[str, float] = {p.name: p.budget_s for p in PHASE_RECORDS[:-1]}


def phase_defaults(
    budget_s: Mapping[str, float], stall_s: Mapping[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """The verify role's values (roles/verify/defaults.yml, per host) over the Phase
    records' defaults, by phase name: (budgets, stall windows) with no history."""
    for key, given in (("phase_budget_s", budget_s), ("stall_window_s", stall_s)):
        unknown = sorted(set(given) - set(WATCHED_PHASES))
        if unknown:
            raise ConfigError(f"no watched phase named {unknown[0]!r}", key=key,
                              fix="use one of: " + ", ".join(WATCHED_PHASES))
    return ({**DEFAULT_PHASE_S, **budget_s}, {**DEFAULT_STALL_S, **stall_s})

# No phase budget below this: polls are seconds apart, and a phase that usually takes
# seconds can take a minute on a loaded host without anything being wrong.
FLOOR_S = 60.0
CAP_S = 3600.0  # no phase budget above this
HARD_CAP_S = 7200.0  # the whole start
MIN_SAMPLES = 3
# A phase whose budget was learned from history times out past this multiple of it; a
# phase with a guessed budget never times out (only a stall or the hard cap end it).
TIMEOUT_FACTOR = 3.0


@dataclass(frozen=True)
class Budgets:
    """What the reducer is given: per-phase budgets, stall windows, and the hard cap."""

    phase_s: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_PHASE_S))
    stall_s: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_STALL_S))
    hard_cap_s: float = HARD_CAP_S
    learned: frozenset[str] = frozenset()  # phases whose budget comes from history
    timeout_factor: float = TIMEOUT_FACTOR
    stall_why: Mapping[str, str] = field(default_factory=dict)  # phase -> why this window

    def budget(self, phase: str) -> float:
        rec = PHASE.get(phase)
        return self.phase_s.get(phase, rec.budget_s if rec is not None else 300.0)

    def stall(self, phase: str) -> float:
        rec = PHASE.get(phase)
        return self.stall_s.get(phase, rec.stall_s if rec is not None else 300.0)


@dataclass(frozen=True)
class BudgetKey:
    hardware: str  # e.g. "8xH200-141GB"; "cpu-2c" on CPU hosts
    gpu_kind: str  # e.g. "H200"; "cpu"
    model: str  # model profile name
    config_hash: str  # hash of the vLLM flags and env that change startup
    stack: str  # stack versions, e.g. "vllm=0.33.0,torch=2.10.0,flashinfer=0.6.4"
    cache: CacheState


@dataclass(frozen=True)
class HistoryRecord:
    """One past start, as history stores it."""

    key: BudgetKey
    started_at: float  # epoch s
    verdict: str  # ready, slow, stalled, crashed, timed_out
    phases_s: Mapping[str, float]  # phase → duration
    total_s: float
    cause: str | None = None
    host: str = ""
    # Longest stretch without progress evidence, per phase: sizes stall windows.
    quiet_s: Mapping[str, float] = field(default_factory=dict)
    weights_gib_per_gpu: float | None = None
    gpu_count: int | None = None
    # The start's compile cache (compile_cache.CompileCache.to_record: state, seconds,
    # the hash vLLM logged, why, the factors its key came from); None before vigil kept it.
    compile_cache: Mapping[str, object] | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "key": {
                "hardware": self.key.hardware, "gpu_kind": self.key.gpu_kind,
                "model": self.key.model, "config_hash": self.key.config_hash,
                "stack": self.key.stack, "cache": self.key.cache,
            },
            "started_at": self.started_at, "verdict": self.verdict,
            "phases_s": dict(self.phases_s), "total_s": self.total_s, "cause": self.cause,
            "host": self.host, "quiet_s": dict(self.quiet_s),
            "weights_gib_per_gpu": self.weights_gib_per_gpu, "gpu_count": self.gpu_count,
        }
        # only when kept: a record written before keeps its content, so its id
        if self.compile_cache is not None:
            out["compile_cache"] = dict(self.compile_cache)
        return out


# Relaxation levels, strictest first: the name and the key fields that must match.
LEVELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("exact", ("hardware", "gpu_kind", "model", "config_hash", "stack", "cache")),
    ("gpu_kind+model", ("gpu_kind", "model", "cache")),
    ("model", ("model", "cache")),
)


def _matches(record: HistoryRecord, key: BudgetKey, fields: Sequence[str]) -> bool:
    return all(getattr(record.key, f) == getattr(key, f) for f in fields)


def select_samples(
    records: Iterable[HistoryRecord], key: BudgetKey, *, min_samples: int = MIN_SAMPLES
) -> tuple[str, list[HistoryRecord]]:
    """The strictest level with enough successful starts: (level name, records).

    Only starts that became ready teach a duration; a crash's phases are cut short.
    Returns ("prior", []) when no level has `min_samples`.
    """
    good = [r for r in records if r.verdict in (Verdict.READY, Verdict.SLOW)]
    for name, fields in LEVELS:
        picked = [r for r in good if _matches(r, key, fields)]
        if len(picked) >= min_samples:
            return name, picked
    return "prior", []


def fit_log_robust(
    durations: Sequence[float],
    *,
    k: float = 2.0,
    min_spread: float = math.log(1.3),
    floor: float = FLOOR_S,
    cap: float = CAP_S,
) -> float:
    """exp(median(log d) + k * max(1.4826 * MAD(log d), min_spread)), clamped.

    k=2 is about the 98th percentile of a lognormal; past it a start is `slow`, and
    only TIMEOUT_FACTOR x it times out. min_spread keeps identical samples from giving a
    zero-margin budget: starts that took 60 s five times may still take 80 s the sixth.
    """
    positive = [d for d in durations if d > 0]
    if not positive:
        return floor
    logs = [math.log(d) for d in positive]
    med = statistics.median(logs)
    mad = 1.4826 * statistics.median(abs(x - med) for x in logs)
    budget = math.exp(med + k * max(mad, min_spread))
    return min(max(budget, floor), cap)


def prior_phase_s(
    *,
    weights_gib_per_gpu: float | None,
    gpu_count: int = 1,
    cache: CacheState = "cold",
    disk_gib_s: float = 1.0,
    defaults: Mapping[str, float] = DEFAULT_PHASE_S,
) -> dict[str, float]:
    """Budgets without history: the load phase from the bytes to read at an assumed disk
    speed (x2 margin, all GPUs read from the same disk), compile cold vs warm."""
    out = dict(defaults)
    if weights_gib_per_gpu is not None and weights_gib_per_gpu > 0:
        read_s = weights_gib_per_gpu * max(gpu_count, 1) / max(disk_gib_s, 1e-3)
        out["loading_weights"] = min(max(2.0 * read_s + 60.0, FLOOR_S), CAP_S)
    if cache == "warm":
        out["compiling"] = 300.0
    return out


# With enough good starts of the same key, a stall window shrinks to this multiple of the
# longest quiet stretch they showed (never under FLOOR_S, never over the default): a stuck
# start is called in minutes, not after the generic window.
STALL_FACTOR = 3.0


def stall_window(phase: str, samples: Sequence[HistoryRecord], default: float, *,
                 same_key: bool, min_samples: int = MIN_SAMPLES) -> tuple[float, str]:
    """(window, why) for one phase. Widened to 2x a good start's longest quiet stretch
    when that is above the default; narrowed to STALL_FACTOR x it only from
    ``min_samples`` good starts of the same key (another key's quiet proves nothing)."""
    quiet = [r.quiet_s[phase] for r in samples if phase in r.quiet_s]
    longest = max(quiet, default=0.0)
    if 2.0 * longest > default:
        return (min(2.0 * longest, CAP_S),
                f"widened: a good start was quiet {longest:.0f} s in this phase (2x)")
    if same_key and len(quiet) >= min_samples:
        window = min(max(STALL_FACTOR * longest, FLOOR_S), default)
        why = (f"learned: {STALL_FACTOR:g}x {longest:.0f} s, the longest quiet stretch of "
               f"{len(quiet)} good starts of this key")
        if window == FLOOR_S:
            why += f" (floor {FLOOR_S:.0f} s)"
        elif window == default:
            why += " (capped at the default)"
        return window, why
    shown = len(quiet) if same_key else 0
    return default, (f"default: {shown} of {min_samples} good starts of this key needed "
                     "to learn it")


def stall_plan(samples: Sequence[HistoryRecord],
               defaults: Mapping[str, float] = DEFAULT_STALL_S, *, same_key: bool = False,
               min_samples: int = MIN_SAMPLES) -> tuple[dict[str, float], dict[str, str]]:
    """Every watched phase's stall window and why (see :func:`stall_window`)."""
    out, why = dict(defaults), {}
    for phase in WATCHED_PHASES:
        out[phase], why[phase] = stall_window(phase, samples, defaults[phase],
                                              same_key=same_key, min_samples=min_samples)
    return out, why


def stall_windows(samples: Sequence[HistoryRecord],
                  defaults: Mapping[str, float] = DEFAULT_STALL_S) -> dict[str, float]:
    """Defaults, widened to 2x the longest quiet stretch a successful start has shown."""
    return stall_plan(samples, defaults)[0]


@dataclass(frozen=True)
class BudgetPlan:
    budgets: Budgets
    level: str  # exact | gpu_kind+model | model | prior
    n_samples: int
    source: Mapping[str, str]  # phase → "history" | "prior"


def plan_budgets(
    records: Iterable[HistoryRecord],
    key: BudgetKey,
    *,
    weights_gib_per_gpu: float | None = None,
    gpu_count: int = 1,
    disk_gib_s: float = 1.0,
    min_samples: int = MIN_SAMPLES,
    hard_cap_s: float = HARD_CAP_S,
    defaults: tuple[Mapping[str, float], Mapping[str, float]] = (DEFAULT_PHASE_S,
                                                                 DEFAULT_STALL_S),
) -> BudgetPlan:
    """Budgets for the next start under `key`; ``defaults`` from :func:`phase_defaults`."""
    level, samples = select_samples(records, key, min_samples=min_samples)
    prior = prior_phase_s(
        weights_gib_per_gpu=weights_gib_per_gpu, gpu_count=gpu_count,
        cache=key.cache, disk_gib_s=disk_gib_s, defaults=defaults[0],
    )
    phase_s: dict[str, float] = {}
    source: dict[str, str] = {}
    for phase in WATCHED_PHASES:
        durations = [r.phases_s[phase] for r in samples if phase in r.phases_s]
        if len(durations) >= min_samples:
            phase_s[phase] = fit_log_robust(durations)
            source[phase] = "history"
        else:
            phase_s[phase] = prior[phase]
            source[phase] = "prior"
    totals = [r.total_s for r in samples]
    # The whole start: with history, TIMEOUT_FACTOR x the fitted total (the same stated
    # multiple as a phase; a progressing start is slow before that), never below 1.5x
    # the sum of budgets, never over the hard cap; with none, only the hard cap.
    if totals:
        fitted_total = fit_log_robust(totals, cap=hard_cap_s)
        cap = min(max(TIMEOUT_FACTOR * fitted_total, 1.5 * sum(phase_s.values())),
                  hard_cap_s)
    else:
        cap = hard_cap_s
    stall_s, stall_why = stall_plan(samples, defaults[1], same_key=level == "exact",
                                    min_samples=min_samples)
    return BudgetPlan(
        budgets=Budgets(phase_s=phase_s, stall_s=stall_s, hard_cap_s=cap,
                        learned=frozenset(p for p, src in source.items() if src == "history"),
                        stall_why=stall_why),
        level=level,
        n_samples=len(samples),
        source=source,
    )
