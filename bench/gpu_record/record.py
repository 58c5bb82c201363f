"""Record, in one short run on a GPU machine, the real readings issue 11 asks for.

    python3 bench/gpu_record/record.py OUT [--python PY] [--start-minutes N]

Writes OUT/gpu-record.tar.gz (and OUT/summary.txt) holding, named as the fixtures in
tests/fixtures/gpus/<name>/ are:

* agent_gpu_facts.json - the host agent's own raw reading (``agent.gpu_facts``: NVML with
  its per-GPU health reads, nvidia-smi CSV by field name, ``-L``, the kernel's NVRM
  lines), as ``facts`` sends it; nvidia_ml_py.txt - the installed nvidia-ml-py version;
* probe_gpus.json      - the probe's per-poll GPU reading, when the agent has it;
* busy/                - the same readings (agent facts, probe by NVML and by nvidia-smi,
  query_gpu.csv, compute_apps.csv, torch_cuda.json) while a real CUDA process of PY holds
  BUSY_GIB of GPU memory and multiplies matrices: a GPU in use, as a stale holder or a
  loading server shows it;
* version.txt, table.txt, query_gpu.csv, compute_apps.csv, list.txt, smi.xml - nvidia-smi;
* kernel.txt           - the kernel's NVRM lines (journalctl -k or dmesg);
* when PY (default: this python) imports a CUDA vLLM: vllm-start.log (a real start of
  the lab's tiny model: weights, torch.compile, CUDA graph capture, /health, one
  completion), compile_cache.txt (the compile cache's files) and torch_cuda.json
  (torch's arch list and the GPUs' capabilities).

Without an NVIDIA GPU it records nothing and exits 3 with one line saying why. Stdlib
only; run from the repository root (it runs the joined host agent, vigil/host/payload.py,
and lab/tiny_model.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout's vigil: the device machine has no vigil installed
from vigil.host import payload  # noqa: E402

NO_GPU = 3


def sh(cmd: list[str], timeout: float = 120) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return 1, f"{type(exc).__name__}: {exc}"
    return p.returncode, p.stdout + p.stderr


def gpu_or_exit() -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        print("record: no NVIDIA GPU here: nvidia-smi is not installed; nothing recorded",
              file=sys.stderr)
        raise SystemExit(NO_GPU)
    code, out = sh([smi, "-L"], timeout=60)
    if code != 0 or not any(line.startswith("GPU ") for line in out.splitlines()):
        first = next((ln.strip() for ln in out.splitlines() if ln.strip()), f"exit {code}")
        print(f"record: no NVIDIA GPU here: nvidia-smi -L: {first}; nothing recorded",
              file=sys.stderr)
        raise SystemExit(NO_GPU)
    return smi


def record_smi(smi: str, agent: ModuleType, work: Path) -> None:
    fields = agent.SMI_FACT_FIELDS + agent.SMI_HEALTH_FIELDS
    for name, args in (
        ("version.txt", ["--version"]),
        ("table.txt", []),
        ("query_gpu.csv", ["--query-gpu=" + fields, "--format=csv"]),
        ("compute_apps.csv", [agent.SMI_FACT_APPS, "--format=csv"]),
        ("list.txt", ["-L"]),
        ("smi.xml", ["-q", "-x"]),
    ):
        code, out = sh([smi, *args])
        (work / name).write_text(out if code == 0 else f"# exit {code}\n{out}")


def health_line(facts: dict[str, object]) -> str:
    """The agent's NVML health reads, one GPU per clause, for the summary."""
    nvml = facts.get("nvml")
    if not isinstance(nvml, dict):
        return f"nvml health: no NVML reading ({facts.get('nvml_error')})"
    return "nvml health: " + "; ".join(
        f"GPU {g.get('index')}: " + ", ".join(
            f"{k}={json.dumps(v)}" for k, v in (g.get("health") or {}).items())
        for g in nvml.get("gpus", []))


def record_agent(agent: ModuleType, python: str, work: Path) -> str:
    facts = agent.gpu_facts(python)
    (work / "agent_gpu_facts.json").write_text(json.dumps(facts, indent=1))
    (work / "kernel.txt").write_text(str(facts.get("kernel") or facts.get("kernel_error")))
    probe = getattr(agent, "probe_gpus", None)
    if probe is not None:
        (work / "probe_gpus.json").write_text(json.dumps(probe(False), indent=1))
    _, version = sh([python, "-c", "from importlib.metadata import version; "
                     "print(version('nvidia-ml-py'))"])
    (work / "nvidia_ml_py.txt").write_text(version)
    return f"nvidia-ml-py {version.strip()[-80:]}\n{health_line(facts)}"


BUSY_GIB = 6
# A CUDA process that holds memory and keeps the GPU busy until stdin closes.
HOLDER = (
    "import sys, torch\n"
    "hold = torch.empty(GIB << 30, dtype=torch.uint8, device='cuda')\n"
    "a = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16)\n"
    "torch.cuda.synchronize(); print('holding', flush=True)\n"
    "import select\n"
    "while not select.select([sys.stdin], [], [], 0)[0]:\n"
    "    for _ in range(50): a @ a\n"
    "    torch.cuda.synchronize()\n"
).replace("GIB", str(BUSY_GIB))


def record_busy(smi: str, agent: ModuleType, python: str, work: Path) -> str:
    """The readings again while a real CUDA process holds memory; one summary line."""
    busy = work / "busy"
    busy.mkdir()
    proc = subprocess.Popen([python, "-c", HOLDER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    said = []  # torch may warn before it holds
    for line in proc.stdout:
        said.append(line)
        if line.strip() == "holding":
            break
    try:
        if not said or said[-1].strip() != "holding":
            (busy / "holder.txt").write_text("".join(said))
            return f"busy: holder did not start: {''.join(said)[-200:]}"
        time.sleep(3)  # let utilisation and the process table settle
        for name, args in (("query_gpu.csv", ["--query-gpu=" + agent.SMI_FACT_FIELDS
                                              + agent.SMI_HEALTH_FIELDS, "--format=csv"]),
                           ("compute_apps.csv", [agent.SMI_FACT_APPS, "--format=csv"]),
                           ("table.txt", [])):
            code, out = sh([smi, *args])
            (busy / name).write_text(out if code == 0 else f"# exit {code}\n{out}")
        facts = agent.gpu_facts(python)
        (busy / "agent_gpu_facts.json").write_text(json.dumps(facts, indent=1))
        (busy / "torch_cuda.json").write_text(json.dumps(agent.torch_cuda(python), indent=1))
        # the probe as it runs on the environment's python: NVML in-process, then smi only
        joined = work / "vigil-agent.py"
        joined.write_text(payload.source())
        code, out = sh([python, "-c", PROBE.replace("AGENT", repr(str(joined)))])
        (busy / "probe_gpus.json").write_text(out)
        return f"busy: holder pid {proc.pid} read while holding {BUSY_GIB} GiB"
    finally:
        proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


PROBE = (
    "import importlib.util, json\n"
    "spec = importlib.util.spec_from_file_location('agent', AGENT)\n"
    "agent = importlib.util.module_from_spec(spec); spec.loader.exec_module(agent)\n"
    "print(json.dumps({'nvml': agent.probe_gpus(False), 'smi': agent.probe_gpus(True)},"
    " indent=1))\n"
)


def record_vllm_start(python: str, work: Path, minutes: float, torch_cuda: str) -> str:
    """A real start of the tiny model on the GPU; returns one line for the summary."""
    code, out = sh([python, "-c", "import vllm, torch; print(vllm.__version__, "
                    "torch.version.cuda, torch.cuda.is_available())"], timeout=300)
    if code != 0 or not out.strip().endswith("True"):
        return f"vllm start: skipped ({python} has no CUDA vLLM: {out.strip()[-200:]})"
    code, arch = sh([python, "-c", torch_cuda], timeout=300)
    (work / "torch_cuda.json").write_text(arch)
    model = work / "tiny-model"
    sh([sys.executable, "-m", "lab.tiny_model", str(model)], timeout=300)
    cache = work / "vllm-cache"
    env = {**os.environ, "VLLM_CACHE_ROOT": str(cache), "VLLM_LOGGING_LEVEL": "DEBUG"}
    port = 8019
    log = (work / "vllm-start.log").open("w")
    started = time.monotonic()
    proc = subprocess.Popen(
        [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--served-model-name", "tiny", "--max-model-len", "512", "--port", str(port),
         "--host", "127.0.0.1", "--gpu-memory-utilization", "0.3"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    verdict = "timed out"
    try:
        while time.monotonic() - started < minutes * 60:
            if proc.poll() is not None:
                verdict = f"exited {proc.returncode}"
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    pass
                body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 8})
                req = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/completions", body.encode(),
                    {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as r:
                    (work / "completion.json").write_bytes(r.read())
                verdict = f"ready in {time.monotonic() - started:.0f} s"
                break
            except OSError:
                time.sleep(2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    files = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()) \
        if cache.exists() else []
    (work / "compile_cache.txt").write_text("\n".join(files) + "\n")
    shutil.rmtree(model, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    return f"vllm start: {verdict}; compile cache {len(files)} file(s)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--python", default=sys.executable,
                    help="a python whose environment has nvidia-ml-py (and vLLM, to start)")
    ap.add_argument("--start-minutes", type=float, default=6.0)
    args = ap.parse_args(argv)
    smi = gpu_or_exit()
    # the host agent itself (stdlib only), as a host runs it
    agent = payload.load()
    os.chdir(ROOT)  # python -m lab.tiny_model
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "gpu-record"
        work.mkdir()
        record_smi(smi, agent, work)
        health = record_agent(agent, args.python, work)
        busy = record_busy(smi, agent, args.python, work)
        start = record_vllm_start(args.python, work, args.start_minutes,
                                  agent.TORCH_CUDA)
        _, first = sh([smi, "-L"])
        summary = f"{first.splitlines()[0]}\n{health}\n{busy}\n{start}\nfiles: " + " ".join(
            sorted(p.name for p in work.iterdir())) + "\n"
        (work / "summary.txt").write_text(summary)
        (args.out / "summary.txt").write_text(summary)
        with tarfile.open(args.out / "gpu-record.tar.gz", "w:gz") as tar:
            tar.add(work, arcname="gpu-record")
    print(summary, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
