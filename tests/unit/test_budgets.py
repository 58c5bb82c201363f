"""Budget math: key relaxation, robust log-scale fit, prior, stall windows."""

from __future__ import annotations

import pytest

from vigil.verify import budgets as B

KEY = B.BudgetKey(hardware="8xH200", gpu_kind="H200", model="kimi", config_hash="c1",
                  stack="vllm=0.33.0", cache="warm")


def rec(key: B.BudgetKey, compile_s: float, *, verdict: str = "ready",
        quiet: float | None = None) -> B.HistoryRecord:
    phases = {"loading_weights": 160.0, "compiling": compile_s, "api_starting": 5.0}
    return B.HistoryRecord(key=key, started_at=0.0, verdict=verdict, phases_s=phases,
                           total_s=sum(phases.values()),
                           quiet_s={"compiling": quiet} if quiet is not None else {})


def test_fit_is_log_scale_robust_and_clamped() -> None:
    same = B.fit_log_robust([100.0] * 5)
    assert same == pytest.approx(100.0 * 1.3**2, rel=1e-6)  # min spread
    with_outlier = B.fit_log_robust([100.0, 105.0, 98.0, 102.0, 5000.0])
    assert with_outlier < 500  # one wild start does not blow the budget up
    assert B.fit_log_robust([1.0, 1.0, 1.0]) == B.FLOOR_S
    assert B.fit_log_robust([3000.0] * 3) == B.CAP_S
    assert B.fit_log_robust([]) == B.FLOOR_S


def test_wider_spread_gives_a_wider_budget() -> None:
    tight = B.fit_log_robust([100, 101, 99, 100, 102])
    loose = B.fit_log_robust([50, 100, 200, 100, 70])
    assert loose > tight


def test_exact_key_wins_when_it_has_enough_samples() -> None:
    records = [rec(KEY, 100.0) for _ in range(3)] + [
        rec(B.BudgetKey("4xH100", "H100", "kimi", "c9", "x", "warm"), 900.0) for _ in range(5)]
    level, picked = B.select_samples(records, KEY)
    assert level == "exact" and len(picked) == 3


def test_key_relaxes_step_by_step() -> None:
    other_host = B.BudgetKey("8xH200-b", "H200", "kimi", "c2", "vllm=0.32.0", "warm")
    other_gpu = B.BudgetKey("8xB200", "B200", "kimi", "c3", "vllm=0.32.0", "warm")
    assert B.select_samples([rec(other_host, 100)] * 3, KEY)[0] == "gpu_kind+model"
    assert B.select_samples([rec(other_gpu, 100)] * 3, KEY)[0] == "model"
    cold = B.BudgetKey("8xH200", "H200", "kimi", "c1", "vllm=0.33.0", "cold")
    assert B.select_samples([rec(cold, 100)] * 3, KEY)[0] == "prior"  # cache state matters
    assert B.select_samples([rec(KEY, 100)] * 2, KEY) == ("prior", [])


def test_failed_starts_do_not_teach_durations() -> None:
    records = [rec(KEY, 100.0, verdict="crashed") for _ in range(5)]
    assert B.select_samples(records, KEY) == ("prior", [])


def test_prior_from_weights_and_disk_speed() -> None:
    prior = B.prior_phase_s(weights_gib_per_gpu=73.7, gpu_count=8, disk_gib_s=2.0)
    assert prior["loading_weights"] == pytest.approx(2 * 73.7 * 8 / 2.0 + 60)
    small = B.prior_phase_s(weights_gib_per_gpu=0.01, gpu_count=1)
    assert small["loading_weights"] == pytest.approx(60.02)
    warm = B.prior_phase_s(weights_gib_per_gpu=None, cache="warm")
    cold = B.prior_phase_s(weights_gib_per_gpu=None, cache="cold")
    assert warm["compiling"] < cold["compiling"]


def test_plan_uses_history_where_it_has_it_and_prior_elsewhere() -> None:
    records = [rec(KEY, c) for c in (600.0, 640.0, 700.0, 620.0)]
    plan = B.plan_budgets(records, KEY, weights_gib_per_gpu=73.7, gpu_count=8)
    assert plan.level == "exact" and plan.n_samples == 4
    assert plan.source["compiling"] == "history" and plan.source["kv_cache"] == "prior"
    assert 700 < plan.budgets.budget("compiling") < 1300
    assert plan.budgets.hard_cap_s <= B.HARD_CAP_S
    assert plan.budgets.hard_cap_s >= sum(plan.budgets.phase_s.values())


def test_plan_without_history_is_the_prior() -> None:
    plan = B.plan_budgets([], KEY, weights_gib_per_gpu=51.0, gpu_count=8)
    assert plan.level == "prior" and set(plan.source.values()) == {"prior"}
    assert plan.budgets.budget("loading_weights") == pytest.approx(2 * 51 * 8 + 60)


def test_stall_windows_widen_to_twice_the_longest_quiet_success() -> None:
    windows = B.stall_windows([rec(KEY, 600, quiet=400.0), rec(KEY, 600, quiet=100.0)])
    assert windows["compiling"] == 800.0
    assert windows["loading_weights"] == B.DEFAULT_STALL_S["loading_weights"]
    assert B.DEFAULT_STALL_S["compiling"] > B.DEFAULT_STALL_S["loading_weights"]


def test_history_record_to_dict_is_plain() -> None:
    d = rec(KEY, 100).to_dict()
    assert d["key"] == {"hardware": "8xH200", "gpu_kind": "H200", "model": "kimi",
                        "config_hash": "c1", "stack": "vllm=0.33.0", "cache": "warm"}
    assert d["phases_s"]["compiling"] == 100.0


def test_guessed_budgets_never_time_out_learned_ones_at_a_stated_multiple() -> None:
    # No history: nothing is learned, so only the hard cap (or a stall) ends a start.
    prior = B.plan_budgets([], KEY_FOR_CAP)
    assert prior.budgets.learned == frozenset()
    assert prior.budgets.hard_cap_s == B.HARD_CAP_S
    # History: phases with samples are learned; the whole-start cap is 3x the fitted
    # total (at least), so a start is slow long before it can time out.
    recs = [B.HistoryRecord(key=KEY_FOR_CAP, started_at=float(i), verdict="ready",
                            phases_s={p: 60.0 for p in B.WATCHED_PHASES}, total_s=480.0)
            for i in range(5)]
    plan = B.plan_budgets(recs, KEY_FOR_CAP)
    assert plan.budgets.learned == frozenset(B.WATCHED_PHASES)
    assert plan.budgets.hard_cap_s >= B.TIMEOUT_FACTOR * 480.0


KEY_FOR_CAP = B.BudgetKey(hardware="8xH200", gpu_kind="H200", model="m", config_hash="c",
                          stack="s", cache="cold")
