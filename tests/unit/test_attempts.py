"""Several starts in one log (issue 24.5) and dying after ready (issue 24.6), replayed
from plain logs built of vLLM's, systemd's and uvicorn's own wordings."""

from __future__ import annotations

from pathlib import Path

from vigil.verify import attempts, catalog, replay
from vigil.verify.snapshot import Journal, LogLine, Snapshot

J = "Feb 22 06:{m:02d}:{s:02d} host "
API = "(APIServer pid={pid}) INFO 02-22 06:{m:02d}:{s:02d} [api_server.py:1] "
CORE = "(EngineCore_DP0 pid={pid}) ERROR 02-22 06:{m:02d}:{s:02d} [core.py:946] "


def _write(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "start.log"
    p.write_text("\n".join(lines) + "\n")
    return p


def _vllm_start(m: int, pid: int, core: int) -> list[str]:
    j = J.format(m=m, s=1) + f"python3[{pid}]: "
    return [
        j + API.format(pid=pid, m=m, s=1) + "vLLM API server version 0.11.0",
        j + API.format(pid=pid, m=m, s=1) + "non-default args: {'model': 'm'}",
        J.format(m=m, s=3) + f"python3[{core}]: (EngineCore_DP0 pid={core}) INFO 02-22 "
        f"06:{m:02d}:03 [core.py:1] Initializing a V1 LLM engine (v0.11.0) with config: x",
    ]


def _kv_crash(m: int, pid: int, core: int) -> list[str]:
    return [
        J.format(m=m, s=9) + f"python3[{core}]: " + CORE.format(pid=core, m=m, s=9)
        + "ValueError: To serve at least one request with the models's max seq len "
        "(16384), (3.0 GiB KV cache is needed, which is larger than the available KV "
        "cache memory (1.87 GiB).",
        J.format(m=m, s=10) + f"python3[{pid}]: (APIServer pid={pid}) RuntimeError: "
        "Engine core initialization failed. See root cause above. Failed core proc(s): {}",
        J.format(m=m, s=10) + "systemd[1]: vllm.service: Main process exited, "
        "code=exited, status=1/FAILURE",
        J.format(m=m, s=10) + "systemd[1]: vllm.service: Failed with result 'exit-code'.",
    ]


def _ready(m: int, pid: int) -> list[str]:
    j = J.format(m=m, s=30) + f"python3[{pid}]: "
    return [j + f"(APIServer pid={pid}) INFO:     Started server process [{pid}]",
            j + f"(APIServer pid={pid}) INFO:     Application startup complete."]


def _restart(m: int) -> list[str]:
    return [J.format(m=m, s=15) + "systemd[1]: vllm.service: Scheduled restart job, "
            "restart counter is at 1.",
            J.format(m=m, s=15) + "systemd[1]: Stopped vllm.service - vLLM server.",
            J.format(m=m, s=15) + "systemd[1]: Started vllm.service - vLLM server."]


def test_a_systemd_restart_after_a_crash_is_the_last_starts_verdict(tmp_path: Path) -> None:
    log = [J.format(m=35, s=0) + "systemd[1]: Started vllm.service - vLLM server."]
    log += _vllm_start(35, 100, 101) + _kv_crash(35, 100, 101) + _restart(35)
    log += _vllm_start(36, 200, 201) + _ready(36, 200)
    out = replay.replay_file(_write(tmp_path, log))
    assert (out["verdict"], out["cause"]) == ("ready", None)
    assert out["attempts_total"] == 2
    (first,) = out["attempts"]
    assert (first["verdict"], first["cause"], first["phase"]) == (
        "crashed", "kv_cache_too_small", "kv_cache")
    assert first["started_at"] < out["phases"][0]["start"]
    assert "2 starts" in out["note"]
    line = attempts.summary_line(out)
    assert line is not None and line.startswith("earlier attempts (1): crashed "
                                                "(kv_cache_too_small) in kv_cache at ")


def test_the_last_start_just_begun_is_undecided_not_the_earlier_crash(tmp_path: Path) -> None:
    log = _vllm_start(35, 100, 101) + _kv_crash(35, 100, 101) + _restart(35)
    out = replay.replay_file(_write(tmp_path, log))
    assert out["verdict"] is None and out["cause"] is None
    assert [a["cause"] for a in out["attempts"]] == ["kv_cache_too_small"]


def test_a_start_prints_its_banners_once_the_version_then_the_arguments(
        tmp_path: Path) -> None:
    # systemd's lines, the version and the args of ONE start are one attempt, and a
    # crash log of one start stays one start
    log = [J.format(m=35, s=0) + "systemd[1]: Starting vllm.service - vLLM server...",
           J.format(m=35, s=0) + "systemd[1]: Started vllm.service - vLLM server."]
    log += _vllm_start(35, 100, 101) + _kv_crash(35, 100, 101)
    out = replay.replay_file(_write(tmp_path, log))
    assert (out["verdict"], out["cause"], out["attempts_total"]) == (
        "crashed", "kv_cache_too_small", 1)
    assert out["attempts"] == [] and attempts.summary_line(out) is None


def test_a_second_version_line_is_a_second_start_even_with_nothing_between(
        tmp_path: Path) -> None:
    # a wrapper relaunching a start that died without a word (no systemd, no crash line)
    first = _vllm_start(35, 100, 101)[:2]
    second = _vllm_start(36, 200, 201) + _ready(36, 200)
    out = replay.replay_file(_write(tmp_path, first + second))
    assert out["verdict"] == "ready" and out["attempts_total"] == 2
    assert out["attempts"][0]["verdict"] == "undecided"


def test_a_container_restart_reuses_the_pid_and_is_still_a_new_start(tmp_path: Path) -> None:
    # docker logs: no systemd, the same APIServer pid in every fresh container
    log = [line.split("python3[100]: ", 1)[-1].split("python3[101]: ", 1)[-1]
           for line in _vllm_start(35, 13, 259) + _kv_crash(35, 13, 259)[:2]]
    log += [line.split("python3[13]: ", 1)[-1] for line in _vllm_start(36, 13, 215)]
    log = [ln.split("host ", 1)[-1].split(": ", 1)[-1] if ln.startswith("Feb") else ln
           for ln in log]
    out = replay.replay_file(_write(tmp_path, log))
    assert out["attempts_total"] == 2 and out["verdict"] is None
    assert out["attempts"][0]["cause"] == "kv_cache_too_small"


def test_another_api_server_process_is_another_start(tmp_path: Path) -> None:
    # the new process's first kept line is not its banner (a cut paste)
    log = _vllm_start(35, 100, 101) + _kv_crash(35, 100, 101)[:2]
    log += [J.format(m=36, s=30) + "python3[200]: (APIServer pid=200) INFO 02-22 06:36:30 "
            "[launcher.py:46] Route: /health, Methods: GET", *_ready(36, 200)]
    out = replay.replay_file(_write(tmp_path, log))
    assert out["attempts_total"] == 2 and out["verdict"] == "ready"


def test_lines_that_look_like_a_start_but_are_not(tmp_path: Path) -> None:
    # a journal of several units, uvicorn's "Started server process", vLLM's "Starting
    # to load model", and the journal prefix's PID (the engine core's, not a new start)
    log = _vllm_start(35, 100, 101)
    log += [J.format(m=35, s=4) + "systemd[1]: Started Session 5 of user root.",
            J.format(m=35, s=4) + "systemd[1]: Started nginx.service - nginx.",
            J.format(m=35, s=5) + "python3[101]: (EngineCore_DP0 pid=101) INFO 02-22 06:35:05 "
            "[gpu_model_runner.py:1] Starting to load model /opt/vllm/models/m...",
            J.format(m=35, s=6) + "python3[101]: [rank0]: Starting vLLM worker..."]
    log += _ready(35, 100)
    out = replay.replay_file(_write(tmp_path, log))
    assert (out["verdict"], out["attempts_total"]) == ("ready", 1)


def test_a_restart_loop_keeps_the_most_recent_attempts(tmp_path: Path) -> None:
    log: list[str] = []
    for n in range(attempts.MAX_ATTEMPTS + 5):
        t = J.format(m=n // 10 + 40, s=(n % 10) * 5)
        log += [t + f"systemd[1]: vllm.service: Scheduled restart job, restart counter is at {n}.",
                t + "systemd[1]: Started vllm.service - vLLM server.",
                t + "systemd[1]: vllm.service: Main process exited, code=exited, "
                "status=203/EXEC",
                t + "systemd[1]: vllm.service: Failed with result 'exit-code'."]
    log += [J.format(m=59, s=0) + "systemd[1]: Started vllm.service - vLLM server."]
    out = replay.replay_file(_write(tmp_path, log))
    assert out["verdict"] is None
    assert out["attempts_total"] == attempts.MAX_ATTEMPTS + 6
    assert len(out["attempts"]) == attempts.MAX_ATTEMPTS
    assert {a["verdict"] for a in out["attempts"]} == {"crashed"}
    line = attempts.summary_line(out)
    assert line is not None and f"({attempts.MAX_ATTEMPTS + 5}, the last " in line


def test_a_trace_is_one_watch_and_never_split() -> None:
    lines = [LogLine(us=int(1e15), text=t) for t in (
        "INFO 02-22 06:35:01 [api_server.py:1] vLLM API server version 0.11.0",
        "ERROR 02-22 06:35:02 [core.py:1] ValueError: To serve at least one request with "
        "the models's max seq len (16384)",
        "INFO 02-22 06:35:03 [api_server.py:1] vLLM API server version 0.11.0")]
    got = attempts.run([Snapshot(time=1e9, journal=Journal(lines=tuple(lines)))])
    assert got.total == 1 and got.attempts == []


def test_start_lines_from_vllms_format_strings() -> None:
    kinds = {
        "vllm.service: Scheduled restart job, restart counter is at 3.": "scheduled",
        "Starting vllm.service - vLLM server...": "starting",
        "Started openclaw-vllm.service - OpenClaw local vLLM server.": "started",
        "INFO 10-10 10:23:00 api_server.py:526] vLLM API server version 0.6.1": "version",
        "(APIServer pid=1) INFO 07-07 19:12:42 [api_utils.py:339]  ▄▄ ▄█ █     █     █ ▀▄▀ █"
        "  version 0.24.0": "version",
        "(APIServer pid=1) INFO 12-01 10:00:00 [api_utils.py:1] vLLM server version 0.33.0, "
        "serving model m": "version",
        "INFO 03-01 16:04:26 [utils.py:253] non-default args: {'model': 'm'}": "args",
        "INFO 03-12 03:19:03 api_server.py:1] args: Namespace(host=None)": "args",
    }
    for text, kind in kinds.items():
        got = catalog.start_line(text)
        assert got is not None and got.kind == kind, text
    for text in ("INFO:     Started server process [41]", "CMake version: version 4.2.1",
                 "Started vLLM OpenAI server.",  # systemd < v249: the version line marks it
                 "Starting vLLM...",  # a wrapper's line
                 "(EngineCore_DP0 pid=1) INFO 02-22 06:35:41 [gpu_model_runner.py:1] "
                 "Starting to load model m..."):
        assert catalog.start_line(text) is None, text


# -- 24.6: dying after ready ------------------------------------------------------------

SERVED = [
    "(APIServer pid=5) INFO 04-27 15:04:49 [api_server.py:1] vLLM API server version 0.12.0",
    "(APIServer pid=5) INFO:     Application startup complete.",
    '(APIServer pid=5) INFO:     127.0.0.1:35028 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "(APIServer pid=5) INFO 04-27 15:11:24 [loggers.py:236] Engine 000: Avg prompt "
    "throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s",
]


def test_an_engine_core_that_vanishes_hours_after_ready_is_a_crash(tmp_path: Path) -> None:
    log = [*SERVED,
        "(APIServer pid=5) ERROR 04-27 18:09:47 [core_client.py:600] Engine core proc "
        "EngineCore_DP0 died unexpectedly, shutting down client.",
        "(APIServer pid=5) INFO:     Shutting down"]
    out = replay.replay_file(_write(tmp_path, log))
    assert (out["verdict"], out["cause"], out["phase"]) == ("crashed", "engine_dead", "ready")
    assert "after ready at" in out["proof"] and "ready revoked" in out["proof"]


def test_executor_failed_is_the_dead_workers_consequence_not_a_root(tmp_path: Path) -> None:
    log = [*SERVED,
        "(EngineCore_DP0 pid=6) ERROR 01-18 22:19:25 [multiproc_executor.py:231] Worker proc "
        "VllmWorker-0 died unexpectedly, shutting down executor.",
        "(EngineCore_DP0 pid=6) ERROR 01-18 22:19:26 [core.py:868] EngineCore encountered a "
        "fatal error.",
        "(EngineCore_DP0 pid=6) ERROR 01-18 22:19:26 [core.py:868] RuntimeError: Executor "
        "failed."]
    out = replay.replay_file(_write(tmp_path, log))
    assert (out["verdict"], out["cause"]) == ("crashed", "engine_dead")
    assert "VllmWorker-0 died unexpectedly" in out["proof"]


def test_a_sigterm_after_serving_is_ready_then_stopped(tmp_path: Path) -> None:
    log = [*SERVED,
        "(EngineCore pid=6) INFO 08-01 23:37:28 [core.py:1214] [shutdown] EngineCore: trigger "
        "received signal=SIGTERM",
        "(APIServer pid=5) INFO 08-01 23:37:28 [launcher.py:100] [shutdown] API server: "
        "shutdown triggered",
        "(APIServer pid=5) ERROR 08-01 23:37:28 [async_llm.py:704] vllm.v1.engine.exceptions."
        "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the "
        "root cause."]
    out = replay.replay_file(_write(tmp_path, log))
    assert out["verdict"] == "ready" and out["stopped_at"] is not None


HARNESS = [
    "INFO 03-01 16:04:26 [utils.py:253] non-default args: {'model': 'm'}",
    "(EngineCore_DP0 pid=7) INFO 03-01 16:04:55 [core.py:95] Initializing a V1 LLM engine "
    "(v0.11.0) with config: model='m'",
    "(EngineCore_DP0 pid=7) INFO 03-01 16:06:36 [kv_cache_utils.py:1] GPU KV cache size: "
    "1,856 tokens",
    "(EngineCore_DP0 pid=7) INFO 03-01 16:06:50 [core.py:261] init engine (profile, create kv "
    "cache, warmup model) took 15.10 seconds",
    "Adding requests: 100%|██████████| 20/20 [00:00<00:00, 3952.04it/s]",
]


def test_an_offline_harness_that_finishes_and_exits_is_ready_then_stopped(
        tmp_path: Path) -> None:
    log = [*HARNESS,
        "Processed prompts:   0%|          | 0/20 [00:00<?, ?it/s]\r"
        "Processed prompts: 100%|██████████| 20/20 [00:09<00:00, 2.10it/s, est. speed input: "
        "1.00 toks/s, output: 9.00 toks/s]",
        # the interpreter exits: V1's engine monitor (0.10 → 0.17) logs the engine core
        # going as "died unexpectedly", torch warns about the process group
        "ERROR 03-01 16:07:10 [core_client.py:564] Engine core proc EngineCore_DP0 died "
        "unexpectedly, shutting down client.",
        "[rank0]:[W301 16:07:10.968647981 ProcessGroupNCCL.cpp:1524] Warning: WARNING: "
        "destroy_process_group() was not called before program exit, which can leak "
        "resources."]
    out = replay.replay_file(_write(tmp_path, log))
    assert (out["verdict"], out["cause"]) == ("ready", None)
    assert out["stopped_at"] is not None
    assert any("then stopped" in w for w in out["warnings"])


def test_an_offline_engine_that_dies_mid_batch_is_a_crash(tmp_path: Path) -> None:
    log = [*HARNESS,
        "Processed prompts:  45%|████▌     | 9/20 [00:04<00:05, 2.10it/s]",
        "ERROR 03-01 16:07:10 [core_client.py:564] Engine core proc EngineCore_DP0 died "
        "unexpectedly, shutting down client."]
    out = replay.replay_file(_write(tmp_path, log))
    assert (out["verdict"], out["cause"]) == ("crashed", "engine_dead")


def test_a_server_is_never_taken_for_an_idle_harness(tmp_path: Path) -> None:
    # an HTTP request after an offline-style bar: a server, whose dying engine is a crash
    log = [*HARNESS, "Processed prompts: 100%|██████████| 1/1 [00:01<00:00, 1.0it/s]",
                     '(APIServer pid=5) INFO:     127.0.0.1:1 - "POST /v1/completions '
                     'HTTP/1.1" 200 OK',
                     "ERROR 03-01 16:07:10 [core_client.py:564] Engine core proc "
                     "EngineCore_DP0 died unexpectedly, shutting down client."]
    out = replay.replay_file(_write(tmp_path, log))
    assert (out["verdict"], out["cause"]) == ("crashed", "engine_dead")
