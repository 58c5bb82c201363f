"""Why a start fails: one ``Cause`` record each (every wording seen, the vLLM versions
they were seen in, the remedy and what it needs from the line, and its role: a root
cause, a symptom, a link of the failure chain, or a hint).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from vigil.verify.catalog.phases import _GENERIC_STALL, Role


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
         # (the status code and the size are the proof: a paste may cut "That was not
         # possible", marin#2387's glog E line of TpuClient::AllocateBuffer)
         r"|Attempting to (?:allocate|reserve) \S{1,20}(?: at the bottom of memory)?\."
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
         r"\bcsrc/[\w/]{0,80}?quantization/[\w/.\-]{1,200}\.(?:cuh?|hpp|h|cpp):\d{1,6}\b",
         # csrc/quantization/cutlass_w8a8/scaled_mm_c3x_sm100.cu and _sm120.cu (0.9+):
         # the Blackwell CUTLASS entries' TORCH_CHECKs, a block-scaled (DeepSeek-style
         # 128x128) FP8 checkpoint or a non-e4m3 input on a build whose Blackwell GEMM is
         # per-tensor/per-channel only (vllm#16515 on 2x RTX 5090, vllm#16901)
         r"Currently, (?:block scaled fp8 gemm is not|only fp8 gemm is) implemented for "
         r"Blackwell"),
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
         # (Triton's make_cubin puts ptxas' stderr in its PTXASError, one line each, so
         # a paste may cut the option's name: gpustack#4372 ends at "is not defined for";
         # the value is an sm_ arch, which only --gpu-name takes)
         r"Value 'sm_(?P<arch3>\d+)\w?' is not defined(?: for option 'gpu-name')?"
         r"|Command '\[[^\]]{0,400}ptxas'[^\]]{0,400}'--gpu-name=sm_(?P<arch4>1\d\d)\w?'"
         r"[^\]]{0,400}\]' returned non-zero exit status"
         # ptxas knows the arch but the PTX Triton wrote declares a PTX ISA older than the
         # arch needs (sm_120/120a need PTX 8.7, sm_121 8.8): Triton picks the ISA from the
         # ptxas it bundles or is pointed at, so the toolchain is too old for the GPU
         # ("ptxas /tmp/x.ptx, line 6; error   : PTX .version 8.4 does not support .target
         # sm_120a": nixpkgs#406675 with CUDA 12.8's ptxas under torch 2.7's Triton)
         r"|PTX \.version \d+\.\d+ does not support \.target sm_(?P<arch5>1\d\d)\w?",
         # xformers' memory-efficient attention: every kernel it was built with refuses the
         # GPU (fmha's dispatch raises NotImplementedError "No operator found for
         # `memory_efficient_attention_forward`" listing each op's reason): "requires
         # device with capability <= (9, 0) but your GPU has capability (12, 0) (too new)"
         # on RTX 50xx/PRO 6000 with a wheel without sm_120 kernels, "(too old)" below
         # the op's minimum (V0's XFORMERS backend on Turing)
         r"requires device with capability [<>=]{1,2} ?\(\d+, ?\d+\) but your GPU has "
         r"capability \(\d+, ?\d+\) \(too (?:new|old)\)"),
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
         r"arguments are required|ambiguous option|invalid choice)",
         # an attention backend name this build does not know (VLLM_ATTENTION_BACKEND or
         # --attention-backend), not the platform refusing one it knows ("Invalid attention
         # backend for cuda"): attention/selector.py 0.10.1+ (vllm#22217) "Invalid attention
         # backend: 'X'. Valid backends are: [...]", v1/attention/backends/registry.py's
         # enum lookup 0.11+ "Unknown attention backend: 'ASCEND'. Valid options are: …"
         # (vllm-ascend#4197; a platform plugin's name the core enum lacks)
         r"(?:Invalid|Unknown) attention backend: '[^']{0,100}'\. Valid (?:backends|options) "
         r"are:"),
        ("0.2", "0.6", "0.10.1", "0.11", "0.12", "0.15"),
        "vLLM rejected its command line: remove or fix the option the line names (vllm serve "
        "--help lists this release's options; options move between releases, and a plugin's "
        "options exist only when the plugin is installed); an attention backend must be one "
        "the line lists as valid for this release (VLLM_ATTENTION_BACKEND or "
        "--attention-backend; names change between releases, e.g. the _VLLM_V1 suffixes)",
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

CAUSE: Mapping[str, Cause] = {c.id: c for c in CAUSES}

_COMPILED: dict[str, re.Pattern[str]] = {
    c.id: re.compile("|".join(f"(?:{p})" for p in c.patterns)) for c in CAUSES}

# Remedies of the verdicts that are not a cause.
VERDICT_REMEDIES: Mapping[str, str] = {
    "timed_out": "the start passed its hard cap (or a stated multiple of its learned budget): "
    "look at the last phase's evidence; raise the cap only if history shows starts this long "
    "are normal",
    "stalled": _GENERIC_STALL,
}
