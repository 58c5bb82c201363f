"""How long loading an Ansible inventory of N hosts takes (an INI hosts file, one group
with group vars; every host with its own ansible_host), best of --runs.

    .venv/bin/python bench/inventory/bench.py --hosts 1000 20000 60000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from vigil.desired import inventory

REPO = Path(__file__).resolve().parents[2]


def make(root: Path, n: int) -> Path:
    inv = root / "inventory"
    inv.mkdir()
    for part in ("models", "stacks"):
        (inv / part).symlink_to(REPO / "inventory" / part)
    lines = ["[gpu]"] + [f"gpu-{i:05d} ansible_host=10.{i // 65536}.{i // 256 % 256}.{i % 256}"
                         for i in range(n)] + ["[gpu:vars]", "model=tiny-cpu"]
    (inv / "hosts.ini").write_text("\n".join(lines) + "\n")
    return inv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, nargs="+", default=[1000, 20000, 60000])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    for n in args.hosts:
        with tempfile.TemporaryDirectory() as tmp:
            inv = make(Path(tmp), n)
            best = min(_timed(inv) for _ in range(args.runs))
        print(f"{n:>6} hosts: {best:6.2f} s ({n / best:,.0f} hosts/s)")


def _timed(inv: Path) -> float:
    t0 = time.perf_counter()
    inventory.load(inv)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
