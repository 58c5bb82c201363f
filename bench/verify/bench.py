"""Time-to-verdict on a lab host: vigil's watcher vs the shell loop vs a fixed-budget probe.

    .venv/bin/python -m bench.verify.bench --host lab5 [--index 5] [--out bench/verify/last.json]

Three real starts of the vLLM CPU build, one after the other, each watched at once by:

- vigil: `verify_target` (poll 5 s), stall window --stall (default 60 s; see RESULTS.md);
- the shell loop: `curl /health` every 30 s, 20 tries (10 minutes), run ON the host;
- a fixed-budget startup probe (Kubernetes startupProbe style: /health every 10 s,
  failure threshold 120 = 1200 s, SkyPilot's budget), run ON the host.

Scenarios: ready (a warm start), crashed (kill -9 of the engine once it compiles),
stalled (SIGSTOP of the worker once it compiles). The loops are stopped once vigil has
its verdict plus a margin; a loop that had not concluded concludes, by construction,
at its fixed budget (/health never answers in those starts), which is what is reported.
Then the probe's own cost: wall and CPU time of 20 probe runs on the host.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from lab import hosts as lab
from vigil.desired import inventory
from vigil.desired import targets as targets_mod
from vigil.transport import remote
from vigil.transport.ssh import connect
from vigil.verify import reducer, watch
from vigil.verify.budgets import Budgets
from vigil.verify.snapshot import Snapshot

ROOT = Path(__file__).resolve().parents[2]

# systemd inside a lab host cannot always kill the whole cgroup ("Failed to kill control
# group ... Input/output error"): a worker orphaned by a crash keeps spinning. End any.
STOP = ("systemctl stop vllm; systemctl reset-failed vllm || true; "
        "CG=/sys/fs/cgroup/systemd/system.slice/vllm.service/cgroup.procs; "
        "for i in $(seq 20); do P=$(cat $CG 2>/dev/null); [ -z \"$P\" ] && break; "
        "kill -9 $P 2>/dev/null; sleep 0.5; done; true")

SHELL_LOOP = (": vigil-bench-loop; for i in $(seq 20); do "
              "if curl -sf -o /dev/null http://127.0.0.1:PORT/health; "
              "then echo READY; exit 0; fi; sleep 30; done; echo FAILED")
STARTUP_PROBE = (": vigil-bench-loop; for i in $(seq 120); do if curl -sf -o /dev/null "
                 "http://127.0.0.1:PORT/health; then echo READY; exit 0; fi; sleep 10; done; "
                 "echo FAILED")
BUDGET = {"shell loop (30 s x 20)": 600.0, "startup probe (10 s x 120)": 1200.0}


class Loop(threading.Thread):
    """A shell loop running on the host over its own SSH connection."""

    def __init__(self, index: int, name: str, script: str) -> None:
        super().__init__(daemon=True)
        self.index, self.name_, self.script = index, name, script
        self.t0 = time.monotonic()
        self.result: tuple[str, float] | None = None

    def run(self) -> None:
        _, out, _ = lab.run(self.index, f"timeout 1300 bash -c '{self.script}'", timeout=1400)
        self.result = (out.strip() or "KILLED", time.monotonic() - self.t0)


def sh(index: int, command: str) -> str:
    rc, out, err = lab.run(index, command, timeout=120)
    if rc != 0:
        raise SystemExit(f"{command}: exit {rc}: {err}")
    return out


def scenario(name: str, host: str, index: int, stall_s: float) -> dict[str, Any]:
    t = targets_mod.resolve(inventory.load(ROOT / "inventory"), host)[0]
    sh(index, f"{STOP}; pkill -f '[v]igil-bench-loop' || true")
    if name == "stalled":  # cold, like the live test: a compile long enough to catch
        sh(index, "rm -rf /var/cache/vigil/vllm/* /tmp/torchinductor_vllm")
    sh(index, "systemctl start vllm")
    t_start = time.monotonic()
    port = str(t.vars.port)
    loops = [Loop(index, n, s.replace("PORT", port))
             for n, s in zip(BUDGET, (SHELL_LOOP, STARTUP_PROBE), strict=True)]
    for lp in loops:
        lp.start()
    fault: list[float] = []
    fault_pid: list[int] = []

    def inject(host_: str, st: reducer.WatchState, snap: Snapshot, b: Budgets) -> None:
        if fault or st.phase != "compiling" or snap.processes is None:
            return
        # Only processes of THIS start: the engine is a child of the main PID, the
        # worker a child of the engine.
        main = st.main_pid or (snap.unit.main_pid if snap.unit else 0)
        procs = snap.processes.items
        engine = next((p.pid for p in procs if "EngineCor" in p.comm and p.ppid == main), None)
        worker = next((p.pid for p in procs if "Worker" in p.comm and engine
                       and p.ppid == engine), None)
        pid = engine if name == "crashed" else worker if name == "stalled" else None
        if pid:
            sh(index, f"kill -{'9' if name == 'crashed' else 'STOP'} {pid}")
            fault.append(time.monotonic())
            fault_pid.append(pid)

    settings = watch.Settings(poll_s=5.0, stall_s=stall_s)
    out = watch.verify_target(t, settings, ROOT / "state" / "bench", on_poll=inject)
    t_verdict = time.monotonic()
    # The ready case: let the loops see /health too; the others: they would wait it out.
    for lp in loops:
        lp.join(timeout=45 if name == "ready" else 1)
    # What the loops had concluded by now; then end them BEFORE undoing the fault, so a
    # resumed worker cannot make them "ready" after the fact.
    results = {lp.name_: lp.result for lp in loops}
    sh(index, "pkill -f '[v]igil-bench-loop' || true")
    cont = f"kill -CONT {fault_pid[0]} 2>/dev/null; " if fault_pid else ""
    sh(index, f"{cont}{STOP}")
    origin = fault[0] if fault else t_start
    row: dict[str, Any] = {
        "scenario": name,
        "vigil": {"verdict": out.verdict, "cause": out.state.cause if out.state else None,
                  "seconds": round(t_verdict - origin, 1), "polls": out.state.polls
                  if out.state else 0, "error": out.error},
        "measured_from": "fault injection" if fault else "systemctl start",
    }
    for lp in loops:
        res = results[lp.name_]
        if res is not None and res[0] == "READY":
            row[lp.name_] = {"verdict": "ready", "seconds": round(lp.t0 + res[1] - origin, 1)}
        else:
            # /health never answered: the loop concludes only at its budget.
            row[lp.name_] = {"verdict": "failed (at its budget)",
                             "seconds": round(lp.t0 + BUDGET[lp.name_] - origin, 1),
                             "derived": True}
    return row


def probe_cost(host: str, runs: int = 20) -> dict[str, Any]:
    t = targets_mod.resolve(inventory.load(ROOT / "inventory"), host)[0]
    with connect(host, t.vars) as transport:
        target = watch.ProbeTarget("vllm", t.vars.port, "vllm", t.rendered.paths.cache,
                                   t.rendered.paths.python, "tiny")
        walls, cpus, rts = [], [], []
        cursor = None
        for _ in range(runs):
            cmd = ("TIMEFORMAT='%R %U %S'; { time ( "
                   + remote.agent_command("probe", target.python)
                   + " ) ; } 2>/tmp/vigil-probe-time; cat /tmp/vigil-probe-time >&2")
            t0 = time.monotonic()
            res = transport.run(cmd, stdin=remote.agent_stdin(
                json.dumps(watch.probe_request(target, cursor))),
                                timeout=60)
            rts.append(time.monotonic() - t0)
            snap = Snapshot.from_json(res.stdout)
            cursor = snap.journal.cursor or cursor
            real, user, sys_ = (float(x) for x in res.stderr.split()[-3:])
            walls.append(real)
            cpus.append(user + sys_)
    return {"runs": runs, "host_wall_s_median": round(statistics.median(walls), 3),
            "host_wall_s_max": round(max(walls), 3),
            "host_cpu_s_median": round(statistics.median(cpus), 3),
            "round_trip_s_median": round(statistics.median(rts), 3),
            "cpu_share_at_5s_poll": round(statistics.median(cpus) / 5.0, 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="lab5")
    ap.add_argument("--index", type=int, default=5)
    ap.add_argument("--stall", type=float, default=60.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "verify" / "last.json"))
    ap.add_argument("--scenarios", default="ready,crashed,stalled")
    args = ap.parse_args()
    rows = [scenario(s, args.host, args.index, args.stall) for s in args.scenarios.split(",")]
    port = targets_mod.resolve(inventory.load(ROOT / "inventory"), args.host)[0].vars.port
    sh(args.index, "systemctl start vllm")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # probe cost on a running server
        if "200" in sh(args.index, "curl -s -o /dev/null -w '%{http_code}' "
                                   f"http://127.0.0.1:{port}/health || true"):
            break
        time.sleep(5)
    cost = probe_cost(args.host)
    sh(args.index, STOP)
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": args.host,
              "stall_s": args.stall, "scenarios": rows, "probe": cost}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
