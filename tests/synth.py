"""Synthesised traces of real incidents (issue 4), built poll by poll.

These are SYNTHESISED, not recorded: the numbers (GiB per GPU, CPU ratio, durations,
silent stretches) come from the incidents described in issue 4; the log lines use
vLLM's own format strings (shared/VLLM_STARTUP.md). `write_fixtures()` saves them as
JSONL under tests/fixtures/traces/ with a `# synthesised` README beside them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.paths import TRACES
from vigil.verify.snapshot import (
    Cache,
    CacheDir,
    Gpu,
    Gpus,
    Http,
    Journal,
    LogLine,
    Proc,
    Processes,
    Smoke,
    Snapshot,
    Unit,
)

T0 = 1_764_410_400.0  # 2025-11-29 10:00:00 UTC
MIB_PER_GIB = 1024.0


@dataclass
class Sim:
    """A vLLM start seen through the probe, one snapshot per `poll_s`."""

    n_gpus: int = 8
    workers: int = 8
    poll_s: float = 10.0
    has_gpus: bool = True
    t: float = T0
    cpu: dict[int, float] = field(default_factory=dict)
    rss: dict[int, int] = field(default_factory=dict)
    states: dict[int, str] = field(default_factory=dict)
    gpu_mib: list[float] = field(default_factory=list)
    cache_files: int = 0
    cache_bytes: int = 0
    cache_newest: float | None = None
    pending: list[LogLine] = field(default_factory=list)
    health: int | None = None
    unit: Unit = field(default_factory=lambda: Unit(
        name="vllm.service", active_state="activating", sub_state="start", main_pid=1000,
        n_restarts=0))
    snaps: list[Snapshot] = field(default_factory=list)
    noise_every: float | None = None
    _last_noise: float = T0

    def __post_init__(self) -> None:
        self.cpu = {1000: 0.0, 1001: 0.0} | {2000 + i: 0.0 for i in range(self.workers)}
        self.rss = dict.fromkeys(self.cpu, 500 * 1024 * 1024)
        self.states = dict.fromkeys(self.cpu, "S")
        self.gpu_mib = [0.0] * self.n_gpus

    # -- log lines in vLLM's shape --------------------------------------------------
    def log(self, proc: str, msg: str, level: str = "INFO", raw: bool = False) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S", time.gmtime(self.t))
        pid = {"APIServer": 1000, "EngineCore_DP0": 1001}.get(proc, 2000)
        text = msg if raw else f"({proc} pid={pid}) {level} {stamp} [synth.py:1] {msg}"
        self.pending.append(LogLine(us=int(self.t * 1e6), text=text))

    # -- time passes ----------------------------------------------------------------
    def run(
        self,
        seconds: float,
        *,
        cpu_per_worker: float = 0.0,
        cpu_engine: float = 0.05,
        gpu_mib_per_s: float = 0.0,
        gpu_target: float | None = None,
        cache_files_per_poll: int = 0,
        rss_per_s: int = 0,
        health: int | None = None,
        smoke: Smoke | None = None,
    ) -> None:
        end = self.t + seconds
        while self.t < end - 1e-9:
            self.t += self.poll_s
            for pid in self.cpu:
                rate = cpu_per_worker if pid >= 2000 else cpu_engine
                if self.states[pid] != "T":
                    self.cpu[pid] += rate * self.poll_s
                    self.states[pid] = "R" if rate >= 0.5 else "S"
                self.rss[pid] += rss_per_s * int(self.poll_s) if pid >= 2000 else 0
            for i in range(self.n_gpus):
                nxt = self.gpu_mib[i] + gpu_mib_per_s * self.poll_s
                self.gpu_mib[i] = min(nxt, gpu_target) if gpu_target is not None else nxt
            if cache_files_per_poll:
                self.cache_files += cache_files_per_poll
                self.cache_bytes += cache_files_per_poll * 180_000
                self.cache_newest = self.t - 1
            if self.noise_every and self.t - self._last_noise >= self.noise_every:
                self._last_noise = self.t
                self.log("EngineCore_DP0", "No available shared memory broadcast block found "
                         "in 60 seconds. This typically happens when some processes are "
                         "hanging or doing some time-consuming work (e.g. compilation, "
                         "weight/kv cache quantization).")
            self.snap(health=health, smoke=smoke)

    def snap(self, *, health: int | None = None, smoke: Smoke | None = None) -> Snapshot:
        procs = Processes(source="cgroup", items=tuple(
            Proc(pid=pid, ppid=1000 if pid != 1000 else 1, comm="python3",
                 state=self.states[pid], cpu_s=round(cpu, 2), rss_bytes=self.rss[pid])
            for pid, cpu in self.cpu.items()
        ))
        gpus = None
        if self.has_gpus:
            gpus = Gpus(source="nvml", devices=tuple(
                Gpu(index=i, name="NVIDIA H200", memory_used_mib=round(m, 1),
                    memory_total_mib=143771.0)
                for i, m in enumerate(self.gpu_mib)
            ))
        cache = Cache(dirs=(
            CacheDir(path="/var/cache/vllm/torch_compile_cache", exists=True,
                     bytes=self.cache_bytes, files=self.cache_files,
                     newest_mtime=self.cache_newest),
        ))
        http = Http(health_status=health, health_error=None if health else "Connection refused")
        s = Snapshot(
            time=self.t, unit=self.unit, journal=Journal(lines=tuple(self.pending)),
            processes=procs, gpus=gpus, cache=cache, http=http, smoke=smoke,
        )
        self.pending = []
        self.snaps.append(s)
        return s


def _boot(sim: Sim, tp: int) -> None:
    sim.log("APIServer", "vLLM server version 0.33.0")
    sim.log("APIServer", f"non-default args: {{'tensor_parallel_size': {tp}}}")
    sim.run(10, cpu_engine=0.9)
    sim.log("APIServer", "Resolved architecture: DeepseekV3ForCausalLM")
    sim.log("APIServer", "Using max model len 131072")
    sim.unit = sim.unit.model_copy(update={"active_state": "active", "sub_state": "running"})
    sim.run(10, cpu_engine=0.9)
    sim.log("EngineCore_DP0", "Initializing a V1 LLM engine (v0.33.0) with config: model=...")
    sim.run(10, cpu_engine=0.9, cpu_per_worker=0.9)
    for r in range(tp):
        sim.log(f"Worker_TP{r}", f"world_size={tp} rank={r} local_rank={r} "
                "distributed_init_method=tcp://127.0.0.1:4321 backend=nccl")
    sim.log("Worker_TP0", "vLLM is using nccl==2.27.5")
    sim.run(10, cpu_per_worker=1.0, gpu_mib_per_s=716 / 10, gpu_target=716)


def _ready(sim: Sim, compile_s: float) -> None:
    sim.log("Worker_TP0", f"torch.compile took {compile_s:.2f} s in total")
    sim.log("Worker_TP0", "Available KV cache memory: 41.20 GiB")
    sim.log("EngineCore_DP0", "GPU KV cache size: 1,262,144 tokens, Maximum concurrency for "
            "131,072 tokens per request: 9.63x")
    sim.run(10, cpu_per_worker=1.0, gpu_mib_per_s=4000, gpu_target=None)
    sim.log("Worker_TP0", "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%",
            raw=False)
    sim.run(30, cpu_per_worker=1.0, gpu_mib_per_s=20)
    sim.log("Worker_TP0", "Graph capturing finished in 31 secs, took 1.12 GiB")
    sim.log("EngineCore_DP0", "init engine (profile, create kv cache, warmup model) took "
            "712.44 s (compilation: 640.00 s in total)")
    sim.log("APIServer", "Starting vLLM server on http://0.0.0.0:8000")
    sim.log("APIServer", "Started server process [1000]", raw=False)
    sim.log("APIServer", "Application startup complete.", raw=True)
    sim.run(10, cpu_engine=0.2, health=200)
    sim.run(10, cpu_engine=0.2, health=200,
            smoke=Smoke(ok=True, tokens=16, ttft_s=0.4, tokens_per_s=38.0))


def kimi_14_minutes() -> list[Snapshot]:
    """1T parameters, 8xH200: weights 73.7 GiB/GPU, 10+ silent minutes of compile at
    CPU ~9x wall with the 60-s shm-broadcast line, ready at ~14 min."""
    sim = Sim(n_gpus=8, workers=8)
    _boot(sim, 8)
    sim.log("Worker_TP0", "Starting to load model /models/kimi-k2.5-nvfp4...")
    per_gpu = 73.7 * MIB_PER_GIB
    for shard in range(1, 65, 8):
        sim.log("Worker_TP0", f"Loading safetensors checkpoint shards: {shard * 100 // 64}% "
                f"Completed | {shard}/64 [00:20<01:40]", raw=True)
        sim.run(20, cpu_per_worker=0.4, gpu_mib_per_s=(per_gpu - 716) / 160, gpu_target=per_gpu)
    sim.log("Worker_TP0", "Loading weights took 158.20 seconds")
    sim.log("Worker_TP0", "Model loading took 73.7 GiB memory and 160.5 seconds")
    sim.log("Worker_TP0", "[backbone] Starting torch.compile")
    sim.log("Worker_TP0", "Using cache directory: /var/cache/vllm/torch_compile_cache/ab12/"
            "rank_0_0/backbone for vLLM's torch.compile")
    sim.noise_every = 60
    # Silent compile: only the shm line every 60 s; CPU 8 workers x 1.13 ~ 9x wall; the
    # inductor cache grows in bursts (some polls write nothing).
    for i in range(64):  # 640 s
        sim.run(10, cpu_per_worker=1.13, cache_files_per_poll=(12 if i % 3 == 0 else 0))
    sim.noise_every = None
    _ready(sim, 640.0)
    return sim.snaps


def load_343_then_quiet() -> list[Snapshot]:
    """Model loading 343 s at 51 GiB/GPU, then minutes of no journal lines while CPU and
    the compile cache move (an older vLLM that prints nothing when compile starts)."""
    sim = Sim(n_gpus=8, workers=8)
    _boot(sim, 8)
    sim.log("Worker_TP0", "Starting to load model /models/big...")
    per_gpu = 51.0 * MIB_PER_GIB
    sim.run(340, cpu_per_worker=0.3, gpu_mib_per_s=(per_gpu - 716) / 330, gpu_target=per_gpu)
    sim.log("Worker_TP0", "Model loading took 51.0000 GiB and 343.1234 seconds")
    for i in range(42):  # 7 minutes, not a single journal line
        sim.run(10, cpu_per_worker=1.0, cache_files_per_poll=(5 if i % 2 == 0 else 0))
    _ready(sim, 420.0)
    return sim.snaps


def stall_716(last_marker: str = "distributed_init") -> list[Snapshot]:
    """GPU memory flat at 716 MiB, frozen log, empty compile cache, 4 workers at 100 %
    CPU — never going to finish. The EngineCore's shm line keeps coming (alive)."""
    sim = Sim(n_gpus=4, workers=4)
    _boot(sim, 4)
    if last_marker == "compiling":
        sim.log("Worker_TP0", "Starting to load model /models/m...")
        sim.run(30, cpu_per_worker=0.5, gpu_mib_per_s=0)  # flat: memory never moves
        sim.log("Worker_TP0", "[backbone] Starting torch.compile")
    sim.noise_every = 60
    sim.run(900, cpu_per_worker=1.0)
    return sim.snaps


def flashinfer_mismatch() -> list[Snapshot]:
    """flashinfer-cubin 0.6.3 next to flashinfer-python 0.6.4: dies in worker init."""
    sim = Sim(n_gpus=8, workers=8)
    _boot(sim, 8)
    sim.log("Worker_TP0", "WorkerProc failed to start.", level="ERROR")
    sim.log("Worker_TP0", "Traceback (most recent call last):", raw=True)
    sim.log("Worker_TP0", "RuntimeError: flashinfer-cubin version (0.6.3) does not match "
            "flashinfer version (0.6.4). Please install the same version of both packages.",
            raw=True)
    sim.log("EngineCore_DP0", "EngineCore failed to start.", level="ERROR")
    sim.log("APIServer", "RuntimeError: Engine core initialization failed. See root cause "
            "above. Failed core proc(s): {'EngineCore_DP0': 1}", raw=True)
    sim.run(10, cpu_per_worker=0.1)
    sim.unit = sim.unit.model_copy(update={"active_state": "failed", "sub_state": "failed",
                                           "exec_main_status": 1, "main_pid": 0})
    sim.run(10)
    return sim.snaps


INCIDENTS = {
    "kimi-14min-ready": kimi_14_minutes,
    "load-343s-quiet-compile-ready": load_343_then_quiet,
    "stall-716mib-distributed": lambda: stall_716("distributed_init"),
    "stall-716mib-compiling": lambda: stall_716("compiling"),
    "flashinfer-cubin-mismatch": flashinfer_mismatch,
}


def write_fixtures(dest: Path) -> list[Path]:
    from vigil.verify.replay import write_trace

    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name, make in INCIDENTS.items():
        path = dest / f"synth-{name}.jsonl"
        write_trace(path, make())
        out.append(path)
    return out


if __name__ == "__main__":
    for p in write_fixtures(TRACES):
        print(p)
