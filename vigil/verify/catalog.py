"""The log catalog: what vLLM's log lines mean for a watcher.

Pure: text in, meaning out. Patterns match fragments, not whole lines, because wording
drifts between releases (0.10 → 0.33, see shared/VLLM_STARTUP.md); each pattern notes
the variants it covers. Order matters only inside a table: the first match wins.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

PHASES: tuple[str, ...] = (
    "bootstrap",
    "engine_init",
    "distributed_init",
    "loading_weights",
    "compiling",
    "kv_cache",
    "capturing_graphs",
    "api_starting",
    "ready",
)

Edge = Literal["start", "progress", "end"]
Kind = Literal["marker", "fatal", "noise", "other"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")

# `(APIServer pid=1) INFO 11-29 10:01:02 [file.py:12] msg`; the process prefix is
# optional (absent on tracebacks from 0.31 on), so is the level/stamp/source block.
_PREFIX = re.compile(
    r"^\s*(?:\((?P<proc>[A-Za-z][\w\-]*) pid=(?P<pid>\d+)\)\s*)?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+"
    r"(?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d+)?\s+"
    r"(?:\[(?P<source>[^\]]+)\]\s*)?)?"
    r"(?P<msg>.*)$",
    re.DOTALL,
)


@dataclass(frozen=True)
class Line:
    """One log line split into vLLM's prefix fields and the message."""

    proc: str | None
    pid: int | None
    level: str | None
    stamp: str | None  # MM-DD HH:MM:SS, local time, no year
    source: str | None
    message: str


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def parse_line(text: str) -> Line:
    # tqdm redraws with \r: the last redraw is the state that counts.
    clean = strip_ansi(text).rstrip("\r\n")
    if "\r" in clean:
        parts = [p for p in clean.split("\r") if p.strip()]
        clean = parts[-1] if parts else ""
    m = _PREFIX.match(clean)
    if m is None:  # pragma: no cover - the pattern matches any string
        return Line(None, None, None, None, None, clean.strip())
    pid = m.group("pid")
    return Line(
        proc=m.group("proc"),
        pid=int(pid) if pid else None,
        level=m.group("level"),
        stamp=m.group("stamp"),
        source=m.group("source"),
        message=m.group("msg").strip(),
    )


@dataclass(frozen=True)
class Match:
    """What one line means. `values` holds numbers pulled out of it (GiB, seconds…)."""

    kind: Kind
    line: Line
    phase: str | None = None
    edge: Edge | None = None
    marker: str | None = None
    cause: str | None = None
    remedy: str | None = None
    values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Marker:
    name: str
    phase: str
    edge: Edge
    pattern: re.Pattern[str]


def _m(name: str, phase: str, edge: Edge, pattern: str) -> _Marker:
    return _Marker(name, phase, edge, re.compile(pattern))


_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"

MARKERS: tuple[_Marker, ...] = (
    # bootstrap (APIServer). The logo line carries "version X"; ≤0.13 "vLLM API server
    # version"; later "vLLM server version".
    _m("server_version", "bootstrap", "start", r"vLLM (?:API )?server version"),
    _m("logo_version", "bootstrap", "start", r"^[^a-zA-Z]*version \d+\.\d+"),
    _m("non_default_args", "bootstrap", "progress", r"non-default args:"),
    _m("resolved_arch", "bootstrap", "progress", r"Resolved architecture:"),
    _m("max_model_len", "bootstrap", "progress", r"Using max model len"),
    # engine init (EngineCore); older releases: "Initializing an LLM engine (v…)".
    _m("engine_config", "engine_init", "start", r"Initializing a(?:n)? (?:V\d )?LLM engine"),
    # distributed init (workers)
    _m("world_size", "distributed_init", "start",
       r"world_size=\d+ rank=\d+ local_rank=\d+ distributed_init_method="),
    _m("nccl_version", "distributed_init", "progress", r"vLLM is using nccl=="),
    _m("dp_rank", "distributed_init", "progress", r"is assigned as DP rank"),
    # weight loading: V1 runner "Starting to load model", V2 "Loading model from scratch"
    _m("load_start", "loading_weights", "start",
       r"Starting to load model|Loading model from scratch"),
    _m("shards", "loading_weights", "progress",
       r"Loading (?:safetensors|pt|bin)? ?checkpoint shards:\s*(?P<pct>\d+)% Completed\s*\|\s*"
       r"(?P<done>\d+)/(?P<total>\d+)"),
    _m("weights_took", "loading_weights", "progress",
       r"Loading weights took (?P<seconds>[0-9.]+) seconds"),
    # "Model loading took 73.7 GiB memory and 343.1 seconds" (≤0.11 "73.7000 GiB and …")
    _m("model_loading_took", "loading_weights", "end",
       r"Model loading took (?P<gib>[0-9.]+) ?GiB(?: memory)? and (?P<seconds>[0-9.]+) seconds"),
    # compile: torch.compile / AOT; CPU build "Warming up model for the compilation..."
    _m("compile_start", "compiling", "start", r"Starting torch\.compile"),
    _m("compile_cache_dir", "compiling", "start", r"Using cache directory: .* torch\.compile"),
    _m("cpu_warmup", "compiling", "start", r"Warming up model for the compilation"),
    _m("dynamo", "compiling", "progress", r"Dynamo bytecode transform time: (?P<seconds>[0-9.]+)"),
    _m("graph_loaded", "compiling", "progress",
       r"Directly load (?:the )?compiled graph|Directly load AOT compilation"),
    _m("graph_compiled", "compiling", "progress",
       r"Compiling a graph for (?:compile range|dynamic shape|shape|general shape)"
       r".*?takes (?P<seconds>[0-9.]+) s"),
    _m("graph_cached", "compiling", "progress",
       r"Cache the graph (?:of|for) |saved AOT compiled function"),
    _m("compile_again", "compiling", "progress", r"Compiling model again due to a load failure"),
    # "torch.compile took 41.2 s in total" (≤0.15 "takes")
    _m("compile_took", "compiling", "end",
       r"torch\.compile (?:took|takes) (?P<seconds>[0-9.]+) s in total"),
    _m("cpu_warmup_done", "compiling", "end", r"Warming up done\."),
    # KV cache: 0.30+ one line, ≤0.26 two; the CPU build says "CPU KV cache size"
    _m("kv_available", "kv_cache", "start", r"Available KV cache memory: (?P<gib>[0-9.]+) ?GiB"),
    _m("kv_size", "kv_cache", "end", r"(?:GPU|CPU|XPU|TPU)? ?KV cache size: " + _NUM + r" tokens"),
    _m("kv_concurrency", "kv_cache", "end", r"Maximum concurrency for " + _NUM + r" tokens"),
    # CUDA graph capture (tqdm bar, then the summary)
    _m("capture_start", "capturing_graphs", "start", r"Capturing (?:CUDA|cuda) ?graphs"),
    _m("capture_done", "capturing_graphs", "end",
       r"Graph capturing finished in (?P<seconds>[0-9.]+) secs?(?:, took (?P<gib>[0-9.]+) GiB)?"),
    # engine ready: the reliable end of engine startup (≤0.18 "seconds")
    _m("init_engine_took", "api_starting", "start",
       r"init engine \(profile, create kv cache, warmup model\) took (?P<seconds>[0-9.]+)"),
    # HTTP: ≤0.15 "Starting vLLM API server 0 on", later "Starting vLLM server on"
    _m("server_starting", "api_starting", "progress", r"Starting vLLM (?:API )?server (?:\d+ )?on"),
    _m("uvicorn_process", "api_starting", "progress", r"Started server process \[\d+\]"),
    _m("uvicorn_waiting", "api_starting", "progress", r"Waiting for application startup\."),
    _m("app_startup_complete", "api_starting", "end", r"Application startup complete\."),
)


@dataclass(frozen=True)
class _Fatal:
    cause: str
    pattern: re.Pattern[str]
    specific: bool  # a root cause, not a link of the failure chain


def _f(cause: str, pattern: str, *, specific: bool = True) -> _Fatal:
    return _Fatal(cause, re.compile(pattern), specific)


# Root causes first; the generic chain lines (`… failed to start`) come last and are
# refined by the reducer when the root cause shows up in the same or a later poll.
FATALS: tuple[_Fatal, ...] = (
    _f("flashinfer_version_mismatch",
       r"flashinfer-(?P<pkg>cubin|jit-cache) version \((?P<have>[^)]+)\) does not match "
       r"flashinfer version \((?P<want>[^)]+)\)"),
    _f("gpu_memory_held",
       r"Free memory on device .* on startup is less than desired GPU memory utilization"),
    _f("cpu_memory",
       r"Available memory on node \d+ .* on startup is less than desired CPU memory utilization"),
    _f("out_of_memory",
       r"CUDA out of memory|OutOfMemoryError|Failed to load model - not enough GPU memory"),
    _f("kv_cache_too_small",
       r"To serve at least one request with the models?'s max seq len \((?P<len>\d+)\)"
       r"|No available memory for the cache blocks"),
    _f("max_model_len_exceeds_model",
       r"User-specified max_model_len \((?P<len>\d+)\) is greater than the derived "
       r"max_model_len"),
    _f("tp_indivisible", r"must be divisible by tensor parallel size"),
    _f("not_enough_gpus",
       r"World size \((?P<world>\d+)\) is larger than the number of available GPUs"),
    _f("nccl_error", r"NCCL error|Failed to load NCCL library|NCCL WARN .*(?:failed|error)"),
    _f("port_in_use",
       r"\[Errno 98\] (?:error while attempting to bind.*: )?[Aa]ddress already in use"),
    _f("engine_dead",
       r"EngineDeadError|EngineCore encountered a fatal error|Worker proc \S+ died unexpectedly"
       r"|WorkerProc hit an exception|Worker failed with error"),
    # The API server lists no failed process and no root cause came before: the engine
    # core vanished without a traceback of its own, i.e. a signal (OOM killer, kill -9).
    _f("engine_killed",
       r"Engine core initialization failed\. See root cause above\. Failed core proc\(s\): \{\}"),
    _f("unknown",
       r"WorkerProc failed to start|EngineCore failed to start"
       r"|Engine core initialization failed", specific=False),
)

_NOISE = re.compile(r"No available shared memory broadcast block found in (?P<seconds>\d+) second")

REMEDIES: dict[str, str] = {
    "flashinfer_version_mismatch":
        "pin flashinfer-{pkg} to the flashinfer-python version: "
        "pip install flashinfer-{pkg}=={want} (have {have}); or "
        "FLASHINFER_DISABLE_VERSION_CHECK=1 if you know they are compatible",
    "gpu_memory_held":
        "another process holds GPU memory: find it with nvidia-smi --query-compute-apps="
        "pid,used_memory --format=csv and stop it (often a stale vLLM), or lower "
        "--gpu-memory-utilization",
    "cpu_memory":
        "not enough free host memory for --gpu-memory-utilization on the CPU build: lower "
        "it (e.g. 0.5) and/or VLLM_CPU_KVCACHE_SPACE, or free memory on the host",
    "out_of_memory":
        "the model does not fit: stop other GPU users, raise "
        "--tensor-parallel-size, use a quantized checkpoint, or lower --max-model-len / "
        "--max-num-seqs",
    "kv_cache_too_small":
        "the KV cache cannot hold one request of max_model_len{len_note}: lower "
        "--max-model-len, raise --gpu-memory-utilization, use --kv-cache-dtype fp8, or "
        "add GPUs (--tensor-parallel-size)",
    "max_model_len_exceeds_model":
        "--max-model-len{len_note} is larger than the model's context: lower it to the "
        "model's max_position_embeddings (or use --max-model-len auto)",
    "tp_indivisible":
        "the attention heads (or another dimension) are not divisible by "
        "--tensor-parallel-size: pick a TP size that divides them (e.g. 1, 2, 4, 8)",
    "not_enough_gpus":
        "tensor x pipeline parallel size{world_note} exceeds the visible GPUs: lower "
        "--tensor-parallel-size/--pipeline-parallel-size or fix CUDA_VISIBLE_DEVICES",
    "nccl_error":
        "NCCL failed: check that every GPU is visible and healthy (nvidia-smi topo -m), "
        "the NCCL library matches torch, and run with NCCL_DEBUG=INFO to see the failing "
        "transport",
    "port_in_use":
        "the port is taken: stop the process listening on it (ss -ltnp) — often a "
        "stale vLLM — or set a different --port",
    "engine_dead":
        "the engine died after starting: read the traceback before this line in the "
        "journal (journalctl -u UNIT); a first completion failing after /health 200 often "
        "means the model is unsupported on this backend",
    "engine_killed":
        "the engine core died without an error of its own, so it was killed: look for the "
        "kernel's OOM killer (journalctl -k | grep -i 'killed process') or an operator's "
        "kill; free host memory or lower --gpu-memory-utilization, then restart",
    "unknown":
        "the engine failed to start: read the root-cause traceback above this line in "
        "the journal (journalctl -u UNIT -n 200)",
    "timed_out":
        "the start passed its hard cap: look at the last phase's evidence; raise the cap "
        "only if history shows starts this long are normal",
    "stalled":
        "no progress for the phase's stall window with the process alive: capture "
        "py-spy dump --pid <worker> for each worker, then restart the unit",
}


def remedy_for(cause: str, values: dict[str, str] | None = None) -> str:
    """The remedy text for a cause, filled with values from the proving line."""
    v = dict(values or {})
    v.setdefault("pkg", "cubin")
    v.setdefault("want", "<flashinfer-python version>")
    v.setdefault("have", "?")
    v["len_note"] = f" ({v['len']})" if v.get("len") else ""
    v["world_note"] = f" ({v['world']})" if v.get("world") else ""
    template = REMEDIES.get(cause, REMEDIES["unknown"])
    return template.format_map(defaultdict(str, v))


def is_specific(cause: str) -> bool:
    return any(f.cause == cause and f.specific for f in FATALS)


def _floats(groups: dict[str, str | None]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, raw in groups.items():
        if raw is None:
            continue
        try:
            out[key] = float(raw.replace(",", ""))
        except ValueError:
            continue
    return out


def classify(text: str) -> Match:
    """Classify one raw log line (ANSI codes and vLLM prefix allowed)."""
    line = parse_line(text)
    msg = line.message
    if not msg:
        return Match("other", line)
    noise = _NOISE.search(msg)
    if noise:
        return Match("noise", line, values=_floats(noise.groupdict()))
    # A warning that only says flashinfer ignored a package is not fatal (≥0.7.2).
    if "Ignoring incompatible flashinfer" not in msg:
        for fatal in FATALS:
            fm = fatal.pattern.search(msg)
            if fm:
                groups = {k: v for k, v in fm.groupdict().items() if v is not None}
                return Match(
                    "fatal", line, cause=fatal.cause,
                    remedy=remedy_for(fatal.cause, groups), values=_floats(fm.groupdict()),
                )
    for marker in MARKERS:
        mm = marker.pattern.search(msg)
        if mm:
            return Match(
                "marker", line, phase=marker.phase, edge=marker.edge, marker=marker.name,
                values=_floats(mm.groupdict()),
            )
    return Match("other", line)


def phase_index(phase: str) -> int:
    return PHASES.index(phase)
