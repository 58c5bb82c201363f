"""Runtime benchmarks on lab hosts (not timed tests): writes bench/runtime/results.json.

    .venv/bin/python bench/runtime/bench.py --check-hosts lab3,lab4 --install-host lab3

1. no-op ``stack.check`` per host: wall time and SSH round trips (median of N);
2. install of the lab stack with uv and with pip on the same host, cold (an empty cache
   directory of its own) and warm (the same cache again), through the host agent's real
   ``install_env`` into scratch directories that are removed afterwards. The host must
   have uv (``/opt/vigil/bin/uv``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from vigil.deploy.runtime import install_payload
from vigil.desired import inventory
from vigil.tasks.runtime import drift
from vigil.transport.remote import call
from vigil.transport.ssh import connect

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "results.json"


def bench_check(inv: inventory.Inventory, host: str, runs: int) -> dict[str, Any]:
    times, trips = [], set()
    for _ in range(runs):
        d = drift(inv, host, None)
        assert d.error is None, d.error
        times.append(d.seconds)
        trips.add(d.round_trips)
    return {"host": host, "runs": runs, "median_s": round(statistics.median(times), 3),
            "min_s": min(times), "max_s": max(times), "round_trips": sorted(trips),
            "ok": d.ok}


def bench_install(inv: inventory.Inventory, host: str) -> list[dict[str, Any]]:
    hv = inv.host_vars(host)
    stack = inv.stack(hv.stack or "lab-cpu")
    tag = uuid.uuid4().hex[:6]
    rows = []
    with connect(host, hv) as transport:
        for installer in ("uv", "pip"):
            cache = f"/var/cache/vigil/bench-{installer}-{tag}"
            for temp in ("cold", "warm"):
                env_dir = f"{hv.env_root}/bench-{installer}-{temp}-{tag}"
                action = {"kind": "install_env", **install_payload(stack, env_dir),
                          "installer": installer, "cache_dir": cache}
                paths = {"current": f"{hv.env_root}/current", "env_dir": env_dir,
                         "backup_dir": "/var/lib/vigil/backup/none", "unit": "", "env": ""}
                started = time.monotonic()
                (res,) = call(transport, hv, "apply", {"paths": paths, "actions": [action]},
                              timeout=3600)["results"]
                wall = round(time.monotonic() - started, 1)
                rows.append({"host": host, "installer": installer, "cache": temp,
                             "ok": res["ok"], "install_s": res.get("install_seconds"),
                             "with_checks_s": res.get("seconds"), "wall_s": wall,
                             "error": res.get("error")})
                print(json.dumps(rows[-1]), flush=True)
                call(transport, hv, "apply", {"paths": paths, "actions": [
                    {"kind": "discard_env", "env_dir": env_dir}]}, timeout=600)
            transport.run(f"rm -rf {cache}", timeout=600)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-hosts", default="lab3,lab4")
    ap.add_argument("--install-host", default="lab3")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--skip-install", action="store_true")
    args = ap.parse_args()
    inv = inventory.load(ROOT / "inventory")
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "check": [],
                              "install": []}
    for host in args.check_hosts.split(","):
        result["check"].append(bench_check(inv, host, args.runs))
        print(json.dumps(result["check"][-1]), flush=True)
    if not args.skip_install:
        result["install"] = bench_install(inv, args.install_host)
    OUT.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
