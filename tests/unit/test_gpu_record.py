"""bench/gpu_record/record.py: the prepared recording run for a GPU machine (issue 11,
item 4). Here, without a GPU: it must fail cleanly; with nvidia-smi replaying a real
capture it must record everything in the fixtures' own layout."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.paths import FIXTURES, REPO
from vigil.deploy.gpus import from_agent

ROOT = REPO
SCRIPT = ROOT / "bench" / "gpu_record" / "record.py"
FIX = FIXTURES / "gpus"


def run(tmp_path: Path, path: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": path, **env})


def fake(tmp_path: Path, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + body)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_no_nvidia_smi_is_one_line_and_nothing_recorded(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run(tmp_path, str(empty))
    assert r.returncode == 3
    assert r.stderr == ("record: no NVIDIA GPU here: nvidia-smi is not installed; nothing "
                        "recorded\n")
    assert r.stdout == "" and not (tmp_path / "out").exists()


def test_a_driver_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    # what nvidia-smi prints when the kernel module is not loaded
    msg = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
           "Make sure that the latest NVIDIA driver is installed and running.")
    bin_dir = fake(tmp_path, f"echo \"{msg}\"\nexit 9\n")
    r = run(tmp_path, f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert r.returncode == 3
    assert r.stderr == f"record: no NVIDIA GPU here: nvidia-smi -L: {msg}; nothing recorded\n"
    assert not (tmp_path / "out").exists()


def test_records_everything_in_the_fixture_layout(tmp_path: Path) -> None:
    cap = FIX / "h100_mig"
    bin_dir = fake(tmp_path, f"""case "$1" in
  --query-gpu=*) cat {cap}/query_gpu.csv ;;
  --query-compute-apps=*) cat {cap}/compute_apps.csv ;;
  -L) cat {cap}/list.txt ;;
  -q) cat {FIX}/a100_sxm4_mig.xml ;;
  --version) echo "NVIDIA-SMI version  : 590.48.01" ;;
  "") echo table ;;
  *) exit 9 ;;
esac
""")
    r = run(tmp_path, f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0000")
    assert f"vllm start: skipped ({sys.executable} has no CUDA vLLM" in r.stdout
    # this python has no torch: the busy step says so in one line and keeps what it printed
    assert "busy: holder did not start: " in r.stdout and "No module named 'torch'" in r.stdout
    with tarfile.open(tmp_path / "out" / "gpu-record.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
        facts = json.load(tar.extractfile("gpu-record/agent_gpu_facts.json"))  # type: ignore[arg-type]
    assert {"agent_gpu_facts.json", "query_gpu.csv", "compute_apps.csv", "list.txt",
            "smi.xml", "table.txt", "version.txt", "kernel.txt", "summary.txt",
            "holder.txt"} <= names
    g = from_agent(facts)  # the recording parses as the facts a deploy would read
    assert (g.gpus[0].sm, len(g.gpus[0].mig_devices), g.gpus[0].mig) == ("sm_90", 4, True)
    assert (tmp_path / "out" / "summary.txt").read_text() == r.stdout
