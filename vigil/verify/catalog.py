"""The log catalog: what vLLM's log lines mean for a watcher.

Pure: text in, meaning out. Two records hold everything a watcher knows, one entry per
concept, so adding a phase or a cause is one edit here:

- `Phase`: its name and label, default budget and stall window, which progress signals
  count in it, the hint when it stalls, the log markers that open/advance/close it, and
  the traceback frames that prove a start got that far.
- `Cause`: every wording seen (vLLM rewords its fatal messages across releases, V0 and
  V1 word them differently), the vLLM versions they were seen in, the remedy, what the
  remedy needs from the line, and its role: a root cause, a symptom (something died
  further down) or a link of the failure chain ("… failed to start").

Patterns match fragments, not whole lines. Order matters only inside a table.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
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
        frames=frozenset({"serve_http", "run_server_worker"}),
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


@dataclass(frozen=True)
class Cause:
    """One reason a start fails, with every wording it has been seen in."""

    id: str
    patterns: tuple[str, ...]  # every wording seen (regex fragments)
    versions: tuple[str, ...]  # vLLM versions these wordings were seen in
    remedy: str  # str.format template over the named groups in `needs`
    needs: tuple[str, ...] = ()  # named groups the remedy uses from the proving line
    role: Role = "root"
    reached: str | None = None  # the phase this failure proves the start got to
    # Function names whose traceback frame proves this cause (`File "…", in NAME`).
    frames: frozenset[str] = frozenset()
    # Wordings that name this cause for a crash nothing else explains (a chain line, the
    # unit's state), but never prove one: a library's warning about a call that failed,
    # which its caller may survive.
    hints: tuple[str, ...] = ()
    # A wrapper: its exception carries the one it met (torch.compile's BackendCompilerFailed
    # and InductorError re-raise what the compiled code raised). Another root in the same
    # traceback (an OOM while inductor autotunes) is the cause; this one only says where.
    wraps: bool = False

    @property
    def regex(self) -> re.Pattern[str]:
        return _COMPILED[self.id]


CAUSES: tuple[Cause, ...] = (
    Cause(
        "flashinfer_version_mismatch",
        (r"flashinfer-(?P<pkg>cubin|jit-cache) version \((?P<have>[^)]+)\) does not match "
         r"flashinfer version \((?P<want>[^)]+)\)",),
        ("0.10", "0.11", "0.33"),
        "pin flashinfer-{pkg} to the flashinfer-python version: pip install "
        "flashinfer-{pkg}=={want} (have {have}); or FLASHINFER_DISABLE_VERSION_CHECK=1 if "
        "you know they are compatible",
        needs=("pkg", "want", "have"),
        reached="engine_init",
    ),
    Cause(
        "gpu_memory_held",
        (r"Free memory on device .* on startup is less than desired GPU memory utilization",),
        ("0.10.1", "0.11", "0.33"),
        "another process holds GPU memory: find it with nvidia-smi --query-compute-apps="
        "pid,used_memory --format=csv and stop it (often a stale vLLM), or lower "
        "--gpu-memory-utilization",
        reached="engine_init",
    ),
    Cause(
        "cpu_memory",
        (r"Available memory on node \d+ .* on startup is less than desired CPU memory "
         r"utilization",),
        ("0.32 (CPU build)",),
        "not enough free host memory for --gpu-memory-utilization on the CPU build: lower it "
        "(e.g. 0.5) and/or VLLM_CPU_KVCACHE_SPACE, or free memory on the host",
        reached="engine_init",
    ),
    Cause(
        "kv_cache_too_small",
        (r"To serve at least one request with the models?'s max seq len \((?P<len>\d+)\)",
         # V0 (≤0.8): raise_if_cache_size_invalid
         r"The models?'s max seq len \((?P<len0>\d+)\) is larger than the maximum number of "
         r"tokens that can be stored in KV cache",
         r"No available memory for the cache blocks",
         r"Insufficient memory for KV cache|not enough (?:GPU )?memory (?:for|to allocate) "
         r"(?:the )?KV cache"),
        ("0.5", "0.8 (V0)", "0.10", "0.11", "0.33"),
        "the KV cache cannot hold one request of max_model_len{len_note}: lower "
        "--max-model-len, raise --gpu-memory-utilization, use --kv-cache-dtype fp8, or add "
        "GPUs (--tensor-parallel-size)",
        needs=("len",),
        reached="kv_cache",
    ),
    Cause(
        "out_of_memory",
        # torch's caching allocators word it per device: CUDA (and HIP on ROCm builds,
        # c10/cuda/CUDACachingAllocator), XPU (c10/xpu XPUCachingAllocator), Ascend's
        # torch_npu ("NPU out of memory. Tried to allocate …"), MUSA/MLU forks, MPS
        # ("MPS backend out of memory"); vllm-ascend#19, #1617, llm-scaler#672
        (r"\b(?:CUDA|HIP|XPU|NPU|MUSA|MLU|MPS backend) out of memory|OutOfMemoryError"
         r"|Failed to load model - not enough GPU memory|(?:CUDA|HIP) error: out of memory",
         # the runtimes' own out-of-device-memory codes (HIP, CUDA, Level Zero / UR on XPU)
         r"hipErrorOutOfMemory|cudaErrorMemoryAllocation"
         r"|(?:UR_RESULT|ZE_RESULT)_ERROR_OUT_OF_DEVICE_MEMORY",
         # XLA (TPU via torch_xla or JAX): a program or buffer larger than a memory space,
         # at compile ("Ran out of memory in memory space hbm/vmem/smem") or allocation
         # ("Attempting to allocate 1.0G. That was not possible"), or loading a program
         # reserves HBM ("Attempting to reserve 1.04G at the bottom of memory. That was not
         # possible"); vllm#8318, #16521, GKE #1467, tpu-recipes#151
         r"RESOURCE_EXHAUSTED: .{0,300}?(?:[Rr]an out of memory in memory space"
         r"|Attempting to (?:allocate|reserve) \S{1,20}(?: at the bottom of memory)?\. "
         r"That was not possible"
         r"|[Oo]ut of memory)",
         # AWS Neuron's runtime (libnrt's TDRV allocator, its own log format; status 4 is
         # NRT_RESOURCE): "TDRV:log_dev_mem  Failed to allocate 43.3MB (usage: dma rings) on
         # ND 3:NC 0", "TDRV:dmem_alloc_internal  Failed to alloc DEVICE memory: N",
         # 'nrt_tensor_allocate status=4 message="Allocation Failure"' (vllm#12443,
         # transformers-neuronx#92, optimum-neuron#668)
         r"TDRV:\w{1,40} {1,40}Failed to alloc(?:ate)? (?:DEVICE memory|[\d.]{1,20} ?[KMG]?B )"
         r"|nrt_tensor_allocate status=4\b",
         # Habana's PyTorch bridge on Gaudi: "FATAL ERROR :: MODULE:PT_DEVMEM Allocation
         # failed for size::234881024 (224)MB" (optimum-habana#1469, #289)
         r"MODULE:PT_DEVMEM Allocation failed"),
        ("0.5", "0.6 (TPU)", "0.7.1 (Ascend NPU)", "0.7 (Neuron)", "0.8", "0.8.5 (TPU)", "0.11",
         "0.2x (XPU)", "0.33"),
        "the model does not fit in the accelerator's memory (GPU, XPU, NPU, Neuron, Gaudi or TPU "
        "HBM): stop "
        "other users of the device, raise --tensor-parallel-size, use a quantized checkpoint, "
        "or lower --max-model-len / --max-num-seqs / --gpu-memory-utilization; an OOM while "
        "compiling or capturing graphs (the phase says) also goes away with --enforce-eager "
        "or fewer cudagraph capture sizes",
    ),
    Cause(
        "max_model_len_exceeds_model",
        (r"User-specified max_model_len \((?P<len>\d+)\) is greater than the derived "
         r"max_model_len",),
        ("0.5", "0.10", "0.33"),
        "--max-model-len{len_note} is larger than the model's context: lower it to the "
        "model's max_position_embeddings (or use --max-model-len auto)",
        needs=("len",),
    ),
    Cause(
        "tp_indivisible",
        (r"must be divisible by tensor parallel size",
         r"is not divisible by (?:the )?(?:tensor parallel size|tp_size|world size)"),
        ("0.5", "0.33"),
        "the attention heads (or another dimension) are not divisible by "
        "--tensor-parallel-size: pick a TP size that divides them (e.g. 1, 2, 4, 8)",
    ),
    Cause(
        "not_enough_gpus",
        (r"World size \((?P<world>\d+)\) is larger than the number of available GPUs",
         # Ray executor (0.4 → 0.6): initialize_ray_cluster
         r"The number of required GPUs exceeds the total number of available GPUs in the "
         r"placement group",
         r"Current node has no GPU available|requires \d+ GPUs? but only \d+ (?:is|are) "
         r"available",
         # mp executor (0.6 → 0.10): "please ensure that world_size (2) is less than than
         # max local gpu count (1)"
         r"world_size \((?P<world1>\d+)\) is less than than max local gpu count",
         # V1 gpu_worker (0.11): local_world_size (16) must be … visible devices (8)
         r"local_world_size \((?P<world2>\d+)\) must be less than or equal to the number "
         r"of visible devices",
         # config validation (0.11.1+), vllm#30061 and others
         r"Tensor parallel size \((?P<world3>\d+)\) cannot be larger than the number of "
         r"available GPUs",
         # Ray executor (V0 ray_gpu_executor, 0.4 → 0.10): the placement group has no GPU
         # bundle on the node vLLM runs on (VLLM_HOST_IP names another node, vllm#7815)
         r"Ray does not allocate any GPUs on the driver node",
         # ray_utils._wait_until_pg_ready gives up after PG_WAIT_TIMEOUT (1800 s): 0.6.5+
         # "Cannot provide a placement group of placement_group_specs=[…] within 1800
         # seconds", later "… requiring 4.0 GPUs (placement_group_specs=[…]) within …"
         # (gpustack#5181)
         r"Cannot provide a placement group\b.{0,4000}? within \d+ seconds"),
        ("0.2.7 (Ray)", "0.5 (Ray)", "0.7", "0.10", "0.11", "0.33"),
        "tensor x pipeline parallel size{world_note} exceeds the visible GPUs: lower "
        "--tensor-parallel-size/--pipeline-parallel-size or fix CUDA_VISIBLE_DEVICES (and, "
        "with Ray, the GPUs each node offers)",
        needs=("world",),
    ),
    Cause(
        "executor_unsupported",
        # vLLM refuses a distributed executor backend the platform or the layout cannot run
        # (vllm-cpu 0.32.0, measured on the lab: ray on the CPU build)
        (r"current platform \S+ does not support ray",  # v1/executor/ray_utils.py, ray_v2
         # config/parallel.py: multi-node (--nnodes) only on mp, uni or external_launcher
         r"nnodes > 1 can only be set when distributed executor backend is",
         r"Unrecognized distributed executor backend \S+",  # config/parallel.py
         r"Unknown distributed executor backend: \S+",  # v1/executor/abstract.py
         r"Failed to import Ray: .* install Ray"),  # ray_utils.assert_ray_available
        ("0.32 (CPU build)", "0.33"),
        "vLLM's distributed executor backend cannot run here: the platform (e.g. the CPU "
        "build for ray), the layout (--nnodes needs the mp backend) or the environment (ray "
        "not installed) does not support it. Use vLLM's native multi-node (backend: native "
        "in the node group), or run ray on a GPU platform with ray pinned in the stack",
        reached="engine_init",
    ),
    Cause(
        "nccl_error",
        (r"NCCL error|Failed to load NCCL library"
         r"|ncclSystemError|ncclInternalError|ncclUnhandledCudaError"
         # cupy's binding (0.9): NcclError: NCCL_ERROR_SYSTEM_ERROR: …
         r"|NCCL_ERROR_[A-Z_]+",
         # torch's ProcessGroupNCCL watchdog (LOG(ERROR) in checkTimeout): a collective
         # never finished, and torch takes the process down (any torch 2.x under vLLM).
         # Not its "Some NCCL operations have failed or timed out": torch logs that for
         # any error the watchdog meets, a CUDA illegal memory access too.
         r"Watchdog caught collective operation timeout",
         # NCCL's init.cc: two ranks on one device is ncclInvalidUsage, the communicator
         # is never made (CUDA_VISIBLE_DEVICES or a Ray GPU assignment gone wrong; trl#3310,
         # verl#161, Megatron-LM#661, horovod#3929)
         r"Duplicate GPU detected : rank \d+ and rank \d+ both on CUDA device"),
        ("0.5", "0.5.4", "0.6", "0.10", "0.33"),
        "NCCL failed: check that every GPU is visible and healthy (nvidia-smi topo -m), the "
        "NCCL library matches torch, and run with NCCL_DEBUG=INFO to see the failing "
        "transport; a collective that timed out (the watchdog) means a rank hung or died "
        "first: read every rank's log, and try NCCL_P2P_DISABLE=1 if the first all-reduce "
        "never completes",
        reached="distributed_init",
        # NCCL's own `host:pid:tid [dev] file.cc:N NCCL WARN <text>` (NCCL_DEBUG=WARN or
        # INFO): CUDACHECK's "Cuda failure '…'" returns ncclUnhandledCudaError and the INFO
        # "file.cc:N -> 1" lines carry it up (vllm#20226, #9369, #6732, nccl#1029), but a
        # WARN is also logged for what NCCL falls back from or meets in teardown ("[Proxy
        # Service] Poll failed"): it names the cause, never proves the crash.
        hints=(r"NCCL WARN .{0,300}?(?:[Ff]ail(?:ed|ure)|[Ee]rror)",),
    ),
    Cause(
        "distributed_init_timeout",
        # torch.distributed's rendezvous gives up on a rank that never joined: TCPStore's
        # server ("Timed out after 601 seconds waiting for clients. 1/4 clients joined.",
        # c10d TCPStore.cpp), a client that cannot reach the store (the exception
        # "DistNetworkError: The client socket has timed out after 600000ms while trying to
        # connect to (host, port)"; the socket's own log line of each attempt is a retry,
        # the store_connect wait),
        # a store wait ("DistStoreError: wait timeout after 600000ms") and
        # distributed_c10d's store-based barrier; vllm#17056 (DP 4), #19670, #12526
        (r"Timed out after \d+ seconds waiting for clients(?:\. (?P<joined>\d+)/(?P<world>\d+) "
         r"clients joined)?"
         # torch ≤ 2.1 says the timeout in seconds ("1800s"), later in ms
         r"|The client socket has timed out after \d+ ?(?:ms|s|min)\b while trying to connect to "
         r"\((?P<host>[^,()]{1,200}), ?(?P<port>\d+)\)"
         # TCPStore's own give-up once its retries pass the timeout (torch ≥ 2.5, whatever
         # error the last try met); its retries are the store_connect wait
         r"|TCP client failed to connect/validate to host (?P<host2>\S{1,200}?):(?P<port2>\d+) "
         r"- timed out \(try="
         # the exception when every address failed (vllm#2427, torch 2.1: errno 110); the
         # socket's own log line of it is a retry on torch ≥ 2.5 (store_connect)
         r"|(?:Error|Exception): The client socket has failed to connect to any network "
         r"address of \((?P<host3>[^,()]{1,200}), ?(?P<port3>\d+)\)"
         r"|DistStoreError: [Ww]ait timeout after \d+ ?ms"
         r"|Timed out initializing process group in store based barrier"
         # V1's DP coordinator process not up within its startup timeout (vllm#37452:
         # 30 s, --data-parallel-coordinator-startup-timeout since #43611)
         r"|DP Coordinator process failed to report ZMQ addresses during startup",),
        ("0.5", "0.8", "0.9"),
        "the distributed rendezvous timed out: a rank{joined_note} never joined (another node "
        "or data-parallel rank did not start, or failed before it connected), or it cannot "
        "reach the store{store_note}. Start every node with the same world size and master "
        "address/port, open that port between the nodes, set GLOO_SOCKET_IFNAME/"
        "NCCL_SOCKET_IFNAME to the interface they share, and read the other ranks' logs for "
        "the failure that kept them away",
        needs=("joined", "world", "host", "port"),
        reached="distributed_init",
    ),
    Cause(
        "port_in_use",
        # uvicorn ≤0.6: "[Errno 98] error while attempting to bind on address (…): [errno 98]
        # address already in use"; Python's OSError "[Errno 98] Address already in use"
        (r"\[[Ee]rrno 98\] (?:error while attempting to bind.*: )?(?:\[errno 98\] )?"
         r"[Aa]ddress already in use",
         r"\[[Ee]rrno 48\] [Aa]ddress already in use"),
        ("0.6 (uvicorn bind)", "0.10", "0.33"),
        "the port is taken: stop the process listening on it (ss -ltnp) — often a stale "
        "vLLM — or set a different --port",
    ),
    Cause(
        "corrupt_weights",
        (r"Error while deserializing header|HeaderTooLarge|HeaderTooSmall"
         r"|MetadataIncompleteBuffer|incomplete metadata, file not fully covered"
         r"|InvalidHeaderDeserialization|safetensors_rust\.SafetensorError",
         r"Cannot find any model weights with",
         r"(?:PytorchStreamReader failed|unexpected EOF, expected \d+ more bytes)"),
        ("0.5", "0.8", "0.10", "0.11"),
        "the weights are corrupt or incomplete (a truncated or missing shard): re-download "
        "the model (huggingface-cli download … or check every shard's size against the "
        "index) and verify the model directory before restarting",
        reached="loading_weights",
    ),
    Cause(
        "kernel_jit_build_failed",
        (r"ninja: build stopped: subcommand failed",
         r"Command '\[?'?ninja'?.*returned non-zero exit status",
         r"Ninja build failed|Error building extension|ninja: error:",
         # flashinfer's jit cpp_ext.get_cuda_path: its JIT (the top-p/top-k sampler,
         # attention) needs nvcc and the host has only the CUDA runtime
         r"Could not find nvcc and default cuda_home="),
        ("0.9", "0.10.1", "0.11"),
        "a kernel JIT build (flashinfer/ninja) failed: install the prebuilt kernels "
        "(flashinfer-cubin/flashinfer-jit-cache matching flashinfer-python), make nvcc and "
        "the CUDA toolkit match torch's CUDA, or pick another attention/sampling backend "
        "(VLLM_ATTENTION_BACKEND, VLLM_USE_FLASHINFER_SAMPLER=0)",
        # torch.utils.cpp_extension runs every JIT build through _run_ninja_build,
        # flashinfer's jit/cpp_ext.py through run_ninja (slime#1314): each only runs
        # ninja and raises when it fails, so in a traceback the build itself failed.
        # Not flashinfer's build_and_load: it also loads the module and may not build.
        frames=frozenset({"_run_ninja_build", "run_ninja"}),
    ),
    Cause(
        "platform_not_detected",
        # config DeviceConfig: current_platform is UnspecifiedPlatform (vLLM logs "No
        # platform detected" first): no GPU visible to the process, or NVML/torch broken
        (r"Failed to infer device type",),
        ("0.6", "0.7", "0.8"),
        "vLLM found no GPU platform: make the GPUs visible to the service (nvidia-smi as the "
        "service's user; a container needs the NVIDIA runtime / --gpus; check "
        "CUDA_VISIBLE_DEVICES), and if they are, repair the environment (torch built for "
        "CUDA, a working pynvml/nvidia-ml-py); VLLM_LOGGING_LEVEL=DEBUG says why detection "
        "failed",
        reached="bootstrap",
    ),
    Cause(
        "cuda_driver_mismatch",
        (r"CUDA driver version is insufficient for CUDA runtime version"
         r"|The NVIDIA driver on your system is too old"
         r"|Found no NVIDIA driver on your system|NVIDIA driver .* too old"
         r"|cudaErrorInsufficientDriver|CUDA_ERROR_(?:SYSTEM_DRIVER_MISMATCH|COMPAT_NOT_SUPPORTED)"
         r"|forward compatibility was attempted on non supported HW",),
        ("0.5", "0.8", "0.11"),
        "the NVIDIA driver is older than the CUDA that torch/vLLM was built for: upgrade the "
        "driver, or install the vLLM/torch build for the host's CUDA (nvidia-smi shows the "
        "highest CUDA the driver supports)",
    ),
    # Before unsupported_gpu: these name a dtype or a quantization, whose fix is a flag or
    # another checkpoint, not another build.
    Cause(
        "dtype_unsupported",
        # worker _check_if_gpu_supports_dtype (V0), platforms' check_if_supports_dtype (V1)
        (r"Bfloat16 is only supported on GPUs with compute capability",),
        ("0.2", "0.5", "0.6", "0.10"),
        "the GPU has no bfloat16 (compute capability below 8.0: V100, T4, RTX 20xx): start "
        "with --dtype half (float16), or use a GPU of compute capability 8.0 or newer",
        reached="engine_init",
        # The checks' only raise is this refusal (worker.py's _check_if_gpu_supports_dtype
        # 0.2 → 0.10; platforms' check_if_supports_dtype after it, whose in-tree raises
        # are bfloat16 too: CUDA below sm80, XPU's A770): a traceback through them is
        # this cause when the paste cuts the ValueError (QAnything#128)
        frames=frozenset({"_check_if_gpu_supports_dtype", "check_if_supports_dtype"}),
    ),
    Cause(
        "quantization_unsupported",
        # config (VllmConfig/ModelConfig): the capability gate and the method check;
        # compressed_tensors._check_scheme_supported; ModelConfig's mismatch check
        (r"The quantization method \S+ is not supported for the current GPU"
         r"|Quantization scheme is not supported for"
         r"|Unknown quantization method: \S*"
         r"|Quantization method specified in the model config \(\S+\) does not match"
         # Triton's codegen on a GPU without FP8 e4m3 (sm80/sm86, gfx90a): an FP8
         # checkpoint's (or fp8 KV cache's) kernels cannot compile (vllm#54318, #17581)
         r"|type fp8e4nv not supported in this architecture",
         # vLLM's CUTLASS entry points (csrc/quantization/…/scaled_mm_entry.cu and the
         # sparse, FP4 and MoE ones): TORCH_CHECK_NOT_IMPLEMENTED when the build has no
         # kernel of the scheme for this arch ("No compiled cutlass_scaled_mm for CUDA
         # device capability: 120. Required capability: 90 or 100"), and _custom_ops'
         # hint under it (vllm#9419 on sm75, #32109 on sm120)
         r"No compiled [\w ]{1,80}? for (?:a compute capability|CUDA device capability)"
         r"[^:]{0,60}: ?(?P<cap>\d+)"
         r"|Not implemented or built, mostly likely because the current (?:current )?device "
         r"does not support this kernel",
         # CUTLASS's own status strings (cutlassGetStatusString), raised by vLLM's
         # CUTLASS_CHECK around its quantized GEMMs: the kernel cannot run on this arch
         # (GB10/sm121 vllm#43367, Thor's FP4 runner #24377, 2:4 sparse #11763)
         r"(?:[Cc]utlass|CUTLASS|RuntimeError: |\.cuh?:\d{1,6}:? )[^\n]{0,200}?"
         r"\bError (?:Internal|Not Supported|Arch Mismatch|Invalid Problem)\b",
         # libtorch_stable's STD_TORCH_CHECK names the failing check's place: a check in
         # vLLM's quantization kernels' dispatch (vllm#47818: dispatch_scaled_mm on sm120)
         r"\bcsrc/[\w/]{0,80}?quantization/[\w/.\-]{1,200}\.(?:cuh?|hpp|h|cpp):\d{1,6}\b"),
        ("0.2", "0.4", "0.6.3", "0.8", "0.9", "0.10", "0.11", "0.13", "0.23"),
        "the checkpoint's quantization has no kernel here{cap_note}: the GPU is below the "
        "method's minimum compute capability, or this build has no kernel of the scheme for "
        "this arch (CUTLASS FP8/FP4/INT8 GEMMs on new parts such as Blackwell sm_100, sm_120 "
        "(RTX 50xx, RTX PRO 6000) or sm_121 (GB10)). Fall back to another kernel with "
        "VLLM_DISABLED_KERNELS=<the CUTLASS kernel vLLM logged as selected> (Triton or "
        "Marlin take over), upgrade to a vLLM build whose kernels include this arch, or use "
        "a checkpoint quantized for this GPU (or the unquantized model); drop a "
        "--quantization that contradicts the checkpoint's config",
        needs=("cap",),
    ),
    Cause(
        "unsupported_gpu",
        (r"no kernel image is available for execution on the device|cudaErrorNoKernelImageForDevice"
         # torch's warning at CUDA init: the wheel's arch list lacks the GPU (sm_120 on a
         # cu126 torch: vllm#21633, production-stack#528, OCRFlux#70)
         r"|CUDA capability sm_(?P<arch>\d+) is not compatible"
         r"|is not compatible with the current PyTorch installation"
         r"|(?:requires|needs) (?:a )?(?:GPU|device)s? with compute capability"
         r"|(?:compute capability|capability) (?:of )?\d+\.\d+ (?:is )?(?:not supported|too low)",
         # HIP's equivalents on ROCm: the build has no code object for this gfx target
         # (gpustack#3786 on gfx1151; hip_code_object.cpp's hipErrorNoBinaryForGpu)
         r"HIP error: invalid device function|hipErrorInvalidDeviceFunction"
         r"|hipErrorNoBinaryForGpu|Unable to find code object for all current devices"
         # hipErrorInvalidImage ("device kernel image is invalid", hipGetErrorString): the
         # code object loads but is not for this gfx target (ROCm on RDNA2/3 without a
         # build for it: TheRock#5543, vllm-rocm-windows-rdna2#7)
         r"|hipErrorInvalidImage|(?:HIP|CUDA) error: device kernel image is invalid"
         # SYCL on Intel GPUs: an ahead-of-time build for another device ("-42
         # (PI_ERROR_INVALID_BINARY)", UR's UR_RESULT_ERROR_INVALID_BINARY)
         r"|PI_ERROR_INVALID_BINARY|UR_RESULT_ERROR_INVALID_BINARY",
         # ptxas (CUDA's PTX assembler, the copy Triton bundles) older than the GPU: it
         # refuses the arch ("ptxas fatal : Value 'sm_121a' is not defined for option
         # 'gpu-name'"), and Triton's make_cubin raises CalledProcessError for the ptxas
         # command; only for sm_100 and later, where the toolchain lags (GB10: MinerU#4350,
         # cosmos-reason2#30)
         r"Value 'sm_(?P<arch3>\d+)\w?' is not defined for option 'gpu-name'"
         r"|Command '\[[^\]]{0,400}ptxas'[^\]]{0,400}'--gpu-name=sm_(?P<arch4>1\d\d)\w?'"
         r"[^\]]{0,400}\]' returned non-zero exit status"),
        ("0.5", "0.7", "0.8", "0.10", "0.11 (ROCm)"),
        "this build has no kernels for the GPU's architecture{arch_note}: on NVIDIA Blackwell "
        "(sm_100 B200, sm_120 RTX 50xx / RTX PRO 6000, sm_121 GB10) install a vLLM and torch "
        "built for CUDA 12.8 or newer (the cu128/cu129/cu130 wheels or images) or build with "
        "TORCH_CUDA_ARCH_LIST naming it; on AMD install a ROCm build for the GPU's gfx target "
        "(PYTORCH_ROCM_ARCH), or HSA_OVERRIDE_GFX_VERSION where a compatible target exists; "
        "when Triton's bundled ptxas refuses the arch, point TRITON_PTXAS_PATH at a newer "
        "CUDA's ptxas (12.9+ for sm_121); on pre-Ampere GPUs a dtype it supports (--dtype "
        "half)",
        needs=("arch",),
    ),
    Cause(
        "model_access_denied",
        (r"401 Client Error|403 Client Error|GatedRepoError|Access to model .* is restricted"
         r"|You are trying to access a gated repo|Cannot access gated repo"
         r"|Invalid (?:user )?token|RepositoryNotFoundError|Repository Not Found for url",),
        ("0.5", "0.8", "0.11"),
        "the model download was refused: accept the model's licence on its hub page, pass a "
        "token with access (HF_TOKEN in secret_env), check the model id, or point --model "
        "at a local copy",
    ),
    Cause(
        "unsupported_model",
        # model_executor/models/registry.py: the architecture is not in this vLLM's registry.
        # When the name IS in the supported list on the same line, the registry failed to
        # import the model (a broken dependency): not this cause.
        # (bounded scans: a long hostile line must stay linear)
        (r"Model architectures \[(?P<arch>[^\]]{0,400})\] are not supported for now"
         r"(?!\.? ?Supported architectures: [^\]]{0,20000}?(?P=arch))",
         # transformers' AutoConfig: a model_type its CONFIG_MAPPING lacks
         r"has model type `?[\w.\-]+`? but Transformers does not recognize this architecture",
         r"GGUF model with architecture \S+ is not supported yet",
         # registry / model_loader (0.8+): no vLLM class and the Transformers backend
         # cannot stand in for it
         r"has no vLLM implementation and the Transformers implementation is not "
         r"compatible with vLLM",
         r"Cannot find model module\. '\S+' is not a registered model in the Transformers"),
        ("0.1", "0.6", "0.10", "0.16"),
        "this vLLM (or its transformers) does not know the model's architecture: upgrade vLLM "
        "(and transformers) to a release that lists the model as supported, or serve a model "
        "this release supports",
        reached="bootstrap",
    ),
    Cause(
        "bad_arguments",
        # argparse's error(): `prog: error: message` (FlexibleArgumentParser is argparse)
        (r"^[\w.\-]+(?: [\w\-]+)?: error: (?:unrecognized arguments|argument |the following "
         r"arguments are required|ambiguous option|invalid choice)",),
        ("0.2", "0.6", "0.12", "0.15"),
        "vLLM rejected its command line: remove or fix the option the line names (vllm serve "
        "--help lists this release's options; options move between releases, and a plugin's "
        "options exist only when the plugin is installed)",
        reached="bootstrap",
    ),
    Cause(
        "lora_rank_too_large",
        # vllm/lora worker_manager._load_adapter (0.4 → 0.8), peft_helper.validate_legal
        # (0.8+): an adapter loaded at start (--lora-modules) has a higher rank than
        # --max-lora-rank (default 16)
        (r"LoRA rank (?P<rank>\d+) is greater than max_lora_rank (?P<max>\d+)",),
        ("0.4", "0.8", "0.11"),
        "the LoRA adapter has rank {rank} but --max-lora-rank is {max}: start with "
        "--max-lora-rank {rank} (or larger; it must be one the release accepts, e.g. 8, 16, "
        "32, 64, 128, 256), or serve an adapter trained at a lower rank",
        needs=("rank", "max"),
        reached="bootstrap",
    ),
    Cause(
        "hf_hub_unreachable",
        # huggingface_hub (offline mode, the local cache) and requests/urllib3 to the hub
        (r"OfflineModeIsEnabled|LocalEntryNotFoundError|outgoing traffic has been disabled"
         r"|We couldn't connect to 'https?://huggingface\.co'"
         r"|Failed to resolve '?huggingface\.co|Max retries exceeded with url: /api/models/",),
        ("0.2", "0.4", "0.11"),
        "the model hub cannot be reached (no network, DNS, a proxy, or HF_HUB_OFFLINE=1 with "
        "the files not in the cache): point --model at a local copy of the model, download it "
        "to the host's cache first, or fix the network (HF_ENDPOINT for a mirror)",
        reached="bootstrap",
    ),
    Cause(
        "broken_install",
        # An import of vLLM or its native extensions fails: built against another torch or
        # CUDA (undefined symbol, a missing libcudart), or vLLM not installed where it runs.
        (r"(?:ImportError|OSError): [^\s:]{1,400}\.so[^\s:]{0,40}: undefined symbol"
         r"|(?:ImportError|OSError): (?!libcuda\.so)[^\s:]{1,400}\.so[\d.]{0,20}: cannot open "
         r"shared object file"
         r"|ModuleNotFoundError: No module named '(?:vllm|torch)\b[\w.]*'"
         r"|ImportError: cannot import name '\w+' from '(?:vllm|torch)\b"
         # the dynamic loader's refusal names the extension's path first, whatever the
         # reason after it (undefined symbol, wrong ELF class, a GLIBC version): Python's
         # own ImportErrors never start with a path (qwen3-asr#15, vllm#3912, vllm-9377)
         r"|ImportError: /[^\s:]{1,400}\.(?:so\b|cpython-\d)"
         # vllm/vllm_flash_attn/__init__.py: a build without its compiled FA extensions
         # (vLLM-2080Ti#17, vllm-musa#19)
         r"|vllm\.vllm_flash_attn requires the CUDA flash attention extensions",),
        ("0.2", "0.6", "0.7", "0.11"),
        "the Python environment is broken: vLLM or an extension (flash-attn, xformers) was "
        "built for another torch/CUDA, or vLLM is not installed in the interpreter that runs "
        "it. Reinstall vLLM into a clean venv with the torch it pins (pip install vllm==X "
        "pulls the matching torch), then rebuild extensions against that torch",
        reached="bootstrap",
    ),
    Cause(
        "torch_compile_failed",
        # torch.compile (Dynamo/Inductor) raising inside vLLM's compile of the model
        (r"BackendCompilerFailed|torch\._inductor\.exc\.\w+|InductorError",),
        ("0.7", "0.8", "0.9"),
        "torch.compile failed: start with --enforce-eager or -O0 to skip compilation, clear "
        "the compile cache (~/.cache/vllm/torch_compile_cache); if the error names a compiler "
        "(gcc, Triton's build), install a working C toolchain and the python3-dev headers",
        reached="compiling",
        wraps=True,
    ),
    Cause(
        "trust_remote_code",
        # transformers' refusal; never the flag echoed in the engine config
        (r"(?:pass|set) the (?:argument|option) `?trust_remote_code=True`?"
         r"|requires you to execute the (?:configuration|modeling|tokenizer)? ?file"
         r"|contains custom code which must be executed"
         # vLLM's get_config re-raises transformers' refusal with its own advice
         # (vllm/transformers_utils/config.py; litellm#4600)
         r"|consider setting `trust_remote_code=True`",),
        ("0.5", "0.8", "0.11"),
        "the model ships its own code: add --trust-remote-code (trust_remote_code: true in "
        "the profile) if you trust the repository",
        # transformers' resolve_trust_remote_code raises only to refuse (or when its
        # interactive prompt meets no terminal): a traceback through it is this cause
        # even when the paste cuts the message (litellm#6121, runpod worker-vllm#43)
        frames=frozenset({"resolve_trust_remote_code"}),
    ),
    Cause(
        "tokenizer_missing",
        (r"Can't load tokenizer for|Couldn't instantiate the backend tokenizer"
         r"|tokenizer\.(?:json|model).* (?:not found|does not exist)"
         r"|Failed to load the tokenizer|No tokenizer file found in directory",),
        ("0.5", "0.8", "0.12"),
        "the tokenizer cannot be loaded: make sure the model directory has tokenizer files "
        "(tokenizer.json / tokenizer.model), or pass --tokenizer with a path or hub id",
    ),
    Cause(
        "disk_full",
        (r"No space left on device|\[Errno 28\]|Disk quota exceeded",),
        ("0.5", "0.8", "0.11"),
        "the disk is full (model download, compile cache or /tmp): free space with df -h / "
        "du, move the cache (HF_HOME, VLLM_CACHE_ROOT) to a larger disk",
    ),
    Cause(
        "cache_dir_not_writable",
        # os.makedirs of a cache under $HOME fails for a user whose HOME is / or a
        # root-owned mount: Triton's runtime/cache.py, huggingface_hub's download cache,
        # torch inductor's and vLLM's compile caches (aphrodite#458's '.triton',
        # inference-benchmarker#30's '/.cache' on OpenShift, vllm#10185, ilab-on-ocp#26)
        (r"Permission denied: '(?P<path>[^']{0,300}?(?:cache|\.triton|torchinductor"
         r"|huggingface)[^']{0,300})'",),
        ("0.4 (aphrodite fork)", "0.6.3", "0.9.1"),
        "the service user cannot write the cache directory {path}: give it a HOME it owns "
        "(or point HF_HOME, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and VLLM_CACHE_ROOT "
        "at a writable directory), or chown that directory to the service user",
        needs=("path",),
    ),
    # Last of the roots: a specific cause on the same line wins (first match).
    Cause(
        "config_invalid",
        # pydantic's per-field line under "N validation error(s) for XConfig" (0.10+), and
        # SchedulerConfig.verify_max_model_len (every release since 0.2)
        (r"^Value error, "
         r"|max_num_batched_tokens \(\d+\) is smaller than max_model_len \(\d+\)",),
        ("0.2", "0.7", "0.10", "0.24"),
        "vLLM rejected its configuration: the line after 'Value error,' says which setting "
        "and why (e.g. raise --max-num-batched-tokens to at least --max-model-len, or enable "
        "chunked prefill); a JSON error there means a broken config file in the model "
        "directory",
        reached="bootstrap",
    ),
    # Symptoms: the engine or a worker died; the root cause is normally above.
    Cause(
        "engine_dead",
        (r"EngineDeadError|EngineCore encountered a fatal error|Worker proc \S+ died "
         r"unexpectedly|WorkerProc hit an exception|Worker failed with error"
         # V1 core_client's engine monitor (0.10+): the engine core's process is gone
         r"|Engine core proc \S+ died unexpectedly"
         r"|AsyncEngineDeadError|Background loop has errored already"
         # V0 multiprocessing front end (0.6 → 0.8)
         r"|Engine process \(pid \d+\) died|MQLLMEngine is already dead"
         # V0 multiproc_worker_utils.WorkerMonitor (0.5 → 0.8)
         r"|Worker \S+ pid \d+ died, exit code: -?\d+",),
        ("0.5", "0.8", "0.11", "0.20"),
        "the engine died after starting: read the traceback before this line in the journal "
        "(journalctl -u UNIT); a first completion failing after /health 200 often means the "
        "model is unsupported on this backend",
        role="symptom",
    ),
    # The API server lists no failed process and no root cause came before: the engine
    # core vanished without a traceback of its own, i.e. a signal (OOM killer, kill -9).
    Cause(
        "engine_killed",
        # `{}`: the engine was gone before its exit code was collected; under load the
        # code is in: `{'EngineCore': -9}` (-9: killed by SIGKILL), lab5, vllm-cpu 0.32.0
        (r"Engine core initialization failed\. See root cause above\. Failed core proc\(s\): "
         r"\{(?:[^{}]*: -9\b[^{}]*)?\}",
         # systemd: the main process was killed by SIGKILL, or the unit's cgroup hit OOM
         r"Main process exited, code=killed, status=9/KILL|Failed with result 'oom-kill'"),
        ("0.10", "0.11", "0.33"),
        "the engine core died without an error of its own, so it was killed: look for the "
        "kernel's OOM killer (journalctl -k | grep -i 'killed process') or an operator's "
        "kill; free host memory or lower --gpu-memory-utilization, then restart",
        role="symptom",
    ),
    Cause(
        "unknown",
        (r"WorkerProc failed to start|EngineCore failed to start"
         r"|Engine core initialization failed|EngineCore hit an exception"
         # multiproc_executor.wait_for_ready, 0.9+
         r"|WorkerProc initialization failed due to an exception"
         # libstdc++'s terminate handler: a C++ exception nobody caught aborts the process
         # (torch's c10::DistBackendError from the NCCL watchdog thread, vllm#20170/#11248)
         r"|terminate called after throwing an instance of"
         # the executor/core client relaying a worker's SIGUSR1 (0.8+)
         r"|[Gg]ot fatal signal from worker processes"
         # V1 EngineCore/MultiprocExecutor once the executor is failed (a worker died,
         # its monitor said so first): `raise RuntimeError("Executor failed.")`, 0.9+
         r"|^(?:RuntimeError: )?Executor failed\.$"
         # V0 multiprocessing front end (0.6 → 0.8)
         r"|Engine process failed to start"
         # a V0 worker wrapper logging a failed method before re-raising it (0.4 → 0.8):
         # worker_base.execute_method, multiproc_worker_utils._run_worker_process
         r"|Error executing method '?\w+'?\. This might cause deadlock"
         r"|Exception in worker \S+ while processing method \w+"
         # systemd: the main process exited with a failure status (not a clean stop)
         r"|Main process exited, code=(?:exited, status=[1-9]\d*/|dumped)",),
        ("0.10", "0.33"),
        "the engine failed to start: read the root-cause traceback above this line in the "
        "journal (journalctl -u UNIT -n 200)",
        role="chain",
        # V1's engine core process target: a traceback through it is the engine core
        # dying of an exception (SIGTERM/SIGINT leave it as SystemExit, quietly), seen
        # alone when a paste keeps only the chain (vllm#18567)
        frames=frozenset({"run_engine_core"}),
    ),
)



@dataclass(frozen=True)
class Wait:
    """A wait the log reports: vLLM, Ray or torch.distributed waiting for what only the
    cluster or another process can give. Its line repeats while nothing moves, so it
    proves the process alive, never progress; when the wait never ends, `cause` names
    why (None: the line names nothing)."""

    id: str
    what: str  # for people: "a Ray placement group"
    pattern: re.Pattern[str]
    cause: str | None = None
    reached: str | None = None  # the phase the wait proves the start got to
    # The line quotes the error it retries after (torch's TCPStore client): it is the wait
    # whatever that error says, and only the give-up or the process's exit ends the start.
    retries: bool = False
    source: str = ""  # for people: who logs it, where, since when


WAITS: tuple[Wait, ...] = (
    # ray_utils._wait_until_pg_ready, every 10 s until PG_WAIT_TIMEOUT (1800 s): "Waiting
    # for creating a placement group of specs for 150 seconds. specs=[…]" (0.5 → 0.33)
    Wait("ray_placement_group", "a Ray placement group",
         re.compile(r"Waiting for creating a placement group of specs for (?P<waited>\d+) "
                    r"seconds"),
         cause="not_enough_gpus", reached="engine_init",
         source="vLLM ray_utils._wait_until_pg_ready, INFO every 10 s until "
                "PG_WAIT_TIMEOUT (0.5 → 0.33)"),
    # ray_utils before that wait, a WARNING since 0.6.5 (vllm#11138: it waits instead of
    # raising): "The number of required GPUs exceeds the total number of available GPUs in
    # the placement group"; 0.11+ "Tensor parallel size (16) exceeds available GPUs (8)"
    Wait("ray_gpu_shortfall", "GPUs the Ray cluster does not have",
         re.compile(r"The number of required GPUs exceeds the total number of available GPUs "
                    r"in the placement group|Tensor parallel size \(\d+\) exceeds available "
                    r"GPUs \(\d+\)"),
         cause="not_enough_gpus", reached="engine_init",
         source="vLLM ray_utils, WARNING before the placement-group wait (0.6.5 →; 0.11+ wording)"),
    # Ray's autoscaler and scheduler on a request no node can satisfy (printed by Ray, not
    # vLLM: "Error: No available node types can fulfill resource request {'GPU': 1.0}",
    # "Warning: The following resource request cannot be scheduled right now")
    Wait("ray_infeasible", "GPUs no Ray node type offers",
         re.compile(r"No available node types can fulfill resource request"
                    r"|The following resource request cannot be scheduled right now"),
         cause="not_enough_gpus",
         source="Ray's autoscaler and scheduler"),
    # V1 front end, wait_for_engine_startup (v1/engine/utils.py, 0.9+) at DEBUG every 10 s:
    # "Waiting for 1 local, 0 remote core engine proc(s) to start." A remote engine is a
    # data-parallel rank on another node that has not connected; a local one is an engine
    # core still starting (its own lines say how far)
    Wait("dp_remote_engines", "a data-parallel rank on another node",
         re.compile(r"Waiting for \d+ local, [1-9]\d* remote core engine proc\(s\) to start"),
         cause="distributed_init_timeout", reached="engine_init",
         source="vLLM v1/engine/utils.py wait_for_engine_startup, DEBUG every 10 s (0.9 →)"),
    Wait("engine_cores", "the engine core process",
         re.compile(r"Waiting for (?:\d+ local, \d+ remote |\d+ )?core engine proc\(s\) to "
                    r"start"),
         reached="engine_init",
         source="vLLM v1/engine/utils.py wait_for_engine_startup, DEBUG every 10 s (0.9 →)"),
    # a data-parallel engine core, once it is up, waits for the DP coordinator to say all
    # ranks are (EngineCoreProc's handshake, INFO, once): a rank that never comes up keeps
    # every other one here
    Wait("dp_coordinator_ready", "the other data-parallel ranks (the DP coordinator's READY)",
         re.compile(r"Waiting for READY message from DP Coordinator"),
         cause="distributed_init_timeout",
         source="vLLM EngineCoreProc's data-parallel handshake, INFO once"),
    # torch.distributed: the store-based barrier (distributed_c10d._store_based_barrier,
    # INFO, "Waiting in store based barrier to initialize process group for rank: 0, key:
    # … (world_size=2, num_workers_joined=1, timeout=0:30:00)")
    Wait("store_barrier", "the other ranks of the process group",
         re.compile(r"Waiting in store based barrier to initialize process group"),
         cause="distributed_init_timeout", reached="distributed_init",
         source="torch distributed_c10d._store_based_barrier, INFO"),
    # A TCPStore client connecting to the master rank's store (c10d socket.cpp and
    # TCPStore.cpp). Since torch 2.5 (pytorch#129261) TCPStore retries the whole connect
    # until its own timeout: each attempt that times out logs the socket's "[E… socket.cpp:N]
    # [c10d] The client socket has timed out after 600000ms while trying to connect to (H,
    # P)." (C10D_ERROR, then a throw that TCPStore catches) and then its WARNING "TCP client
    # failed to connect/validate to host H:P - retrying (try=0, …): <that error>", and waits
    # a full timeout again (trl#4538, vllm#19670's "try=1"). While nothing listens yet: "The
    # server socket on … has timed out, will retry." (vllm-metal#58), "No socket on (H, P) is
    # listening yet, will retry", torch ≤ 2.1's "[W socket.cpp:N] [c10d] The client socket has
    # failed to connect to H:P (errno: 110 - Connection timed out)." (vllm#3771, #2427) and
    # its "… to any network address of (H, P)." (logged, then thrown). Only TCPStore's "-
    # timed out (try=N, …)" or the exception the process dies of ends it.
    Wait("store_connect", "the process group's store on the master rank (TCPStore)",
         re.compile(r"(?:^\[[A-Z]\d{0,4}[^\]]{0,60}\] |\[c10d\] )The client socket has timed out "
                    r"after "
                    r"|TCP client failed to connect/validate to host \S{1,200} - retrying"
                    r"|The server socket on \S{1,200} (?:has timed out|is not yet listening)"
                    r"[^,]{0,80}, will retry"
                    r"|No socket on \([^)]{1,200}\) is listening yet, will retry"
                    r"|\[c10d\] The client socket has failed to connect to "),
         cause="distributed_init_timeout", reached="distributed_init", retries=True,
         source="torch c10d socket.cpp and TCPStore.cpp (TCPStore's retries: torch 2.5 →)"),
    # V0 front end (MQLLMEngineClient's output loop, 0.6 → 0.10) at DEBUG every
    # VLLM_RPC_TIMEOUT while no output comes: while the engine starts or sits idle alike
    Wait("v0_engine_output", "output from the engine process",
         re.compile(r"Waiting for output from MQLLMEngine"),
         source="vLLM V0 MQLLMEngineClient's output loop, DEBUG every VLLM_RPC_TIMEOUT "
                "(0.6 → 0.10)"),
)
WAIT: Mapping[str, Wait] = {w.id: w for w in WAITS}
_RETRIES: tuple[Wait, ...] = tuple(w for w in WAITS if w.retries)

CAUSE: Mapping[str, Cause] = {c.id: c for c in CAUSES}
_COMPILED: dict[str, re.Pattern[str]] = {
    c.id: re.compile("|".join(f"(?:{p})" for p in c.patterns)) for c in CAUSES}
_HINTS: tuple[tuple[Cause, re.Pattern[str]], ...] = tuple(
    (c, re.compile("|".join(f"(?:{p})" for p in c.hints))) for c in CAUSES if c.hints)

# Remedies of the verdicts that are not a cause.
VERDICT_REMEDIES: Mapping[str, str] = {
    "timed_out": "the start passed its hard cap (or a stated multiple of its learned budget): "
    "look at the last phase's evidence; raise the cap only if history shows starts this long "
    "are normal",
    "stalled": _GENERIC_STALL,
}

# An exception line `pkg.mod.SomeError: message`, the last line of a traceback: the root
# of an unknown cause. Types raised while tearing down are not roots.
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*(?P<type>[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure))"
    # Ray re-raises a worker's exception as RayTaskError(ValueError): …
    r"(?:\([A-Z]\w*\))?(?::\s*(?P<text>.*))?$")
_TEARDOWN_TYPES = frozenset({"CancelledError", "KeyboardInterrupt", "SystemExit",
                             "BrokenPipeError", "ConnectionResetError", "GeneratorExit",
                             "ClosedResourceError"})
# Bounded repeats: unbounded ones make this quadratic on a long dotted frame line.
_FLATTENED = re.compile(r"\b(?:[a-z_]\w{0,40}\.){1,6}[A-Z]\w{0,60}(?:Error|Exception): ")
_FRAME_ANY = re.compile(r'^File "[^"]*", line \d+, in (?P<func>[\w<>]+)')
# Only vLLM's own frames: a wrapper's `load_model` (a demo, a framework) proves nothing.
_FRAME = re.compile(r'^File "[^"]*vllm[/\\][^"]*", line \d+, in (?P<func>[\w<>]+)')
# A V0 worker wrapper names the worker method that failed; the method is the frame
# (initialize_cache: the KV cache; load_model: the weights).
_WORKER_METHOD = re.compile(
    r"(?:Error executing method|while processing method) '?(?P<func>\w{1,80})")
# Process names in vLLM's prefix: an engine core or a worker exists, so the start is past
# bootstrap (`EngineCore_DP0`, `VllmWorker rank=0`, `Worker_TP1`, `RayWorkerWrapper`).
_PROC_PHASE = re.compile(r"^(?:EngineCore|VllmWorker|Worker|RayWorkerWrapper)")
# multiprocessing's header of a child's traceback: "Process EngineCore_0:"
_PROC_HEADER = re.compile(r"^Process (?:EngineCore|VllmWorker|Worker)\S*:$")
# CPython's BaseProcess._bootstrap writes "Process NAME:" and the traceback only when the
# child's target raised (SystemExit, vLLM's own signal exit, prints nothing): a vLLM
# process died. V0's engine process is a spawn child with the default "SpawnProcess-N".
CHILD_DIED = re.compile(r"^Process (?:EngineCore|VllmWorker|Worker|SpawnProcess)[\w-]{0,40}:$")
# Serving: requests answered, throughput stats, uvicorn bound. Access lines of any status:
# a 404 is an answer too.
_SERVING = re.compile(
    r'"(?:GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) /\S* HTTP/[\d.]+" \d{3}'
    r"|Avg prompt throughput: [0-9.]+ tokens/s"
    r"|Uvicorn running on (?:http|unix)"
    r"|Engine \d+: Avg prompt throughput"
    # an offline harness: `vllm bench throughput`'s result (LLM's own progress bar is
    # _OFFLINE_BAR)
    r"|Throughput: [0-9.]+ requests/s, [0-9.]+ (?:total )?tokens/s")
# An offline harness's progress (entrypoints/llm.py, 0.1 → 0.33): "Adding requests" while
# a batch is queued (0.8+), then "Processed prompts" counting finished requests. One
# finished request is serving evidence; a bar at N/N says the batch is done (the engine
# idle until the next one).
_OFFLINE_BAR = re.compile(
    r"(?P<bar>Processed prompts|Adding requests): {0,3}\d{1,3}%\|[^|]{0,80}\| {0,3}"
    r"(?P<done>\d{1,10})/(?P<total>\d{1,10})")
# An orderly stop. Its trigger: someone asked (systemd's stop job — "Stopping X"; systemd
# prints "Stopped X" on an automatic restart after a crash too —, a signal, Ctrl-C).
_STOP_TRIGGER = re.compile(
    r"^Stopping \S+(?:\.service)?\b|Received signal SIG(?:TERM|INT)|received SIG(?:TERM|INT)"
    r"|SIG(?:TERM|INT) received|received signal=SIG(?:TERM|INT)|^KeyboardInterrupt$|^\^C")
# vLLM's front end SIGTERMs its own engine core and workers while it tears down: their
# "received SIGTERM" is teardown; SIGINT (a terminal's Ctrl-C) reaches every process.
_CHILD_PROC = re.compile(r"^(?:EngineCore|Worker|VllmWorker|RayWorker)", re.IGNORECASE)
# Teardown: uvicorn's and vLLM's shutdown sequence. vLLM runs it after a crash too (a
# killed engine core: "[shutdown] Process manager: send sigterm …" before "Failed core
# proc(s)"), so on its own it is a stop only if no failure follows.
_STOP_TEARDOWN = re.compile(
    r"^INFO:\s+Shutting down$|^Shutting down$|Waiting for application shutdown"
    r"|Shutting down FastAPI HTTP server|\[shutdown\]"
    # the engine core honouring a shutdown request (core.py, 0.2x), and torch's
    # ProcessGroupNCCL destructor when the process exits without destroy_process_group
    r"|^Shutdown initiated \(timeout=\d+\)"
    r"|destroy_process_group\(\) was not called before program exit")
_NOISE = re.compile(r"No available shared memory broadcast block found in (?P<seconds>\d+) second")
# A KV budget of nothing: vLLM raises "No available memory for the cache blocks" right
# after logging it (V1 check_enough_kv_cache_memory when available_memory <= 0, after
# gpu_worker's "Available KV cache memory: -2.77 GiB"; V0 raise_if_cache_size_invalid
# when num_gpu_blocks <= 0, after the executor's "# GPU blocks: 0"). The number, not the
# wording, is the proof: the INFO level does not make the line advisory.
_KV_NONE = re.compile(r"Available KV cache memory: (?:-[0-9.]+|0(?:\.0+)?) ?GiB"
                      r"|# (?:GPU|CUDA|cuda) blocks: 0, # CPU blocks: \d+")
# Real escape codes, and the caret form (`^[[0;36m`) a terminal copy leaves.
# vLLM colours its process prefix ("\x1b[1;36m(EngineCore pid=1)\x1b[0;0m"): a page that
# drops the ESC leaves "[1;36m(…)[0;0m" around it (gpustack#3786), removed only there.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]|\^\[\[[0-9;]*m"
                   r"|^\[[0-9;]{1,12}m(?=\()|(?<=\))\[[0-9;]{1,12}m")
# Wrappers users paste around vLLM's lines: HTML colour tags, CI gutters ("  | "), a
# bracketed ISO stamp (a launcher's "[2025-09-25 20:03:20] [/bin/sh]: " relaying the
# child's output adds its stream's name), docker compose's "name  | ", FastChat's worker
# relaying its stderr/stdout through its logger ("2024-02-20 21:46:23 | ERROR | stderr | ":
# the relay's level, not the line's; QAnything#128, #302, vllm#9329).
_WRAPPERS = re.compile(
    r"^(?:\s*<[^>]{1,80}>)+|^\s*\|\s"
    r"|^\s*\[\d{4}-\d\d-\d\d[T ][\d:.]{1,20}Z?\](?: \[[^\]\s]{1,40}\]:)?\s?"
    r"|^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| [A-Z]{4,8} \| std(?:err|out) \| ?"
    r"|^[\w.-]{1,60}\s+\|\s|^\[rank\d+\]:\s?|^\s*[│┃]\s?")
_TAGS = re.compile(r"</?(?:font|b|i|span)[^>]{0,80}>")

# `(APIServer pid=1) INFO 11-29 10:01:02 [file.py:12] msg`; the process prefix is
# optional (absent on tracebacks from 0.31 on), so is the level/stamp/source block; V0
# wrote the source without the opening bracket (`INFO 07-07 20:12:44 metrics.py:295] msg`)
# and Ray adds fields to the process prefix (`(RayWorkerWrapper pid=12, ip=10.0.0.1)`).
_PREFIX = re.compile(
    r"^\s*(?:\((?P<proc>[A-Za-z][\w\-]*)(?: rank=\d+)? pid=(?P<pid>\d+)(?:, ip=[^)]*)?\)\s*)?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+"
    r"(?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d+)?\s+"
    r"(?:\[?(?P<source>[\w.\-/]+:\d+)\]\s*)?)?"
    r"(?P<msg>.*)$",
    re.DOTALL,
)

# Bounded and bracket-free before the source: linear on hostile lines.
_SOURCE_LAST = re.compile(
    r"^(?P<pre>[^\[\]]{0,120}?)\[(?P<source>[\w.\-/]{1,120}\.py:\d{1,6})\]\s?(?P<msg>.*)$",
    re.DOTALL)
_LEVEL_WORD = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")


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


def _unwrap(text: str) -> str:
    for _ in range(3):
        new = _WRAPPERS.sub("", text, count=1)
        if new == text:
            break
        text = new
    text = _TAGS.sub("", text)
    # a log viewer's right border: by hand, as `\s*[│┃]\s*$` is quadratic on a long run
    # of spaces (20 000 took 2.9 s)
    stripped = text.rstrip()
    return stripped[:-1].rstrip() if stripped.endswith(("│", "┃")) else text


def parse_line(text: str) -> Line:
    # tqdm redraws with \r: the last redraw is the state that counts.
    clean = strip_ansi(text).rstrip("\r\n")
    if clean.endswith("^M"):  # a CR in caret notation, as a terminal copy leaves it
        clean = clean[:-2]
    if "\r" in clean:
        parts = [p for p in clean.split("\r") if p.strip()]
        clean = parts[-1] if parts else ""
    clean = _unwrap(clean)
    m = _PREFIX.match(clean)
    if m is None:  # pragma: no cover - the pattern matches any string
        return Line(None, None, None, None, None, clean.strip())
    if m.group("level") is None and m.group("proc") is None:
        # A custom logging format (VLLM_LOGGING_CONFIG_PATH, a wrapper's logger) moves the
        # fields around but keeps vLLM's `[file.py:N]` source last: the level is a word
        # before it ("2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] msg").
        sm = _SOURCE_LAST.match(clean)
        level = _LEVEL_WORD.search(sm.group("pre")) if sm else None
        if sm is not None and level is not None:
            return Line(None, None, level.group(0), None, sm.group("source"),
                        sm.group("msg").strip())
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
    """What one line means. `values` holds numbers pulled out of it (GiB, seconds…);
    `reached` the phase the line proves the start got to (a marker's phase, a traceback
    frame, an engine or worker process name); `role` a fatal line's place in the chain."""

    kind: Kind
    line: Line
    phase: str | None = None
    edge: Edge | None = None
    marker: str | None = None
    cause: str | None = None
    remedy: str | None = None
    values: dict[str, float] = field(default_factory=dict)
    reached: str | None = None
    role: Role | None = None
    exception: str | None = None  # the exception type of an exception line
    stop: Literal["trigger", "teardown"] | None = None  # a stop line: asked for, or teardown
    wait: str | None = None  # a wait line's Wait id (kind "noise": alive, not progress)


def remedy_for(cause: str, values: Mapping[str, str] | None = None) -> str:
    """The remedy text for a cause (or a verdict), filled with values from the line."""
    v: dict[str, str] = dict(values or {})
    if "len0" in v and "len" not in v:
        v["len"] = v["len0"]
    v.setdefault("pkg", "cubin")
    v.setdefault("want", "<flashinfer-python version>")
    v.setdefault("have", "?")
    v["len_note"] = f" ({v['len']})" if v.get("len") else ""
    for alt in ("world1", "world2", "world3"):
        if alt in v and "world" not in v:
            v["world"] = v[alt]
    v["world_note"] = f" ({v['world']})" if v.get("world") else ""
    for alt in ("arch3", "arch4"):
        if alt in v and "arch" not in v:
            v["arch"] = v[alt]
    v["arch_note"] = f" (sm_{v['arch']})" if v.get("arch") else ""
    v["cap_note"] = f" (compute capability {v['cap']})" if v.get("cap") else ""
    v["joined_note"] = (f" ({v['joined']} of {v['world']} joined)"
                        if v.get("joined") and v.get("world") else "")
    for alt in ("host2", "host3", "port2", "port3"):
        if alt in v and alt[:-1] not in v:
            v[alt[:-1]] = v[alt]
    v["store_note"] = f" at {v['host']}:{v['port']}" if v.get("host") and v.get("port") else ""
    rec = CAUSE.get(cause)
    template = rec.remedy if rec is not None else VERDICT_REMEDIES.get(
        cause, CAUSE["unknown"].remedy)
    return template.format_map(defaultdict(str, v))


def role_of(cause: str) -> Role:
    rec = CAUSE.get(cause)
    return rec.role if rec is not None else "chain"


def wraps_another(cause: str) -> bool:
    """A root whose exception wraps another one (torch.compile's): see `Cause.wraps`."""
    rec = CAUSE.get(cause)
    return rec is not None and rec.wraps


def is_specific(cause: str) -> bool:
    """A root cause (not a symptom, not a chain link)."""
    return role_of(cause) == "root"


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


def is_traceback_link(text: str) -> bool:
    """A chain link proven by a traceback's shape (a dying child's header, a frame), which
    a KeyboardInterrupt closing that traceback turns into the stop's."""
    msg = parse_line(text).message
    return CHILD_DIED.match(msg) is not None or _FRAME_ANY.match(msg) is not None


# torch's CUDA graph capture (torch.cuda.graph's context, CUDAGraph.capture_begin/end):
# only vLLM's graph capture runs it at startup, so its frames prove the capture phase
# even where a paste keeps no vLLM frame below them (vllm#19186, #18446).
_TORCH_CAPTURE = re.compile(
    r'^File "[^"]{0,400}torch[/\\]cuda[/\\]graphs\.py", line \d+, in '
    r'(?:capture_begin|capture_end|__enter__|__exit__)\b')


# torch.distributed's rendezvous (init_process_group through the TCP store): at startup
# only vLLM's distributed init calls it, so its frames prove that phase where a paste keeps
# no vLLM frame (vllm-ascend#167, vllm#16334).
_TORCH_RENDEZVOUS = re.compile(
    r'^File "[^"]{0,400}torch[/\\]distributed[/\\](?:distributed_c10d|rendezvous)\.py", '
    r"line \d+, in (?:init_process_group|_tcp_rendezvous_handler|_create_c10d_store)\b")


def _reached(line: Line, msg: str) -> str | None:
    if _TORCH_CAPTURE.match(msg):
        return "capturing_graphs"
    if _TORCH_RENDEZVOUS.match(msg):
        return "distributed_init"
    frame = _FRAME.match(msg) or _WORKER_METHOD.search(msg)
    if frame:
        func = frame.group("func")
        for p in reversed(PHASE_RECORDS):
            if func in p.frames:
                return p.name
    if (line.proc and _PROC_PHASE.match(line.proc)) or _PROC_HEADER.match(msg):
        return "engine_init"
    return None


def _wait_match(waits: tuple[Wait, ...], line: Line, reached: str | None) -> Match | None:
    """The first of `waits` this line reports (kind "noise": alive, never progress), at the
    later of its own phase and what the line proves."""
    for wait in waits:
        wm = wait.pattern.search(line.message)
        if wm:
            at = wait.reached or reached
            if reached is not None and at is not None and phase_index(reached) > phase_index(at):
                at = reached
            return Match("noise", line, values=_floats(wm.groupdict()), reached=at, wait=wait.id)
    return None


def classify(text: str) -> Match:
    """Classify one raw log line (ANSI codes, vLLM prefix and paste wrappers allowed)."""
    line = parse_line(text)
    msg = line.message
    if not msg:
        return Match("other", line)
    reached = _reached(line, msg)
    noise = _NOISE.search(msg)
    if noise:
        return Match("noise", line, values=_floats(noise.groupdict()), reached=reached)
    frame = _FRAME_ANY.match(msg)
    if frame:
        for cause in CAUSES:
            if frame.group("func") in cause.frames:
                if cause.reached is not None and (
                        reached is None or phase_index(cause.reached) > phase_index(reached)):
                    reached = cause.reached
                return Match("fatal", line, cause=cause.id, remedy=remedy_for(cause.id),
                             reached=reached, role=cause.role)
    exc = _EXCEPTION.match(msg)
    exc_type = exc.group("type") if exc else None
    # A warning that only says flashinfer ignored a package is not fatal (≥0.7.2); a
    # frame line quotes source code, not an error, unless a paste flattened the traceback
    # onto one line: then its qualified exception (`requests.exceptions.X: …`) is there.
    text = msg
    if msg.startswith("File \""):
        flat = _FLATTENED.search(msg)
        text = msg[flat.start():] if flat else ""
    if _KV_NONE.search(msg):
        return Match("fatal", line, cause="kv_cache_too_small",
                     remedy=remedy_for("kv_cache_too_small"), reached="kv_cache",
                     role="root")
    # A retry quotes the error it met: the wait, not that error.
    if "retry" in msg or "client socket" in msg:
        retry = _wait_match(_RETRIES, line, reached)
        if retry is not None:
            return retry
    # vLLM raises what is fatal; what it logs at DEBUG/INFO/WARNING it survives (since
    # 0.6.5 the Ray placement-group shortfall is a warning, and vLLM waits for the GPUs).
    advisory = line.level in ("DEBUG", "INFO", "WARNING", "WARN")
    if "Ignoring incompatible flashinfer" not in msg and text and not advisory:
        for cause in CAUSES:
            fm = cause.regex.search(text)
            if fm:
                groups = {k: v for k, v in fm.groupdict().items() if v is not None}
                if cause.reached is not None and (
                        reached is None or phase_index(cause.reached) > phase_index(reached)):
                    reached = cause.reached
                return Match(
                    "fatal", line, cause=cause.id, remedy=remedy_for(cause.id, groups),
                    values=_floats(fm.groupdict()), reached=reached, role=cause.role,
                    exception=exc_type,
                )
    if "ait" in msg or "exceeds" in msg or "fulfill" in msg or "scheduled" in msg:
        waited = _wait_match(WAITS, line, reached)
        if waited is not None:
            return waited
    for cause, hint in _HINTS:
        if hint.search(msg):
            if cause.reached is not None and (
                    reached is None or phase_index(cause.reached) > phase_index(reached)):
                reached = cause.reached
            return Match("other", line, cause=cause.id, remedy=remedy_for(cause.id),
                         reached=reached, role="hint")
    if exc_type is not None and exc_type not in _TEARDOWN_TYPES and (
            line.level in (None, "ERROR", "CRITICAL")):
        return Match("fatal", line, cause="unknown", remedy=remedy_for("unknown"),
                     reached=reached, role="root", exception=exc_type)
    for phase in PHASE_RECORDS:
        for marker in phase.markers:
            mm = marker.pattern.search(msg)
            if mm:
                return Match(
                    "marker", line, phase=phase.name, edge=marker.edge, marker=marker.name,
                    values=_floats(mm.groupdict()), reached=phase.name,
                )
    bar = _OFFLINE_BAR.search(msg) if "%|" in msg else None
    if bar:  # an offline batch: how many of how many are done ("Adding": none yet)
        done = int(bar.group("done")) if bar.group("bar") == "Processed prompts" else 0
        values = {"done": float(done), "total": float(bar.group("total"))}
        if done:
            return Match("serving", line, reached="ready", marker="offline_batch",
                         values=values)
        return Match("other", line, reached=reached, marker="offline_batch", values=values)
    if _SERVING.search(msg):
        return Match("serving", line, reached="ready")
    if _STOP_TRIGGER.search(msg) or exc_type in ("KeyboardInterrupt",):
        child = (line.proc is not None and _CHILD_PROC.match(line.proc) is not None
                 and "SIGTERM" in msg)
        return Match("stop", line, reached=reached, stop="teardown" if child else "trigger")
    if _STOP_TEARDOWN.search(msg):
        return Match("stop", line, reached=reached, stop="teardown")
    return Match("other", line, reached=reached)


# Where one start of vLLM begins, in the order a start prints them (a restart's lines
# come in this order too): systemd scheduling the restart, systemd starting the unit,
# vLLM's version line (≤0.13 "vLLM API server version X", later the logo's "version X"
# or "vLLM server version X, serving model M": log_version_and_model, once per start) and
# its arguments (≤0.8 "args: Namespace(…)", later "non-default args: {…}" from
# log_non_default_args, which the offline LLM class calls too).
START_KINDS: tuple[str, ...] = ("scheduled", "starting", "started", "version", "args")
_SYSTEMD_SCHEDULED = re.compile(
    r"^(?P<unit>[\w@.:\\-]{1,200}?)(?:\.service)?: Scheduled restart job, "
    r"restart counter is at \d+")
# systemd's own start lines, which name the unit since v249 ("Started vllm.service -
# vLLM server."; before, only its description, and vLLM's version line marks the start):
# never vLLM's "Starting to load model" (a vLLM line has a level and a source), uvicorn's
# "Started server process [N]" or a wrapper's "Starting vLLM...".
_SYSTEMD_START = re.compile(
    r"^(?P<what>Starting|Started) (?P<unit>[\w@.:\\-]{1,200}?)(?:\.service\b|(?= |\.{0,3}$))")
_VERSION_LINE = re.compile(r"vLLM (?:API )?server version \S|^[^a-zA-Z]{0,80}version \d+\.\d+")
_ARGS_LINE = re.compile(r"^(?:non-default args: \{|args: Namespace\()")


@dataclass(frozen=True)
class StartLine:
    """A line that begins a start: its kind (START_KINDS) and, for systemd's lines, the
    unit or description it names."""

    kind: str
    unit: str | None = None


def start_line(text: str) -> StartLine | None:
    """The start banner this raw line is, if any (cheap for every other line)."""
    if "version" not in text and "args" not in text and "Start" not in text \
            and "Scheduled restart" not in text:
        return None
    line = parse_line(text)
    msg = line.message
    if line.level is None and line.source is None and line.proc is None:
        m = _SYSTEMD_SCHEDULED.match(msg)
        if m:
            return StartLine("scheduled", m.group("unit"))
        m = _SYSTEMD_START.match(msg)
        if m and ".service" in msg:
            return StartLine("starting" if m.group("what") == "Starting" else "started",
                             m.group("unit"))
    if _ARGS_LINE.match(msg):
        return StartLine("args")
    if _VERSION_LINE.search(msg):
        return StartLine("version")
    return None


def phase_index(phase: str) -> int:
    return PHASES.index(phase)
