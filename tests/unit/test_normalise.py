# ruff: noqa: E501  (the healthy start is vLLM's lines as written)
"""Issue 28: verdicts that hold where no rule was written.

- a line below ERROR never ends a start: every WARNING-level line of the corpus, fed into a
  healthy start, leaves it `ready`;
- one normaliser: any known prefix stack, colour or shipper wrapper around any corpus line
  yields the same parsed line, and around a whole log the same verdict.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vigil.verify import catalog, replay

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORPUS = sorted(p for d in FIXTURES.glob("real-logs*") for p in d.glob("*.log"))

# A healthy V1 start, marker by marker (vLLM 0.11's wording, TP2).
HEALTHY = """\
(APIServer pid=1) INFO 05-15 03:31:20 [api_server.py:1839] vLLM API server version 0.11.0
(APIServer pid=1) INFO 05-15 03:31:20 [utils.py:233] non-default args: {'model': 'm'}
(EngineCore_DP0 pid=7) INFO 05-15 03:31:30 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: model='m'
(Worker_TP0 pid=9) INFO 05-15 03:31:35 [parallel_state.py:1208] world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://127.0.0.1:1 backend=nccl
(Worker_TP0 pid=9) INFO 05-15 03:31:36 [gpu_model_runner.py:2602] Starting to load model m...
(Worker_TP0 pid=9) INFO 05-15 03:31:50 [gpu_model_runner.py:2634] Model loading took 7.1 GiB and 13.2 seconds
(Worker_TP0 pid=9) INFO 05-15 03:32:10 [monitor.py:34] torch.compile takes 18.0 s in total
(Worker_TP0 pid=9) INFO 05-15 03:32:12 [gpu_worker.py:298] Available KV cache memory: 60.1 GiB
(EngineCore_DP0 pid=7) INFO 05-15 03:32:12 [kv_cache_utils.py:1087] GPU KV cache size: 1,000,000 tokens
(Worker_TP0 pid=9) INFO 05-15 03:32:30 [gpu_model_runner.py:3480] Graph capturing finished in 18 secs, took 0.5 GiB
(EngineCore_DP0 pid=7) INFO 05-15 03:32:31 [core.py:210] init engine (profile, create kv cache, warmup model) took 60.0 seconds
(APIServer pid=1) INFO 05-15 03:32:33 [api_server.py:1634] Starting vLLM API server 0 on http://0.0.0.0:8000
(APIServer pid=1) INFO:     Started server process [1]
(APIServer pid=1) INFO:     Waiting for application startup.
(APIServer pid=1) INFO:     Application startup complete.
"""


def _warnings() -> list[str]:
    seen: dict[str, str] = {}
    for p in CORPUS:
        for raw in p.read_text(errors="replace").splitlines():
            line = catalog.parse_line(raw)
            if line.level in ("WARNING", "WARN") and line.message not in seen:
                seen[line.message] = catalog.normalise(raw)
    return sorted(seen.values())


WARNINGS = _warnings()


def test_the_corpus_has_warnings_to_feed() -> None:
    assert len(WARNINGS) > 50


def test_the_healthy_start_is_ready(tmp_path: Path) -> None:
    p = tmp_path / "healthy.log"
    p.write_text(HEALTHY)
    assert replay.replay_file(p)["verdict"] == "ready"


def test_no_warning_of_the_corpus_ends_a_healthy_start(tmp_path: Path) -> None:
    lines = HEALTHY.splitlines()
    bad = []
    for i, w in enumerate(WARNINGS):
        # fed mid-start (during weight loading), as the worker that printed it would
        log = [*lines[:5], w, *lines[5:]]
        p = tmp_path / f"w{i}.log"
        p.write_text("\n".join(log) + "\n")
        out = replay.replay_file(p)
        if out["verdict"] != "ready":
            bad.append(f"{out['verdict']}/{out['cause']}: {w[:160]}")
    assert not bad, "\n".join(bad[:20])


# Wrappers users' logs carry around vLLM's lines, each known to the normaliser.
def _sgr(line: str) -> str:  # vLLM's own colouring of its process prefix
    if line.startswith("("):
        close = line.find(")") + 1
        return f"\x1b[1;36m{line[:close]}\x1b[0;0m{line[close:]}"
    return f"\x1b[32m{line}\x1b[0m"


_PROCESS = re.compile(r"\([A-Za-z_][\w-]* pid=\d+")  # vLLM's own: "(EngineCore_DP0 pid=12)"


def _outer_prefix(line: str) -> str:  # a relay's process prefix outside vLLM's own
    # only around a line of a vLLM process: "(gan_vllm2) user@host:~$" is a shell prompt
    return f"(RayWorkerWrapper pid=4242, ip=10.0.0.7) {line}" if _PROCESS.match(line) \
        else line


WRAPPERS = {
    "sgr": _sgr,
    "caret": lambda s: _sgr(s).replace("\x1b", "^["),
    "compose": lambda s: f"vllm-1  | {s}",
    "kubectl": lambda s: f"[pod/vllm-0/vllm] {s}",
    "docker_ts": lambda s: f"2025-05-15T03:31:20.123456789Z {s}",
    "stamp_gutter": lambda s: f"2025-05-30 18:28:27.890 | {s}",
    "outer_prefix": _outer_prefix,
    "ray_repeated": lambda s: f"{s} [repeated 7x across cluster]",
    "redraw": lambda s: f"Loading: 10%\r{s}",
    "crlf": lambda s: f"{s}\r",
}
# Wrappers that carry no clock of their own (a docker stamp is the shipper's clock).
_JOURNALD = re.compile(r"^(?:\S{1,8} +\d{1,2} \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\S+) \S+ [^\s:]+\[\d+\]:")
TIMELESS = [k for k in WRAPPERS if k not in ("docker_ts", "stamp_gutter")]


def _sample_lines() -> list[str]:
    out: list[str] = []
    for p in CORPUS[::3]:
        for raw in p.read_text(errors="replace").splitlines()[:40]:
            clean = catalog.normalise(raw)
            if clean.strip() and clean == raw and "[repeated" not in raw:
                out.append(raw)
    return out


LINES = _sample_lines()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(LINES), st.lists(st.sampled_from(sorted(WRAPPERS)), max_size=4))
def test_any_wrapper_stack_yields_the_same_parsed_line(line: str, stack: list[str]) -> None:
    wrapped = line
    for name in stack:
        wrapped = WRAPPERS[name](wrapped)
    assert catalog.parse_line(wrapped) == catalog.parse_line(line)
    assert "\x1b[" not in catalog.normalise(wrapped)
    assert catalog.classify(wrapped).kind == catalog.classify(line).kind


def test_replay_reads_the_time_through_colour_and_docker_stamps(tmp_path: Path) -> None:
    # a coloured log, through `docker logs -t`: the phases keep their durations
    p = tmp_path / "plain.log"
    p.write_text(HEALTHY)
    plain = replay.replay_file(p)
    q = tmp_path / "coloured.log"
    q.write_text("\n".join(_sgr(ln) for ln in HEALTHY.splitlines()) + "\n")
    coloured = replay.replay_file(q)
    assert coloured["verdict"] == plain["verdict"] == "ready"
    assert coloured.get("phases") == plain.get("phases")


def _unrelayed(logs: list[Path]) -> list[Path]:
    """Logs no journald relay wraps (one is outermost: shippers wrap inside it, not
    around it, so stacking wrappers around such a log is no real log)."""
    return [p for p in logs if not any(_JOURNALD.match(ln) for ln in
                                       p.read_text(errors="replace").splitlines())]


@pytest.mark.parametrize("log", _unrelayed(CORPUS[::4]), ids=lambda p: p.name[:60])
@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(stack=st.lists(st.sampled_from(TIMELESS), min_size=1, max_size=3))
def test_any_wrapper_around_a_whole_log_keeps_its_verdict(
        tmp_path: Path, log: Path, stack: list[str]) -> None:
    raw = log.read_text(errors="replace").splitlines()
    wrapped = []
    for ln in raw:
        for name in stack:
            ln = WRAPPERS[name](ln)
        wrapped.append(ln)
    p = tmp_path / "wrapped.log"
    p.write_text("\n".join(wrapped) + "\n")
    a, b = replay.replay_file(log), replay.replay_file(p)
    assert (b["verdict"], b["cause"], b["phase"]) == (a["verdict"], a["cause"], a["phase"])
