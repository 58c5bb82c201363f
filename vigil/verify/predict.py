"""Predict a start before it happens: per phase, from the history of earlier starts.

Pure: a function of history records and what the next start will be (host, model,
hardware, the compile-cache state expected). The host's own starts of that model and
hardware come first; with fewer than MIN_OWN of them, the fleet's starts of the same
model and hardware (when it has more); else "no history". A prediction is a range, the
median and the 90th percentile of the starts it is based on, with their number, never
one magic number.

The compile-cache state splits history in two: a cold start (compiling) is predicted from
cold starts only, a warm one from warm starts only. A past start counts as what its
compile cache proved (a miss compiled: cold, whatever the directory held; a hit or a
partial: warm), else as what its directory said. The next start's state is expected from
the cache it will find (:func:`expected_cache`): cold when the host has no cache left by a
ready start, or when a factor that enters vLLM's key differs from that start's (a changed
`VLLM_*` variable, flag, stack or hardware predicts a miss, so cold history).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from vigil.verify import compile_cache
from vigil.verify.budgets import WATCHED_PHASES, CacheState, HistoryRecord
from vigil.verify.history import hardware as hardware_of
from vigil.verify.history import stack_versions
from vigil.verify.reducer import Verdict

if TYPE_CHECKING:
    from vigil.desired.targets import Target

Basis = Literal["host", "fleet", "none"]

MIN_OWN = 3  # a host's own starts needed before they outweigh the fleet's
RECENT = 20  # only the latest starts: a fleet's disks, drivers and stacks change
GOOD = (Verdict.READY, Verdict.SLOW)  # only a start that became ready tells how long one takes
SHOWN = 3  # changed factors named in a line; the rest counted


@dataclass(frozen=True)
class Range:
    """Seconds over n starts: the median and the 90th percentile."""

    median_s: float
    p90_s: float
    n: int

    def to_json(self) -> dict[str, Any]:
        return {"median_s": round(self.median_s, 1), "p90_s": round(self.p90_s, 1),
                "n": self.n}


@dataclass(frozen=True)
class Prediction:
    """One host's next start, predicted: whose starts, which cache state, the range of the
    whole start and of each phase (catalog order)."""

    host: str
    model: str
    hardware: str
    cache: CacheState
    cache_why: str  # why this state is expected
    basis: Basis  # the host's own starts, the fleet's, or none
    n: int  # starts it is based on
    total: Range | None = None
    phases: Mapping[str, Range] = field(default_factory=dict)
    # per phase: what the starts took from its beginning to the end (it and every later one)
    rest: Mapping[str, Range] = field(default_factory=dict)
    # a warm prediction's cold twin: what the start takes once its compile cache misses
    if_miss: Prediction | None = None

    def given(self, compile_state: str) -> Prediction:
        """The prediction that holds once the start's compile cache is known: a start
        expected warm that missed compiles, so cold history predicts it."""
        if compile_state == "miss" and self.cache == "warm" and self.if_miss is not None:
            return self.if_miss
        return self

    def line(self) -> str:
        """`expect ~4m10s (p90 5m30s) from 6 starts of this host (warm cache)`."""
        if self.total is None:
            return (f"no history of {self.model} on {self.hardware} ({self.cache} cache): "
                    "no prediction")
        whose = "of this host" if self.basis == "host" else "of the fleet"
        return (f"expect ~{duration(self.total.median_s)} (p90 {duration(self.total.p90_s)})"
                f" from {self.n} start{'s' if self.n != 1 else ''} {whose} "
                f"({self.cache} cache)")

    def error_pct(self, actual_s: float) -> float | None:
        """The median's error, in % of the real start: positive when it predicted longer
        than the start took."""
        if self.total is None or actual_s <= 0:
            return None
        return round(100.0 * (self.total.median_s - actual_s) / actual_s, 1)

    def against(self, actual_s: float) -> str:
        """The final report's line: the prediction and, for a start that became ready, how
        it came out: `predicted ~1m35s (p90 1m50s) from 3 starts …; took 1m29s (+7 %)`."""
        text = self.line().replace("expect ~", "predicted ~", 1)
        err = self.error_pct(actual_s)
        if err is not None:
            text += f"; took {duration(actual_s)} ({err:+.0f} %)"
        return text

    def eta(self, phase: str, in_phase_s: float) -> Range | None:
        """What is left of the start in ``phase`` after ``in_phase_s`` in it, from what the
        past starts took from this phase to the end (`rest`, median and p90 across them:
        at the first phase the same range as the whole start) less the time in it, never
        below what they took after it (an overrun phase is past its prediction, not ahead
        of it). None without history or once ready."""
        if phase not in self.rest:
            return None
        i = WATCHED_PHASES.index(phase)
        after = next((self.rest[p] for p in WATCHED_PHASES[i + 1:] if p in self.rest),
                     Range(0.0, 0.0, self.n))
        here = self.rest[phase]
        return Range(max(here.median_s - in_phase_s, after.median_s),
                     max(here.p90_s - in_phase_s, after.p90_s), self.n)

    def eta_text(self, phase: str, in_phase_s: float) -> str:
        """The live view's cell: `eta ~1m10s (p90 2m05s)`; past the p90 of the phase it is
        in, says so; empty without a prediction."""
        left = self.eta(phase, in_phase_s)
        if left is None:
            return ""
        here = self.phases.get(phase)
        text = f"eta ~{duration(left.median_s)} (p90 {duration(left.p90_s)})"
        if here is not None and in_phase_s > here.p90_s:
            text += f", {phase} past its p90 {duration(here.p90_s)}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "basis": self.basis, "starts": self.n, "cache": self.cache,
                "cache_why": self.cache_why, "model": self.model, "hardware": self.hardware,
                "total": self.total.to_json() if self.total else None,
                "phases": {p: r.to_json() for p, r in self.phases.items()},
                "line": self.line(),
                **({"if_miss": self.if_miss.to_json()} if self.if_miss is not None else {})}


def duration(seconds: float) -> str:
    """`4m10s`, `45s`, `1h02m`: how an operator reads a start time."""
    s = round(max(seconds, 0.0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile by linear interpolation between the sorted values (one value: it)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def range_of(values: Sequence[float]) -> Range | None:
    return Range(quantile(values, 0.5), quantile(values, 0.9), len(values)) if values else None


def proven_cache(rec: HistoryRecord) -> CacheState:
    """How a past start ran: what its compile cache proved, else what its directory held."""
    cc = compile_cache.from_record(rec.compile_cache)
    if cc is not None and cc.state == "miss":
        return "cold"
    if cc is not None and cc.state in ("hit", "partial"):
        return "warm"
    return rec.key.cache


def predict(records: Iterable[HistoryRecord], *, host: str, model: str, hardware: str,
            cache: CacheState, cache_why: str = "") -> Prediction:
    """The next start of ``host`` (see the module doc for whose starts count)."""
    same = [r for r in records if r.verdict in GOOD and r.key.model == model
            and r.key.hardware == hardware and proven_cache(r) == cache]
    same.sort(key=lambda r: r.started_at)
    own = [r for r in same if r.host == host][-RECENT:]
    fleet = same[-RECENT:]
    basis: Basis
    if len(own) >= MIN_OWN or (own and len(fleet) <= len(own)):
        basis, picked = "host", own
    elif fleet:
        basis, picked = "fleet", fleet
    else:
        basis, picked = "none", []
    phases: dict[str, Range] = {}
    rest: dict[str, Range] = {}
    for i, p in enumerate(WATCHED_PHASES):
        got = range_of([r.phases_s[p] for r in picked if p in r.phases_s])
        if got is not None:
            phases[p] = got
        tail = range_of([sum(r.phases_s.get(q, 0.0) for q in WATCHED_PHASES[i:])
                         for r in picked])
        if tail is not None:
            rest[p] = tail
    return Prediction(host=host, model=model, hardware=hardware, cache=cache,
                      cache_why=cache_why, basis=basis, n=len(picked),
                      total=range_of([r.total_s for r in picked]), phases=phases, rest=rest)


def host_hardware(records: Iterable[HistoryRecord], *, host: str, model: str,
                  inventory: str | None) -> str:
    """The hardware part of the key before the host is asked: the inventory's GPUs, else
    (a CPU host, whose key counts its cores) what the host's latest start of the model
    recorded, else the fleet's latest CPU start of it (a new host like the others), else
    `cpu`."""
    if inventory is not None:
        return inventory
    cpu = [r for r in records if r.key.model == model and r.key.hardware.startswith("cpu")]
    mine = [r for r in cpu if r.host == host] or cpu
    return max(mine, key=lambda r: r.started_at).key.hardware if mine else "cpu"


def expected_cache(records: Iterable[HistoryRecord], *, host: str, model: str,
                   hardware: str, factors: Mapping[str, Any],
                   directory: CacheState | None = None) -> tuple[CacheState, str]:
    """(state, why) the next start's compile cache is expected in: warm when the host's
    last ready start that left a cache (compile_cache.reference) had the same factors that
    enter vLLM's key as ``factors`` (the planned start's: compile_cache.factors_of, without
    what only the start shows, such as its GPUs); cold otherwise, naming what differs.
    ``directory``: what the cache directory held when the watch began (verify knows it;
    a plan does not) — an empty one is cold whatever history says."""
    if directory == "cold":
        return "cold", "the cache directory was empty at the start"
    prev = compile_cache.reference(records, host=host, model=model, hardware=hardware)
    if prev is None and directory == "warm":  # a seeded cache: another host's start left it
        prev = compile_cache.reference(records, host=None, model=model, hardware=hardware)
    cc = compile_cache.from_record(prev.compile_cache) if prev is not None else None
    if prev is None or cc is None:
        return "cold", "no ready start of this host left a compile cache"
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(prev.started_at))
    whose = "its" if prev.host == host else f"{prev.host}'s"  # seeded from another host
    hashed = [d[1] for d in compile_cache.differences(cc.factors, factors) if d[2]]
    if hashed:
        more = f"; and {len(hashed) - SHOWN} more" if len(hashed) > SHOWN else ""
        return "cold", f"a miss is expected: since {whose} start of {when} UTC: " + \
            "; ".join(hashed[:SHOWN]) + more
    return "warm", f"the cache of {whose} start of {when} UTC matches"


def target_factors(t: Target, hardware: str, gpus: Sequence[str] = ()) -> dict[str, Any]:
    """The factors of vLLM's cache keys a start of ``t`` will have, as far as they are
    known before it (no vLLM version yet; the GPUs only when a probe named them)."""
    out = compile_cache.factors_of(argv=t.rendered.argv, env=t.rendered.env,
                                   secret_names=t.rendered.secret_names,
                                   stack=stack_versions(t.stack), hardware=hardware,
                                   gpus=gpus)
    if not gpus:
        del out["gpus"]  # unknown is not "none": not compared
    return out


def for_target(records: Sequence[HistoryRecord], t: Target, *, hardware: str,
               directory: CacheState | None = None, gpus: Sequence[str] = ()) -> Prediction:
    """The next start of ``t``: the cache state expected (:func:`expected_cache`), then the
    prediction from the starts of that state."""
    model = t.profile.name
    state, why = expected_cache(records, host=t.name, model=model, hardware=hardware,
                                factors=target_factors(t, hardware, gpus),
                                directory=directory)
    out = predict(records, host=t.name, model=model, hardware=hardware, cache=state,
                  cache_why=why)
    if state == "cold":
        return out
    cold = predict(records, host=t.name, model=model, hardware=hardware, cache="cold",
                   cache_why="the compile cache missed: the start compiles")
    return replace(out, if_miss=cold)


def before_restart(records: Sequence[HistoryRecord], t: Target, *,
                   seeded: bool = False) -> Prediction:
    """A planned restart of ``t`` (deploy --check), before the host is asked anything: the
    hardware from the inventory's GPUs or the host's own records, the cache state from
    the rendered factors against the host's last cache (``seeded``: the plan seeds it
    from another host's start)."""
    gpu = t.vars.gpu
    inventory = hardware_of(t.vars, None)[0] if gpu is not None and gpu.count > 0 else None
    return for_target(records, t, hardware=host_hardware(
        records, host=t.name, model=t.profile.name, inventory=inventory),
        directory="warm" if seeded else None)


@dataclass(frozen=True)
class RolloutPrediction:
    """A rollout's starts, batch after batch: each batch lasts as long as its slowest
    predicted start (median and p90 apart), the batches add up."""

    median_s: float
    p90_s: float
    batches: int  # batches with a predicted restart
    unknown: tuple[str, ...]  # restarting hosts without history: not in the sum

    def line(self) -> str:
        text = (f"rollout: starts expect ~{duration(self.median_s)} "
                f"(p90 {duration(self.p90_s)}) over {self.batches} batch"
                f"{'es' if self.batches != 1 else ''}")
        if self.unknown:
            text += f"; no history for {', '.join(self.unknown)} (not counted)"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"median_s": round(self.median_s, 1), "p90_s": round(self.p90_s, 1),
                "batches": self.batches, "unknown": list(self.unknown), "line": self.line()}


def rollout(batches: Sequence[Sequence[str]],
            predictions: Mapping[str, Prediction]) -> RolloutPrediction:
    """The wall time of the starts of a rollout whose restarting hosts are the keys of
    ``predictions`` (installs and the drain are not predicted)."""
    med = p90 = 0.0
    counted = 0
    unknown: list[str] = []
    for names in batches:
        totals = [t for n in names if n in predictions
                  for t in [predictions[n].total] if t is not None]
        unknown += [n for n in names if n in predictions and predictions[n].total is None]
        if totals:
            counted += 1
            med += max(t.median_s for t in totals)
            p90 += max(t.p90_s for t in totals)
    return RolloutPrediction(med, p90, counted, tuple(unknown))
