"""Benchmark: wall time and SSH round trips of a no-op re-deploy to 1 and to 4 lab hosts.

    .venv/bin/python bench/deploy/noop.py --hosts lab1,lab2,lab7,lab8 --runs 7

Each host is deployed once first (so it matches), then `invoke deploy` runs `--runs`
times against the first host alone and against all of them; every run must report
`ok` for every host (a run that changed something would not be a no-op). Prints a
Markdown table to paste into bench/deploy/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INVOKE = str(REPO / ".venv" / "bin" / "invoke")


def deploy(hosts: str, sets: list[str]) -> tuple[float, dict[str, dict[str, object]]]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        args = [INVOKE, "deploy", "--hosts", hosts, "--json", out.name]
        for s in sets:
            args += ["--set", s]
        started = time.perf_counter()
        proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            sys.exit(f"deploy {hosts} failed:\n{proc.stdout}\n{proc.stderr}")
        return wall, json.loads(Path(out.name).read_text())["hosts"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", default="lab1,lab2,lab7,lab8")
    ap.add_argument("--runs", type=int, default=7)
    # Four tiny vLLMs on one 24 GB machine: the CPU build checks that this share of
    # memory is free at start, so keep it small.
    ap.add_argument("--set", action="append", default=["gpu_memory_utilization=0.12"])
    a = ap.parse_args()
    hosts = a.hosts.split(",")
    deploy(a.hosts, a.set)  # converge first
    rows = []
    for group in (hosts[:1], hosts):
        walls, trips = [], []
        for _ in range(a.runs):
            wall, result = deploy(",".join(group), a.set)
            assert all(r["status"] == "ok" for r in result.values()), result
            walls.append(wall)
            trips += [int(r["round_trips"]) for r in result.values()]  # type: ignore[call-overload]
        rows.append((len(group), statistics.median(walls), min(walls), max(walls),
                     statistics.median(trips)))
    print("| hosts | median wall (s) | min | max | SSH round trips per host |")
    print("|---|---|---|---|---|")
    for n, med, lo, hi, rt in rows:
        print(f"| {n} | {med:.2f} | {lo:.2f} | {hi:.2f} | {rt:g} |")


if __name__ == "__main__":
    main()
