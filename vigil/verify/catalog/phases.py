"""The phases of a vLLM start: one ``Phase`` record each (label, default budget and stall
window, which progress signals count, the stall hint, the log markers that open, advance
and close it, the traceback frames that prove a start got that far).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Edge = Literal["start", "progress", "end"]

Kind = Literal["marker", "fatal", "noise", "serving", "stop", "other"]

# hint: a line that names what failed but never proves a crash by itself
Role = Literal["root", "symptom", "chain", "hint"]

# Progress signals the reducer can see. Everywhere: a new log line, a new phase,
# checkpoint-shard progress, GPU memory or RSS moving, the compile cache growing — work a
# hung process cannot fake. CPU time only where CPU work is the work.
ALWAYS: frozenset[str] = frozenset(
    {"phase", "log", "shards", "gpu memory", "compile cache", "rss"})

SIGNALS: frozenset[str] = ALWAYS | {"cpu"}

@dataclass(frozen=True)
class Marker:
    name: str
    edge: Edge
    pattern: re.Pattern[str]

def _mk(name: str, edge: Edge, pattern: str) -> Marker:
    return Marker(name, edge, re.compile(pattern))

@dataclass(frozen=True)
class Phase:
    """One start phase, everything about it in one place."""

    name: str
    label: str  # for people
    short: str  # column header in `invoke history`
    budget_s: float  # default budget with no history and no size information
    stall_s: float  # how long it may show no progress evidence before it is stalled
    progress: frozenset[str]  # the signals that count as progress in this phase
    # When none of these can be observed, busy CPUs are the best evidence left.
    own_signals: frozenset[str] = frozenset()
    stall_hint: str = ""
    markers: tuple[Marker, ...] = ()
    # Function names in a traceback (`File "…", line N, in NAME`) that prove the start
    # reached this phase.
    frames: frozenset[str] = frozenset()

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"

_GENERIC_STALL = ("no progress for the phase's stall window with the process alive: capture "
                  "py-spy dump --pid <worker> for each worker, then restart the unit")

PHASE_RECORDS: tuple[Phase, ...] = (
    Phase(
        "bootstrap", "bootstrap (API server, arguments, model config)", "boot",
        budget_s=120.0, stall_s=180.0, progress=SIGNALS,
        markers=(
            # The logo line carries "version X"; ≤0.13 "vLLM API server version"; later
            # "vLLM server version".
            _mk("server_version", "start", r"vLLM (?:API )?server version"),
            _mk("logo_version", "start", r"^[^a-zA-Z]*version \d+\.\d+"),
            _mk("non_default_args", "progress", r"non-default args:"),
            _mk("resolved_arch", "progress", r"Resolved architecture:"),
            _mk("max_model_len", "progress", r"Using max model len"),
        ),
    ),
    Phase(
        "engine_init", "engine init (engine core, executor, workers)", "engine",
        budget_s=120.0, stall_s=180.0, progress=SIGNALS,
        markers=(
            # older releases: "Initializing an LLM engine (v…)"
            _mk("engine_config", "start", r"Initializing a(?:n)? (?:V\d )?LLM engine"),
        ),
        frames=frozenset({"init_device", "_init_executor", "init_worker", "_init_workers_ray",
                          "init_workers_ray", "create_worker"}),
    ),
    Phase(
        "distributed_init", "distributed init (NCCL, process groups)", "dist",
        budget_s=180.0, stall_s=300.0,
        # NCCL busy-polls at 100 % while hung: CPU is not progress here.
        progress=ALWAYS, own_signals=frozenset({"gpu memory", "rss"}),
        stall_hint="workers stuck in NCCL/distributed init: run with NCCL_DEBUG=INFO, check "
        "GPU visibility and P2P (try NCCL_P2P_DISABLE=1), then restart the unit",
        markers=(
            _mk("world_size", "start",
                r"world_size=\d+ rank=\d+ local_rank=\d+ distributed_init_method="),
            _mk("nccl_version", "progress", r"vLLM is using nccl=="),
            _mk("dp_rank", "progress", r"is assigned as DP rank"),
        ),
        frames=frozenset({"init_worker_distributed_environment", "init_distributed_environment",
                          "initialize_model_parallel", "ensure_model_parallel_initialized",
                          "init_process_group"}),
    ),
    Phase(
        "loading_weights", "loading weights", "load",
        budget_s=600.0, stall_s=300.0,
        # I/O bound: GPU memory or RSS must move; busy CPUs alone prove nothing.
        progress=ALWAYS, own_signals=frozenset({"gpu memory", "rss"}),
        stall_hint="weight loading stopped moving: check the model path's disk or network "
        "filesystem (iostat, dmesg), then restart the unit",
        markers=(
            # V1 runner "Starting to load model", V2 "Loading model from scratch"
            _mk("load_start", "start", r"Starting to load model|Loading model from scratch"),
            # V0 DefaultModelLoader and forks (HPU: "Loading weights on hpu...")
            _mk("load_device", "start", r"^Loading weights on \w+ ?\.\.\."),
            # weight_utils naming the files it will read (every release since 0.4)
            _mk("weights_format", "progress", r"Using model weights format \["),
            # the tqdm bars of weight_utils' iterators: safetensors/pt/bin shards, and
            # fastsafetensors' ("Loading safetensors using Fastsafetensor loader: 0%")
            _mk("shards", "progress",
                r"Loading (?:(?:safetensors|pt|bin)? ?checkpoint shards|safetensors using "
                r"Fastsafetensor loader):\s*(?P<pct>\d+)% Completed"
                r"\s*\|\s*(?P<done>\d+)/(?P<total>\d+)"),
            _mk("weights_took", "progress", r"Loading weights took (?P<seconds>[0-9.]+) seconds"),
            # "Model loading took 73.7 GiB memory and 343.1 seconds" (≤0.11 "73.7000 GiB and")
            _mk("model_loading_took", "end",
                r"Model loading took (?P<gib>[0-9.]+) ?GiB(?: memory)? and "
                r"(?P<seconds>[0-9.]+) seconds"),
            # V0 model_runner (0.4 → 0.8): "Loading model weights took 19.8557 GB"
            _mk("v0_weights_took", "end", r"Loading model weights took (?P<gib>[0-9.]+) ?GB"),
        ),
        frames=frozenset({"load_model", "load_weights", "get_model", "_initialize_model",
                          "initialize_model", "create_weights", "safetensors_weights_iterator",
                          "process_weights_after_loading"}),
    ),
    Phase(
        "compiling", "compiling (torch.compile)", "compile",
        # Dynamo traces for minutes before inductor writes a file: the longest window.
        budget_s=1200.0, stall_s=480.0,
        # inductor writes its cache as it goes: busy CPUs with a flat cache are spinning.
        progress=ALWAYS, own_signals=frozenset({"compile cache"}),
        stall_hint="busy CPUs but the compile cache does not grow: the compile is spinning; "
        "py-spy dump the workers, clear the compile cache or try -O0/--enforce-eager",
        markers=(
            _mk("compile_start", "start", r"Starting torch\.compile"),
            _mk("compile_cache_dir", "start", r"Using cache directory: .* torch\.compile"),
            # CPU build
            _mk("cpu_warmup", "start", r"Warming up model for the compilation"),
            _mk("dynamo", "progress", r"Dynamo bytecode transform time: (?P<seconds>[0-9.]+)"),
            _mk("graph_loaded", "progress",
                r"Directly load (?:the )?compiled graph|Directly load AOT compilation"),
            _mk("graph_compiled", "progress",
                r"Compiling a graph for (?:compile range|dynamic shape|shape|general shape)"
                r".*?takes (?P<seconds>[0-9.]+) s"),
            _mk("graph_cached", "progress",
                r"Cache the graph (?:of|for) |saved AOT compiled function"),
            _mk("compile_again", "progress", r"Compiling model again due to a load failure"),
            # "torch.compile took 41.2 s in total" (≤0.15 "takes")
            _mk("compile_took", "end",
                r"torch\.compile (?:took|takes) (?P<seconds>[0-9.]+) s in total"),
            _mk("cpu_warmup_done", "end", r"Warming up done\."),
        ),
        frames=frozenset({"compile_fx", "compile_or_warm_up_model"}),
    ),
    Phase(
        "kv_cache", "profile run and KV cache sizing", "kv",
        budget_s=300.0, stall_s=300.0, progress=SIGNALS,
        markers=(
            # 0.30+ one line, ≤0.26 two; the CPU build says "CPU KV cache size"; V0 "# GPU
            # blocks: N, # CPU blocks: M"
            _mk("kv_available", "start", r"Available KV cache memory: (?P<gib>[0-9.]+) ?GiB"),
            _mk("kv_size", "end", r"(?:GPU|CPU|XPU|TPU)? ?KV cache size: " + _NUM + r" tokens"),
            _mk("kv_concurrency", "end", r"Maximum concurrency for " + _NUM + r" tokens"),
            # V0 worker: "Memory profiling takes 19.77 seconds", then the block counts
            _mk("memory_profiling", "progress", r"Memory profiling takes [0-9.]+ seconds"),
            _mk("kv_blocks_v0", "end", r"# (?:GPU|CUDA|cuda) blocks: \d+, # CPU blocks: \d+"),
        ),
        frames=frozenset({"profile_run", "determine_available_memory",
                          "determine_num_available_blocks", "initialize_cache",
                          "_initialize_kv_caches", "initialize_kv_cache",
                          "raise_if_cache_size_invalid", "check_enough_kv_cache_memory",
                          "_check_enough_kv_cache_memory", "get_kv_cache_configs",
                          "get_kv_cache_config",
                          # V1 allocating the sized cache (gpu_model_runner, worker_base)
                          "initialize_from_config", "initialize_kv_cache_tensors",
                          "_allocate_kv_cache_tensors", "_reshape_kv_cache_tensors"}),
    ),
    Phase(
        "capturing_graphs", "capturing CUDA graphs", "graphs",
        budget_s=300.0, stall_s=300.0, progress=SIGNALS,
        markers=(
            # V1 "Capturing CUDA graphs (…)"; V0 0.5 "Capturing the model for CUDA graphs",
            # 0.6-0.8 "Capturing cudagraphs for decoding" and the "CUDA graph shapes" bar
            _mk("capture_start", "start",
                r"Capturing (?:CUDA|cuda) ?graphs|Capturing the model for CUDA graphs"
                r"|Capturing CUDA graph shapes"),
            # V1's CUDAGraphWrapper (compilation/cuda_graph.py, 0.10+) at DEBUG, once per
            # captured shape: "Capturing a cudagraph on (PIECEWISE,BatchDescriptor(…))"
            _mk("capture_shape", "progress", r"Capturing a cudagraph on \("),
            # CUDA refuses a call while a stream is capturing: at startup only vLLM's graph
            # capture captures (cudaErrorStreamCaptureUnsupported/Invalidated, club3090#106)
            _mk("capture_refused", "progress",
                r"cudaErrorStreamCapture\w+|operation not permitted when stream is capturing"),
            _mk("capture_done", "end",
                r"Graph capturing finished in (?P<seconds>[0-9.]+) secs?"
                r"(?:, took (?P<gib>[0-9.]+) GiB)?"),
        ),
        frames=frozenset({"capture_model", "_capture_cudagraphs"}),
    ),
    Phase(
        "api_starting", "starting the HTTP server", "api",
        budget_s=120.0, stall_s=120.0, progress=SIGNALS,
        markers=(
            # the reliable end of engine startup (≤0.18 "seconds")
            _mk("init_engine_took", "start",
                r"init engine \(profile, create kv cache, warmup model\) took "
                r"(?P<seconds>[0-9.]+)"),
            # ≤0.15 "Starting vLLM API server 0 on", later "Starting vLLM server on"
            _mk("server_starting", "progress", r"Starting vLLM (?:API )?server (?:\d+ )?on"),
            # the API server setting up its chat endpoint once the engine is up
            # (serving_chat, 0.11+); not "Supported tasks: […]", which the offline LLM
            # class logs too
            _mk("chat_warmup", "progress",
                r"Warming up chat template processing|Chat template warmup completed"),
            _mk("routes", "progress", r"Available routes are:|Route: /\S*, Methods:"),
            _mk("uvicorn_process", "progress", r"Started server process \[\d+\]"),
            _mk("uvicorn_waiting", "progress", r"Waiting for application startup\."),
            _mk("app_startup_complete", "end", r"Application startup complete\."),
        ),
        # serve_http runs once the engine client is built; not run_server_worker, which
        # builds the engine client itself (`async with build_async_engine_client(…)`, every
        # release since 0.6): its frame is on every API server's unwinding of an engine
        # that died starting, so it proves bootstrap only
        frames=frozenset({"serve_http"}),
    ),
    # Serving evidence seen, /health + a completion not yet proven (live only). The
    # engine's serving loops (V1 run_busy_loop, V0 run_engine_loop/engine_step) only run
    # once the engine is up.
    Phase("ready", "ready (serving)", "ready", budget_s=120.0, stall_s=120.0,
          progress=SIGNALS,
          frames=frozenset({"run_busy_loop", "_process_engine_step", "run_engine_loop",
                            "engine_step", "step_async", "engine_step_async"})),
)

PHASE: Mapping[str, Phase] = {p.name: p for p in PHASE_RECORDS}

PHASES: tuple[str, ...] = tuple(p.name for p in PHASE_RECORDS)

def phase_index(phase: str) -> int:
    return PHASES.index(phase)
