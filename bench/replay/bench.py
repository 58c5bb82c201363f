"""Replay's speed and memory on a day of one server's log (bench/replay/genlog.py: a real
corpus start, then its serving lines for 24 h), at several lengths: lines per second of
wall and of CPU time, and the peak RSS of the replaying process (flat in the length when
replay streams).

    python bench/replay/bench.py [--lines 100000,300000,1000000] [--runs 3]
        [--src DIR] [--json OUT]

--src runs another tree's vigil (e.g. `git archive <commit> | tar -x -C DIR`: the code
before a change); each run is a fresh `python -c` replaying the file, as `vigil replay`
does, without the CLI's start-up.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from genlog import generate  # noqa: E402

# --src first on the path, and no editable install's finder in front of it
_CHILD = ("import sys; sys.meta_path = [f for f in sys.meta_path if 'editable' not in "
          "getattr(f, '__name__', type(f).__name__)]; sys.path.insert(0, sys.argv[2]); "
          "from vigil.verify import replay; assert replay.__file__.startswith(sys.argv[2]); "
          "r = replay.replay_run(sys.argv[1]).report; print(r['verdict'], r['snapshots'])")


def _one(src: Path, log: Path) -> dict[str, float | str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _CHILD, str(log), str(src)], check=True,
                         capture_output=True, text=True).stdout.strip()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # ru_maxrss of children is the largest child's so far: runs go smallest file first
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mib": after.ru_maxrss / 1024,
            "result": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", default="100000,300000,1000000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--src", type=Path, default=ROOT)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sorted(int(x) for x in a.lines.split(",")):
            log = Path(tmp) / f"day-{n}.log"
            generate(log, n, stop=True)
            runs = [_one(a.src, log) for _ in range(a.runs)]
            wall = statistics.median(float(r["wall_s"]) for r in runs)
            cpu = statistics.median(float(r["cpu_s"]) for r in runs)
            row = {"lines": n, "mb": round(log.stat().st_size / 1e6, 1),
                   "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                   "lines_per_s_wall": round(n / wall), "lines_per_s_cpu": round(n / cpu),
                   "peak_rss_mib": round(max(float(r["peak_rss_mib"]) for r in runs), 1),
                   "result": runs[0]["result"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
            log.unlink()
    if a.json:
        a.json.write_text(json.dumps({"src": str(a.src), "runs": a.runs, "rows": rows},
                                     indent=1) + "\n")


if __name__ == "__main__":
    main()
