"""The CLI's start: wall time of `vigil --version`, `--help` and `--list` over N runs
(min and median; each a fresh process, as a user runs it) beside `python -c pass`, and
the import of vigil.cli from `python -X importtime` (its cumulative µs, min over N), with
the heaviest imports of one run.

    python bench/cli/bench.py [--runs 20] [--src DIR] [--json OUT]

--src runs another tree's vigil (`git archive <commit> | tar -x -C DIR`: the code before
a change), through `python -c` with that tree first and the editable install's finder
out of the way (the console script is that `python -c` in all but name).

On a shared machine the min (and the CPU time) is the figure to compare: the median
carries the load.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VIGIL = str(Path(sys.executable).with_name("vigil"))
_FROM = ("import sys; sys.meta_path = [f for f in sys.meta_path if 'editable' not in "
         "getattr(f, '__name__', type(f).__name__)]; sys.path.insert(0, {src!r}); ")
_RUN = "sys.argv = ['vigil', {arg!r}]; from vigil.cli import main; main()"


def _commands(src: Path | None) -> dict[str, list[str]]:
    out = {"python -c pass": [sys.executable, "-c", "pass"]}
    for arg in ("--version", "--help", "--list"):
        out[f"vigil {arg}"] = [VIGIL, arg] if src is None else [
            sys.executable, "-c", _FROM.format(src=str(src)) + _RUN.format(arg=arg)]
    return out


def _import_cmd(src: Path | None) -> list[str]:
    head = "import sys; " if src is None else _FROM.format(src=str(src))
    return [sys.executable, "-X", "importtime", "-c", head + "import vigil.cli"]
_ROW = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def _wall(cmd: list[str], runs: int) -> dict[str, float]:
    times, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return {"min_s": round(min(times), 3), "median_s": round(statistics.median(times), 3),
            "cpu_min_s": round(min(cpus), 3)}


def _importtime(runs: int, src: Path | None) -> tuple[float, list[tuple[str, float]]]:
    best = float("inf")
    heaviest: list[tuple[str, float]] = []
    for _ in range(runs):
        err = subprocess.run(_import_cmd(src), check=True, capture_output=True, text=True,
                             cwd=ROOT).stderr
        rows = [(m[4], int(m[2]) / 1000, len(m[3])) for m in map(_ROW.match, err.splitlines())
                if m]
        total = next(ms for name, ms, _ in rows if name == "vigil.cli")
        if total < best:
            best = total
            heaviest = sorted(((n, ms) for n, ms, depth in rows if depth == 3),
                              key=lambda r: -r[1])[:8]
    return best, heaviest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--src", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    out: dict[str, object] = {name: _wall(cmd, a.runs)
                              for name, cmd in _commands(a.src).items()}
    ms, heaviest = _importtime(a.runs, a.src)
    out["import vigil.cli"] = {"min_ms": round(ms, 1),
                               "heaviest": [[n, round(v, 1)] for n, v in heaviest]}
    for name, row in out.items():
        print(f"{name:<18} {row}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
