"""Replay on real users' logs from public issues (tests/fixtures/real-logs/).

Each log is verbatim (markdown fences and quote markers removed); CASES.tsv gives the
answer taken from the thread, decided before vigil ran on it. HELDOUT.tsv is the fifth
kept out of sight while the catalog's rules were written: its score is reported
separately (bench/verdicts/RESULTS.md) and only guarded here against regressions.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.paths import FIXTURES
from vigil.verify import reducer, replay
from vigil.verify.budgets import Budgets
from vigil.verify.snapshot import Journal, LogLine, Snapshot

HERE = FIXTURES / "real-logs"


def _rows(name: str) -> list[dict[str, str]]:
    with (HERE / name).open() as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


CASES = _rows("CASES.tsv")
HELDOUT = _rows("HELDOUT.tsv")
# A second harvest (25 logs, failure modes the first lacked), scored before any rule
# was changed for it; see bench/verdicts/RESULTS.md.
HARVEST2 = _rows("HARVEST2.tsv")
# Harvested after the rules for HARVEST2 were frozen and never tuned on: a true held-out
# score for the new causes, guarded here only against regressions.
HARVEST3 = _rows("HARVEST3.tsv")
# A fourth harvest (32 logs: Ray placement groups, NCCL watchdogs, CPU/XPU/TPU/NPU/ROCm,
# journald, k8s and compose shapes, good and slow starts), labelled from the threads and
# scored held out before any rule changed for it (26/32); see bench/verdicts/RESULTS.md.
HARVEST4 = _rows("HARVEST4.tsv")
# Harvested after the HARVEST4 rules were committed (NCCL watchdogs, V0 Ray worker
# wrappers) and never tuned on: their held-out check, guarded against regressions.
HARVEST5 = _rows("HARVEST5.tsv")
# A sixth harvest (25 logs: OOM and KV-cache shortfalls per phase, NCCL init failures,
# port/permission/401 starts, slow 0.10-0.2x starts), labelled from the threads and
# scored held out before any rule changed for it (21/25); see bench/verdicts/RESULTS.md.
HARVEST6 = _rows("HARVEST6.tsv")
# Harvested after the HARVEST6 rules were committed, on what the earlier ones were thin
# on (trust_remote_code, broken flash-attn installs): their held-out check (2/7).
HARVEST7 = _rows("HARVEST7.tsv")
# Harvested after the HARVEST7 rules (port-in-use restart loops, chain-only excerpts of
# multi-node and TP starts): held out, 4/4.
HARVEST8 = _rows("HARVEST8.tsv")
# A ninth harvest (12 logs: eagle3 drafter, FP8 on sm80, driver too old, flashinfer without
# nvcc, LoRA rank, V100 on 0.11, data parallel), held out 5/12 before its rules, 9/12 after.
HARVEST9 = _rows("HARVEST9.tsv")
# A tenth harvest (20 logs: TPU, Gaudi 1, ROCm APUs, XPU, Kunlun, launcher-wrapped and
# CloudWatch-exported lines, docker RFC3339 stamps, cut healthy starts), held out 17/20,
# 18/20 after the child-traceback rule.
HARVEST10 = _rows("HARVEST10.tsv")
# An eleventh harvest (23 logs: NCCL in TP, Ray without a GPU, sampler-warmup OOM, frames-only
# excerpts, kubeai/compose/kaito wrappers), held out 19/23, 21/23 after the NCCL hint and the
# bfloat16-check frames.
HARVEST11 = _rows("HARVEST11.tsv")
# A twelfth harvest in its own folder (18 logs, issue 24.1-3: NPU/XPU/TPU/ROCm out of memory
# and no-kernel wordings, Blackwell and Thor CUTLASS refusals, OOM at graph capture and
# loading), a fifth of it (HELDOUT12) kept out of the rule writing; 8/14 and 1/4 before
# its rules, 14/14 and 4/4 after.
HERE12 = FIXTURES / "real-logs-12"


def _rows12(name: str) -> list[dict[str, str]]:
    with (HERE12 / name).open() as fh:
        return [{**r, "file": str(HERE12 / r["file"])} for r in csv.DictReader(fh, delimiter="\t")]


HARVEST12 = _rows12("HARVEST12.tsv")
HELDOUT12 = _rows12("HELDOUT12.tsv")
# Harvested after the HARVEST12 rules froze (8 logs: ROCm OOM, GB10 ptxas, graph-capture and
# warmup OOM), held out 6/8, 8/8 after the ptxas rule.
HERE13 = FIXTURES / "real-logs-13"
with (HERE13 / "HARVEST13.tsv").open() as _fh:
    HARVEST13 = [{**r, "file": str(HERE13 / r["file"])}
                 for r in csv.DictReader(_fh, delimiter="\t")]
ALL = (CASES + HELDOUT + HARVEST2 + HARVEST3 + HARVEST4 + HARVEST5 + HARVEST6 + HARVEST7
       + HARVEST8 + HARVEST9 + HARVEST10 + HARVEST11 + HARVEST12 + HELDOUT12
       + HARVEST13)
# Rendezvous that gave up (issue 24.4): 1/2 before distributed_init_timeout, 2/2 after.
HERE14 = FIXTURES / "real-logs-14"
with (HERE14 / "HARVEST14.tsv").open() as _fh:
    HARVEST14 = [{**r, "file": str(HERE14 / r["file"])}
                 for r in csv.DictReader(_fh, delimiter="\t")]
ALL += HARVEST14
# Several starts in one log and dying after ready (issue 24.5-6): 4/12 and 1/3 held out
# before the start splitter and the after-ready rules, 12/12 and 3/3 after.
HERE15 = FIXTURES / "real-logs-15"


def _rows15(name: str) -> list[dict[str, str]]:
    with (HERE15 / name).open() as fh:
        return [{**r, "file": str(HERE15 / r["file"])} for r in csv.DictReader(fh, delimiter="\t")]


HARVEST15 = _rows15("HARVEST15.tsv")
HELDOUT15 = _rows15("HELDOUT15.tsv")
ALL += HARVEST15 + HELDOUT15
# Other platforms' wordings and waits that can never end (issue 24.1, 24.4, 24.7): Ray
# placement groups, rendezvous timeouts, TPU/Neuron/XPU memory, cut waits; 5/10 and 3/3
# held out before the rules, 10/10 and 3/3 after.
HERE16 = FIXTURES / "real-logs-16"


def _rows16(name: str) -> list[dict[str, str]]:
    with (HERE16 / name).open() as fh:
        return [{**r, "file": str(HERE16 / r["file"])} for r in csv.DictReader(fh, delimiter="\t")]


HARVEST16 = _rows16("CASES.tsv")
HELDOUT16 = _rows16("HELDOUT.tsv")
# Harvested after those rules were committed (a rendezvous timeout, ROCm without kernels for
# the GPU): 3/4 when first scored, 4/4 after the torch-rendezvous frames.
POSTFREEZE16 = _rows16("POSTFREEZE.tsv")
ALL += HARVEST16 + HELDOUT16 + POSTFREEZE16
# The logs of HARVEST15/HELDOUT15 that hold several starts, and how many.
SEVERAL_STARTS = {
    "clawd-v0151-systemd-kv-cache-small-then-restart-ready.log": 2,
    "clawd-v0151-systemd-gpu-held-restart-loop-last-just-started.log": 3,
    "clawd-systemd-203-exec-restart-loop-stop-then-start.log": 51,
    "imageworks-v0102-nohup-gpu-held-relaunch-ready-stopped.log": 2,
    "gemma4-neuron-v0160-docker-restart-loop-keyerror-x5.log": 6,
    "vllm-11834-v064-k8s-serving-shutdown-then-restart.log": 2,
    "gemma4-neuron-v0160-ready-oob-fatal-then-container-restart.log": 2,
}
# Known phase misses: the log itself does not show the phase the thread names.
PHASE_NOT_IN_LOG = {
    "vllm-11485-v0-determine-blocks-no-kernel-image.log",  # method name only in the title
    "vllm-12233-v0-engine-process-died-mq-dead.log",  # no request line in the excerpt
    "vllm-4327-fp8-capability-86-ray.log",  # the paste puts the error above the worker frames
}


def _got(row: dict[str, str]) -> tuple[str, str, str | None]:
    out = replay.replay_file(HERE / row["file"])
    return out["verdict"] or "undecided", out["cause"] or "-", out["phase"]


def test_the_corpus_is_large_and_every_file_is_listed_once() -> None:
    first = [r["file"] for r in CASES + HELDOUT]
    later = (HARVEST2 + HARVEST3 + HARVEST4 + HARVEST5 + HARVEST6 + HARVEST7 + HARVEST8
             + HARVEST9 + HARVEST10 + HARVEST11)
    files = first + [r["file"] for r in later]
    # 62 + 25 + 7 + 32 + 8 + 25 + 7 + 4 + 12 + 20 + 23 harvested + 14 shared
    assert len(files) == len(set(files)) >= 239
    assert len(HELDOUT) * 5 >= len(first) - 14  # a fifth of the first harvest held out
    on_disk = {p.name for p in HERE.glob("*.log")}
    assert on_disk == set(files)
    for r in CASES + HELDOUT + later:
        assert r["issue_url"].startswith("https://github.com/"), r["file"]
        assert r["expected_verdict"] in {"ready", "crashed", "undecided", "stopped"}


@pytest.mark.parametrize("row", CASES, ids=[r["file"] for r in CASES])
def test_verdict_and_cause(row: dict[str, str]) -> None:
    verdict, cause, phase = _got(row)
    assert (verdict, cause) == (row["expected_verdict"], row["expected_cause"])
    if row["last_phase"] != "-" and row["file"] not in PHASE_NOT_IN_LOG:
        assert phase == row["last_phase"]


@pytest.mark.parametrize("row", HARVEST2, ids=[r["file"] for r in HARVEST2])
def test_second_harvest(row: dict[str, str]) -> None:
    verdict, cause, phase = _got(row)
    assert (verdict, cause) == (row["expected_verdict"], row["expected_cause"])
    if row["last_phase"] != "-" and row["file"] not in PHASE_NOT_IN_LOG:
        assert phase == row["last_phase"]


def test_held_out_fifth_does_not_regress() -> None:
    both = sum(_got(r)[:2] == (r["expected_verdict"], r["expected_cause"]) for r in HELDOUT)
    assert both >= 16, f"{both}/{len(HELDOUT)}"  # 15/17 frozen; 16: custom formats


def test_post_freeze_harvest_does_not_regress() -> None:
    both = sum(_got(r)[:2] == (r["expected_verdict"], r["expected_cause"]) for r in HARVEST3)
    assert both >= 7, f"{both}/{len(HARVEST3)}"  # 6/7 when first scored, 7/7 since HARVEST4


# Each later harvest's floor: its held-out score (before any rule change) and the score
# after the rules it prompted; a rule change may raise a floor, never lower it.
HARVEST_FLOORS = [
    # 26/32 held out; 31/32 after the rules it prompted
    pytest.param(HARVEST4, 31, id="HARVEST4"),
    pytest.param(HARVEST5, 6, id="HARVEST5"),  # 6/8 held out
    # 21/25 held out; 25/25 after the rules it prompted
    pytest.param(HARVEST6, 25, id="HARVEST6"),
    # 2/7 held out; 6/7 after the rules it prompted
    pytest.param(HARVEST7, 6, id="HARVEST7"),
    pytest.param(HARVEST8, 4, id="HARVEST8"),  # 4/4 held out
    # 5/12 held out; 9/12 after the fp8e4nv, nvcc and LoRA-rank rules; 11/12 once a dying
    # child's traceback and engine-core frames are chain links (HARVEST10). Left: a worker
    # relay of a Triton error cut after its first line, read as a symptom.
    pytest.param(HARVEST9, 11, id="HARVEST9"),
    # 17/20 held out; 18/20 after (a launcher-relayed dying child). Left: Gaudi 1's PT_LAZY
    # fatal (unsupported hardware, one log) and an empty "Failed core proc(s): {}" read as
    # a kill (the root is outside the excerpt).
    pytest.param(HARVEST10, 18, id="HARVEST10"),
    # 19/23 held out; 21/23 after NCCL's WARN became a hint and vLLM's bfloat16 checks a
    # frame (with FastChat's relay unwrapped). Left: two frames-only excerpts whose frames
    # prove no failure (a flashinfer module fetch, a weights download).
    pytest.param(HARVEST11, 21, id="HARVEST11"),
    # 8/14 held out; 14/14 after the platform OOM, HIP no-code-object and CUTLASS rules
    pytest.param(HARVEST12, 14, id="HARVEST12"),
    # 1/4 held out (never tuned on; read when labelled); 4/4 after HARVEST12's rules
    pytest.param(HELDOUT12, 4, id="HELDOUT12"),
    # 6/8 held out (after the HARVEST12 rules); 8/8 after the ptxas rule
    pytest.param(HARVEST13, 8, id="HARVEST13"),
    # 1/2 before the rendezvous-timeout cause; 2/2 after
    pytest.param(HARVEST14, 2, id="HARVEST14"),
    # 4/12 before the start splitter and the after-ready rules; 12/12 after
    pytest.param(HARVEST15, 12, id="HARVEST15"),
    # 1/3 held out (never tuned on); 3/3 after HARVEST15's rules
    pytest.param(HELDOUT15, 3, id="HELDOUT15"),
    # 5/10 before the platform wordings, the Ray causes and the waits; 10/10 after
    pytest.param(HARVEST16, 10, id="HARVEST16"),
    # 3/3 held out (never tuned on), 3/3 after
    pytest.param(HELDOUT16, 3, id="HELDOUT16"),
    # 3/4 harvested after the rules froze; 4/4 after the cut TCPStore count and its frames
    pytest.param(POSTFREEZE16, 4, id="POSTFREEZE16"),
]


@pytest.mark.parametrize(("rows", "floor"), HARVEST_FLOORS)
def test_a_later_harvest_does_not_regress(rows: list[dict[str, str]], floor: int) -> None:
    both = sum(_got(r)[:2] == (r["expected_verdict"], r["expected_cause"]) for r in rows)
    assert both >= floor, f"{both}/{len(rows)}"


def test_the_twelfth_harvest_is_listed_once_with_its_sources() -> None:
    files = [Path(r["file"]).name for r in HARVEST12 + HELDOUT12]
    assert len(files) == len(set(files)) == 18
    assert len(HELDOUT12) * 5 >= len(files) - 4  # a fifth held out
    assert {p.name for p in HERE12.glob("*.log")} == set(files)
    for r in HARVEST12 + HELDOUT12 + HARVEST13:
        assert r["issue_url"].startswith("https://github.com/"), r["file"]
    assert {p.name for p in HERE13.glob("*.log")} == {Path(r["file"]).name for r in HARVEST13}
    assert {p.name for p in HERE14.glob("*.log")} == {Path(r["file"]).name for r in HARVEST14}


def test_the_fifteenth_harvest_is_listed_once_with_its_sources() -> None:
    files = [Path(r["file"]).name for r in HARVEST15 + HELDOUT15]
    assert len(files) == len(set(files)) == 15
    assert len(HELDOUT15) * 5 >= len(files)  # a fifth held out
    assert {p.name for p in HERE15.glob("*.log")} == set(files)
    for r in HARVEST15 + HELDOUT15:
        assert r["issue_url"].startswith("https://github.com/"), r["file"]


def test_the_sixteenth_harvest_is_listed_once_with_its_sources() -> None:
    files = [Path(r["file"]).name for r in HARVEST16 + HELDOUT16 + POSTFREEZE16]
    assert len(files) == len(set(files)) == 17
    assert len(HELDOUT16) * 5 >= len(HARVEST16 + HELDOUT16)  # a fifth held out
    assert {p.name for p in HERE16.glob("*.log")} == set(files)
    for r in HARVEST16 + HELDOUT16 + POSTFREEZE16:
        assert r["issue_url"].startswith("https://github.com/"), r["file"]
        assert r["expected_verdict"] in {"ready", "crashed", "undecided", "stopped"}


@pytest.mark.parametrize("row", [r for r in HARVEST16 + HELDOUT16 + POSTFREEZE16
                                 if r["last_phase"] != "-"],
                         ids=lambda r: Path(r["file"]).name)
def test_the_sixteenth_harvest_reaches_its_phase(row: dict[str, str]) -> None:
    assert _got(row)[2] == row["last_phase"]


@pytest.mark.parametrize("name", sorted(SEVERAL_STARTS))
def test_each_start_of_a_log_is_an_attempt(name: str) -> None:
    out = replay.replay_file(HERE15 / name)
    assert out["attempts_total"] == SEVERAL_STARTS[name]
    assert len(out["attempts"]) == min(SEVERAL_STARTS[name] - 1, 20)


def test_no_real_log_times_out() -> None:
    # Replay decides ready when the evidence appears; budgets only annotate.
    for r in ALL:
        assert _got(r)[0] != "timed_out", r["file"]


# -- issue 28.3: a crash keeps the phase it died in ------------------------------------

# The seventeenth harvest (issue 28), labelled blind before vigil ran on it: 17/32 with the
# rules frozen, 21/32 after 28.1/28.2, 22/32 after 28.3.
HERE17 = FIXTURES / "real-logs-17"
with (HERE17 / "CASES.tsv").open() as _fh:
    HARVEST17 = [{**r, "file": str(HERE17 / r["file"])}
                 for r in csv.DictReader(_fh, delimiter="\t")]
ALL17 = ALL + HARVEST17


def test_the_seventeenth_harvest_does_not_regress() -> None:
    both = sum(_got(r)[:2] == (r["expected_verdict"], r["expected_cause"]) for r in HARVEST17)
    assert both >= 25, f"{both}/{len(HARVEST17)}"  # 25 since 28.5 (FP8, ptxas)


# Crashes whose log does not show the phase its label names (each read by hand).
PHASE_NOT_SHOWN = PHASE_NOT_IN_LOG | {
    # frames-only excerpts whose vLLM frames stop above the phase (model construction's
    # rotary embedding, a weights download's disk error): engine_init is what they prove
    "qwen3-asr-15-enginecore-flash-attn-so-import-error.log",
    "tpu-recipes-148-ironwood-download-weights-frames-disk.log",
    # the DP-rank line (the end of initialize_model_parallel) is the last before the cut
    # traceback: distributed_init by the log, engine_init by the label
    "gpustack-2097-rtx5090d-v1-enginecore-failed-root-cut.log",
    # undecided (a club-3090 wording seen once) and a custom log format whose serving
    # lines the excerpt lacks
    "club3090-1036-missing-shard-in-index.log",
    "vllm-11366-custom-format-illegal-memory-serving.log",
}
CRASHES_WITH_PHASE = [r for r in ALL17 if r["expected_verdict"] == "crashed"
                      and r["last_phase"] != "-"
                      and Path(r["file"]).name not in PHASE_NOT_SHOWN]


@pytest.mark.parametrize("row", CRASHES_WITH_PHASE, ids=lambda r: Path(r["file"]).name)
def test_every_corpus_crash_reports_the_phase_its_root_error_was_raised_in(
        row: dict[str, str]) -> None:
    assert _got(row)[2] == row["last_phase"]


# The API server's unwinding of an engine core that died starting (vLLM 0.15.1, verbatim
# from real-logs-15's clawd journal): run_server → run_server_worker →
# build_async_engine_client → … → wait_for_engine_startup's RuntimeError. run_server_worker
# builds the engine client, so its frame is in every such unwinding.
_UNWINDING = [
    "(APIServer pid=14452) Traceback (most recent call last):",
    '(APIServer pid=14452)   File "/v/bin/vllm", line 6, in <module>',
    "(APIServer pid=14452)     sys.exit(main())",
    '(APIServer pid=14452)   File "/v/site-packages/vllm/entrypoints/cli/main.py", line 73, '
    "in main",
    '(APIServer pid=14452)   File "/v/site-packages/vllm/entrypoints/cli/serve.py", line 111, '
    "in cmd",
    "(APIServer pid=14452)     uvloop.run(run_server(args))",
    '(APIServer pid=14452)   File "/v/site-packages/vllm/entrypoints/openai/api_server.py", '
    "line 919, in run_server",
    "(APIServer pid=14452)     await run_server_worker(listen_address, sock, args, "
    "**uvicorn_kwargs)",
    '(APIServer pid=14452)   File "/v/site-packages/vllm/entrypoints/openai/api_server.py", '
    "line 938, in run_server_worker",
    "(APIServer pid=14452)     async with build_async_engine_client(",
    '(APIServer pid=14452)   File "/v/site-packages/vllm/entrypoints/openai/api_server.py", '
    "line 147, in build_async_engine_client",
    '(APIServer pid=14452)   File "/v/site-packages/vllm/v1/engine/async_llm.py", line 155, '
    "in __init__",
    '(APIServer pid=14452)   File "/v/site-packages/vllm/v1/engine/core_client.py", line 479, '
    "in __init__",
    '(APIServer pid=14452)   File "/v/site-packages/vllm/v1/engine/utils.py", line 933, in '
    "launch_core_engines",
    '(APIServer pid=14452)   File "/v/site-packages/vllm/v1/engine/utils.py", line 992, in '
    "wait_for_engine_startup",
    "(APIServer pid=14452)     raise RuntimeError(",
    "(APIServer pid=14452) RuntimeError: Engine core initialization failed. See root cause "
    "above. Failed core proc(s): {}",
    "(APIServer pid=14452) /usr/lib/python3.12/multiprocessing/resource_tracker.py:279: "
    "UserWarning: resource_tracker: There appear to be 1 leaked shared_memory objects",
]


def _crash_poll(path: Path) -> tuple[reducer.WatchState, Snapshot, reducer.WatchState] | None:
    """The state before the poll that decided a crash, that poll, and the state after."""
    budgets = Budgets()
    st = reducer.initial()
    for snap in replay.stream(path)[1]:
        nxt = reducer.step(st, snap, budgets, log_only=True)
        if nxt.verdict == reducer.Verdict.CRASHED:
            return st, snap, nxt
        if nxt.verdict in reducer.TERMINAL:
            return None
        st = nxt
    return None


CRASHED_LOGS = [r for r in ALL17 if r["expected_verdict"] == "crashed"]


def test_the_api_servers_unwinding_never_moves_a_crash_on() -> None:
    # Every corpus crash, with the API server's unwinding arriving in the same poll as the
    # error it died of (as it does live: journald hands both over at once), keeps the
    # phase it had without it; unwinding is not progress.
    budgets = Budgets()
    checked = 0
    for row in CRASHED_LOGS:
        got = _crash_poll(HERE / row["file"])
        if got is None:
            continue
        before, snap, alone = got
        us = max((x.us for x in snap.journal.lines), default=0)
        lines = (*snap.journal.lines, *(LogLine(us=us, text=t) for t in _UNWINDING))
        unwound = reducer.step(before, snap.model_copy(update={"journal": Journal(lines=lines)}),
                               budgets,
                               log_only=True)
        assert unwound.verdict == reducer.Verdict.CRASHED, row["file"]
        assert unwound.phase == alone.phase, row["file"]
        checked += 1
    assert checked >= 220
